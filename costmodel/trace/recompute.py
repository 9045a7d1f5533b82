"""Activation recomputation chosen by policy: a rewrite of the walk's records (``apply``), run by
``trace`` and by ``flatten_program`` alike, so the priced OpGraph and the replayed program are the
same program by construction.

Forward and backward. A record is *backward* when it was produced by reverse-mode differentiation
(``roles.is_grad(stack)``: a ``transpose`` transform on its name stack) or reads a backward value
(the optimizer update, which reads the gradients); every other op record is *forward*.

Saved and recomputed. A policy (``POLICIES``, named after ``jax.checkpoint_policies``) says which
forward results are *saved*: kept from the forward pass to the backward pass as in the plain
program. Program inputs and backward values are always available. Every other forward value a
backward record reads is *recomputed*: its producer is cloned, with the chain of its unsaved
forward ancestors, just before its first backward reader (program order of the backward records
is the backward order). Clones are memoised per value: a value (or a chain member) recomputed for
one reader is read by every later backward reader instead of being recomputed again, so each
forward record is cloned at most once. The forward originals stay for their forward readers; a
forward value only the backward read becomes dead and the trace's dead-code elimination drops it.

- ``"dots"`` (``jax.checkpoint_policies.dots_saveable``): the results of ``dot_general`` and
  ``conv_general_dilated`` are saved; element-wise chains, reductions, softmax, layer norms, gelu,
  gathers and reshapes are recomputed.
- ``"dots_no_batch"`` (``dots_with_no_batch_dims_saveable``): only ``dot_general`` results without
  batch dimensions are saved (the weight matmuls); convolutions, attention's batched q.k^T and
  p.v and everything element-wise are recomputed (Megatron-LM's selective recomputation, and more).
- ``"blocks"`` (a ``jax.checkpoint`` / ``flax.linen.remat`` around each block): a forward value is
  saved only where a forward record of another *block* reads it, a block being a module scope at
  the program's block depth (``block_depth``: the shallowest module-path depth at which the forward
  records fall in two or more named scopes; gpt: ``GPT/block_0``, ``GPT/block_1``, ``GPT/ln_f``,
  ``GPT/lm_head``, ...; a record with a shallower path, e.g. the step's own top-level ops, module
  path ``""``, is a block of its own path). So each
  block's output (the residual stream between transformer blocks, the logits) is saved, and
  everything inside a block, its matmuls included, is recomputed in the backward pass, the block's
  collectives with it. Of a program with a single named scope at every depth, nothing is saved
  (every forward value the backward reads is recomputed: peak memory as the plain program's).
- ``None``: the plain program, record for record.

Values computed from program inputs alone (a layer norm scale's broadcast, the causal mask) are
recomputed like the others. Reading the forward's copy instead put the model's prediction further
from XLA (gpt 125m Megatron, ``dots_no_batch``: 2,320.3 MiB predicted against XLA's 2,242.0; 2,248.3
when recomputed) and left XLA's figure as it was.

The tie. Each recompute point (a backward reader with at least one value not yet recomputed) gets
one synthetic ``optimization_barrier`` record (params ``{"synthetic": "recompute"}``, no FLOPs)
over the chain's saved operands and the reader's other operands (the cotangent among them, or
values recomputed earlier), program inputs left out, the largest operand first,
as ``walk.Tracer.remat_barrier`` builds the barrier of a user-written ``jax.checkpoint``. The clones
and the reader read its outputs, so XLA can neither CSE a clone with its forward original nor
(with the executor's tied barrier, runtime/program.py) hoist it above its reader's cotangent. A
point whose operands are all inputs gets no barrier (an embedding gather's chain: XLA may CSE it
with the forward pass; the model prices it where the program puts it). Points are many (gpt tiny
``dots``: 158 barrier nodes, as layer norm's and gelu's backward readers each read another
residual). The alternative, a barrier only where the chain reads a saved value (clones of clones
untied), was worse at gpt tiny (Megatron, ``dots_no_batch``: 1.523 MiB by XLA against 1.460) and
better at d=128, t=256 (20.2 MiB against 21.6): XLA may hoist the untied clones up to the earlier
barrier. Clones keep their original's name stack (module path, role ``"activation"``) and params
plus ``"recomputed": True``.
"""
from __future__ import annotations

from costmodel import primitives as P
from costmodel.trace.roles import is_grad, module_path_of

#: the policies ``trace(..., recompute=)`` and ``flatten_program(..., recompute=)`` take
POLICIES = (None, "dots", "dots_no_batch", "blocks")


def check_policy(policy) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown recompute policy {policy!r}; choose one of "
                         f"{', '.join(repr(p) for p in POLICIES)}")


def saveable(rec, policy: str) -> bool:
    """Whether ``policy`` saves the results of forward record ``rec`` (the module docstring)."""
    if policy == "dots":
        return rec.prim in ("dot_general", "conv_general_dilated")
    if policy == "dots_no_batch":
        if rec.prim != "dot_general":
            return False
        (_, _), (lb, rb) = rec.params["dimension_numbers"]
        return not lb and not rb
    raise ValueError(f"unknown recompute policy {policy!r}")


def block_depth(paths) -> int:
    """The shallowest depth d at which the module paths ``paths`` (``"a/b/c"``) at least d deep
    have two or more distinct d-component prefixes; 0 where none does (one block). A record whose
    path is shallower than d is a block of its own path (gpt's top-level ops)."""
    parts = [p.split("/") for p in paths if p]
    for d in range(1, max((len(q) for q in parts), default=0) + 1):
        if len({tuple(q[:d]) for q in parts if len(q) >= d}) > 1:
            return d
    return 0


def block_outputs(recs, val_src, back, n_in: int) -> set[int]:
    """The forward records (indices) whose results a forward record of another block reads
    (``"blocks"``: the module docstring)."""
    fwd = [ri for ri in range(n_in, len(recs)) if not back[ri]]
    path = {ri: module_path_of(recs[ri].stack) for ri in fwd}
    d = block_depth(path.values())
    block = {ri: tuple(p.split("/")[:d]) if p and d else () for ri, p in path.items()}
    out = set()
    for ri in fwd:
        for x in recs[ri].ins:
            src = None if x is None else val_src[x][0]
            if src is not None and src in block and block[src] != block[ri]:
                out.add(src)
    return out


def backward_records(recs, val_src, n_in: int) -> list[bool]:
    """Per record: produced by differentiation or reading a backward value (inputs: False)."""
    back = [False] * len(recs)
    for ri in range(n_in, len(recs)):
        r = recs[ri]
        back[ri] = is_grad(r.stack) or any(x is not None and back[val_src[x][0]] for x in r.ins)
    return back


def apply(tr, n_in: int, policy) -> None:
    """Rewrite ``tr``'s records (a ``walk.Tracer`` after ``flatten``) to recompute under ``policy``
    (the module docstring); ``None`` leaves them untouched. Clones and barriers are appended with
    ``tr.clone_record`` / ``tr.add`` and the records are then put in program order
    (``tr.reorder``). Value ids of the original records (the program's outputs among them) keep
    their meaning."""
    check_policy(policy)
    if policy is None:
        return
    recs, val_src = tr.recs, tr.val_src
    n = len(recs)
    back = backward_records(recs, val_src, n_in)
    if policy == "blocks":
        kept = block_outputs(recs, val_src, back, n_in)
        save = [ri < n_in or back[ri] or ri in kept for ri in range(n)]
    else:
        save = [ri < n_in or back[ri] or saveable(recs[ri], policy) for ri in range(n)]

    def redo(v) -> bool:   # a forward value the policy does not save
        return v is not None and not save[val_src[v][0]]

    memo: dict[int, int] = {}      # original value -> its recomputed value
    order: list[int] = []
    for ri in range(n):
        if not back[ri]:
            order.append(ri)
            continue
        r = recs[ri]
        new = {x for x in r.ins if redo(x) and x not in memo}
        chain = _chain(recs, val_src, new, redo, memo)
        if chain:
            seen: set = set()
            held = [y for q in chain for y in recs[q].ins if y is not None and not redo(y)]
            held += [memo.get(x, x) for x in r.ins if x is not None and x not in new]
            held = [y for y in held if not (y in seen or seen.add(y)) and val_src[y][0] >= n_in]
            held.sort(key=lambda y: -P.size_of(tr.val_type[y]))   # stable: largest first
            tied: dict[int, int] = {}
            if held:
                types = [tr.val_type[y] for y in held]
                outs = tr.add("optimization_barrier", held, types, types, r.stack,
                              {"synthetic": "recompute"}, 0.0)
                order.append(len(tr.recs) - 1)
                tied = dict(zip(held, outs))
            for q in chain:
                ins = [memo[y] if redo(y) else tied.get(y, y) for y in recs[q].ins]
                outs = tr.clone_record(q, ins)
                order.append(len(tr.recs) - 1)
                memo.update(zip(recs[q].outs, outs))
            r.ins = [memo[x] if x in new else tied.get(memo.get(x, x), memo.get(x, x)) if x is not None else None
                     for x in r.ins]
        elif any(x in memo for x in r.ins):
            r.ins = [memo.get(x, x) for x in r.ins]
        order.append(ri)
    tr.reorder(order)


def _chain(recs, val_src, need, redo, memo) -> list[int]:
    """The forward records to clone for values ``need``: their producers and, transitively, the
    producers of their unsaved operands not recomputed yet, in program order."""
    todo, chain = [val_src[v][0] for v in need], set()
    while todo:
        q = todo.pop()
        if q in chain:
            continue
        chain.add(q)
        todo.extend(val_src[y][0] for y in recs[q].ins if redo(y) and y not in memo)
    return sorted(chain)
