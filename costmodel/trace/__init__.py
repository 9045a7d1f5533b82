"""Trace a JAX function into an OpGraph (``trace(fn, *args, fold=True, name="")``), and the flat
program the runtime replays (``flatten_program``).

Pipeline: ``jax.make_jaxpr(fn)(*args)`` (args may be ``jax.ShapeDtypeStruct`` pytrees, so nothing
is allocated) -> a flat list of primitive applications ("records") -> dead-code elimination ->
optional folding of element-wise chains -> ``OpGraph``.

Inputs. One input node (primitive ``"input"``) per leaf of ``args`` in ``jax.tree.leaves(args)``
order, with ``input_index`` and ``input_path`` (``jax.tree_util.keystr`` of the leaf's path in the
args tuple, e.g. ``"[0]['Dense_0']['kernel']"``). Roles: a train step ``fn(params, opt_state,
batch)`` gives param / opt_state / batch. Other arities: arg 0 is ``param``, the last arg (when
there are at least two) is ``batch``; for exactly three args the middle one is ``opt_state``,
with four or more args the middle ones are ``other``. Scalar leaves (Python ints, optax's
``count``) are ordinary 0-d inputs.

Inlining. Call-like primitives (``jit``/``pjit``, ``closed_call``, ``core_call``,
``custom_jvp_call``, ``custom_vjp_call``, ``remat2``/``checkpoint``, ...; see
``primitives.INLINE``) are inlined by mapping the outer operands onto the sub-jaxpr's invars;
closed-over constants become literals. The backward pass's recomputation (a ``remat2`` with
``differentiated`` and ``prevent_cse``) first passes its operands through one synthetic
``optimization_barrier`` record (no FLOPs; its outputs are the operands), as JAX lowers it; the
recomputed ops are records of their own, after it. Control flow:
- ``scan`` with 1 <= length <= 64 is unrolled: per iteration each scanned input gets a synthetic
  ``slice`` + ``squeeze``, the body is inlined, and each stacked output is rebuilt from per-step
  ``broadcast_in_dim`` (to a leading 1) + one ``concatenate``. Longer scans become one node whose
  FLOPs = length x body FLOPs.
- ``while`` becomes one node costed as ONE iteration of cond + body (the trip count is unknown).
- ``cond`` becomes one node costed as its most expensive branch.
These single nodes carry ``params["replicate_only"] = True``: the strategy enumerator should only
offer them replicated.

Records and costs. Each primitive application gets FLOPs from ``primitives.flops`` (formulas in
that module), ``bytes_read`` = bytes of its operands (literals included), ``bytes_written`` = bytes
of its results; FLOPs are rounded to integers so that every sum of them is exact in float64 (the
fft formula is not integral). A primitive without a rule stays a node with ``supported=False``
(replicate-only) and ``warnings.warn`` names it once per trace. Records none of whose results are used (directly
or transitively) by the program outputs are dropped; ``num_eqns`` counts the records that remain.

Module paths and roles. ``module_path`` is the Flax scope path from the equation's name stack
(outer call stacks prepended), with transforms and einsum specs dropped:
``transpose(jvp(GPT))/Block_0/Dense_0`` becomes ``GPT/Block_0/Dense_0`` and
``GPT/block_0/attn/bqhd,bkhd->bhqk`` becomes ``GPT/block_0/attn``; the raw string is kept in
``params["name_stack"]``. An op's role
is ``"gradient"`` when its name stack contains a ``transpose`` transform (it was produced by
reverse-mode differentiation), else ``"activation"`` (this includes the optimizer update).
``operand_roles[k]`` is the role of operand k's producer node, ``"constant"`` for literals.

Folding (``fold=True``, Alpa's "follow" nodes). Walking records in program order, an element-wise
op (``primitives.FOLDABLE``) with one result joins the group of one of its operands' producers: the
candidates are its non-literal operands that have the op's result shape and are produced by an op
(never an input node), largest first, then first in operand order; it joins the first candidate
group for which the graph stays acyclic, else it heads its own node. Acyclicity invariant (see
``fold.fold_target``): each group edge H -> G either goes forward in program order (head of H before
head of G) or starts at a *pinned source*, a group that depends on no op group and never will
(e.g. ``reshape(bias)`` or ``0.9 * mu`` computed from inputs only). So the bias add after a matmul
and Adam's ``0.9 * mu + 0.1 * grad`` fold, but in ``x - max(x)`` the ``sub`` cannot join ``x``'s
group (``max(x)`` depends on it). Element-wise ops may broadcast size-1 dims implicitly in
jaxprs; only an operand of exactly the result's shape is a candidate. A
group node has the head's primitive and params, ``folded`` = absorbed primitives in order,
``outputs`` = every group value used outside the group (another node or a program output) in
program order, ``operands`` = the head's operands followed by the absorbed ops' external
non-literal operands (deduplicated; ``params["num_head_operands"]`` tells where the head's stop;
``params["out_operands"][o]`` lists the operand indices output o is computed from).
FLOPs, bytes_read and bytes_written of a group are the SUMS over its members, so folding preserves
``total_flops`` and ``total_bytes`` exactly (bytes are therefore an unfused upper bound on memory
traffic). ``num_nodes_unfolded`` = inputs + records, the node count with ``fold=False``.

Outputs. ``OpGraph.outputs`` follow ``jax.tree.leaves(fn(*args))``; a literal output is (-1, 0), a
pass-through input is (its input node, 0). ``output_aliases[i]`` is the flat input index output i
replaces when the output is a tuple/list whose entries k = 0, 1, 2, ... have the same tree
structure, shapes and dtypes as ``args[k]``, for the leading args that are not the batch (params,
then every optimizer-state argument, e.g. Adam's ``m`` and ``v`` passed separately); None otherwise.

Node ids are positions in ``graph.nodes``: inputs first, then op nodes in a topological order that
follows program order of the heads wherever dependencies allow. ``order`` = id - number of inputs
for op nodes (their step in that sequential schedule; with ``fold=False`` exactly the equation's
program position after inlining and dead-code elimination), 0 for inpu

Recomputation (``trace(..., recompute=policy)``, ``flatten_program(..., recompute=policy)``): after
the walk and before dead-code elimination, ``recompute.apply`` rewrites the records so that the
forward values the policy does not save (``"dots"``, ``"dots_no_batch"``, as jax.checkpoint_policies;
``"blocks"``, a checkpoint around each module block)
are recomputed before their first backward reader, behind a synthetic ``optimization_barrier``
record; None (default) leaves the program as written. The OpGraph records the policy
(``graph.recompute``) and the runtime replays the same rewritten records.

Modules, one job each: ``walk`` (the jaxpr walk: inlining, scan unrolling, control-flow nodes, one
record per primitive application), ``recompute`` (the recompute policies' rewrite), ``fold`` (dead-code elimination, folding, the group graph and its
topological order), ``roles`` (module paths, operand roles, input roles, output aliases), ``build``
(``trace``: the OpGraph from the grouped records), ``program`` (``flatten_program``: the same records
as evaluable steps for runtime/core.py).
"""
from costmodel.trace.build import trace
from costmodel.trace.program import FlatProgram, flatten_program
from costmodel.trace.walk import SCAN_UNROLL_MAX

__all__ = ["FlatProgram", "SCAN_UNROLL_MAX", "flatten_program", "trace"]
