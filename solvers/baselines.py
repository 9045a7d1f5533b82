"""Baseline plans: replicated, data parallel, Megatron-LM tensor parallel, FSDP/ZeRO-3.

``baseline_plan(problem, method) -> list[int]`` needs a traced Problem (``problem.meta`` with roles
and the OpGraph); an IOPDDL problem raises ValueError.

Construction. Each baseline fixes which strategies every node may use, then picks the minimum-time
plan among those (Σ node + edge cost) — the baseline's rule decides the layouts, the solver only
fills in what the rule leaves open (e.g. Megatron's column- vs row-parallel choice per weight).

Batch dims. A node's *batch dim* is found by propagation from the batch inputs (their leading dim):
an op whose operand carries the batch dim on some dim has that iteration dim as its batch dim
(``strategies.space_of``); the output carries it on the dim that maps to it (a contraction over
the batch, like a weight gradient, ends the propagation). ``fit(size, axes)`` is the subset of the
given mesh axes (mesh order) with the largest device count not above the dim's size.

Rules (D = all mesh axes; model axis m = the last, fastest axis; data axes = D without m):
- replicated: every node fully replicated.
- dp: batch inputs sharded on the leading dim over fit(D); params, optimizer state and other
  inputs replicated; ops with a batch dim shard exactly it over fit(D) and nothing else (so weight
  gradients are all-reduced); other ops replicated.
- megatron: batch inputs on the leading dim over fit(data axes); params and opt state of rank >= 2
  sharded over m on exactly one dim (solver picks which), rank <= 1 replicated or over m; ops
  with a batch dim carry fit(data axes) on it; every op may additionally use m anywhere (solver
  picks), data axes nowhere else.
- fsdp (ZeRO-3): params and optimizer state stored sharded over as many devices as fit on one
  dim (largest device count, then a dim it divides, then the largest dim); batch as dp; ops with
  a batch dim carry fit(D) on it (a weight gradient may come out reduce-scattered); ops without
  one (the optimizer update) are free — they follow the sharded storage.
If a rule leaves a node no strategy (a dim too small), the node falls back to replicated.

Solver for the restricted problem: greedy in program order (``solvers.local.greedy_by_cost``) then
best response (``solvers.local.best_response``: non-adjacent nodes re-pick their best strategy given
their neighbours, until no change) — and the ILP on the restricted sub-problem (time-limited); the plan
with the lower total wins. Neither sees the memory limit (baselines are what they are).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from costmodel.cost import norm_spec
from costmodel.problem import Problem, evaluate
from costmodel.strategies import space_of
from solvers.ilp import solve_ilp
from solvers.local import best_response, greedy_by_cost

METHODS = ("replicated", "dp", "megatron", "fsdp")


def baseline_plan(problem: Problem, method: str, use_ilp: bool = True, ilp_time_limit_s: float = 20.0) -> list[int]:
    """Strategy indices of the ``method`` baseline for a traced ``problem`` (see module docstring)."""
    if method not in METHODS:
        raise ValueError(f"unknown baseline {method!r}; choose one of {', '.join(METHODS)}")
    m = problem.meta
    if m is None or not m.roles or m.graph is None:
        raise ValueError(f"baseline {method!r} needs a traced problem with roles (shardgym.build_problem on an "
                         f"OpGraph); problem {problem.name!r} has no meta (e.g. read from IOPDDL)")
    allowed = allowed_strategies(problem, method)
    if all(len(a) == 1 for a in allowed):
        return [int(a[0]) for a in allowed]
    return _min_time(problem, allowed, use_ilp, ilp_time_limit_s)


# ---- rules --------------------------------------------------------------------------------------
def fit(size: int, axes, mesh_size: dict) -> tuple:
    """The subset of ``axes`` (kept in order) with the largest device count <= size."""
    best, best_n = (), 1
    for r in range(len(axes), 0, -1):
        for sub in itertools.combinations(axes, r):
            n = math.prod(mesh_size[a] for a in sub)
            if best_n < n <= size:
                best, best_n = sub, n
    return best


def batch_refs(problem: Problem) -> tuple[list, dict]:
    """Per node: where its batch dim shows in its strategies' specs — ("out", dim, size) for
    inputs, ("op", operand k, dim, size) for ops; None when it has none — and {graph node id:
    the dim of its outputs that carries the batch}."""
    m = problem.meta
    g = m.graph
    out_bdim: dict[int, int] = {}
    refs: list = [None] * problem.num_nodes
    for i in range(problem.num_nodes):
        nd = g.nodes[int(m.graph_node[i])]
        if nd.is_input:
            if nd.role == "batch" and nd.out.shape:
                out_bdim[nd.id] = 0
                refs[i] = ("out", 0, int(nd.out.shape[0]))
            continue
        space = space_of(nd)
        if space is None:
            continue
        it = None
        for k, (src, _) in enumerate(nd.operands):
            if src < 0 or src not in out_bdim or k >= len(space.operand_maps):
                continue
            d = out_bdim[src]
            om = space.operand_maps[k]
            if d < len(om) and om[d] is not None:
                it = om[d]
                refs[i] = ("op", k, d, int(space.sizes[it]))
                break
        if it is None:
            continue
        om0 = space.out_maps[0]
        if it in om0:
            out_bdim[nd.id] = om0.index(it)
    return refs, out_bdim


def _axes_of(spec) -> set:
    return {a for e in spec for a in e}


def allowed_strategies(problem: Problem, method: str) -> list[np.ndarray]:
    """Per node, the strategy indices the ``method`` rule allows (never empty)."""
    m = problem.meta
    g = m.graph
    axes = tuple(m.axis_names)
    msize = dict(zip(axes, m.mesh_shape))
    model = axes[-1]
    data = axes[:-1] if method == "megatron" else axes
    refs, out_bdim = batch_refs(problem) if method != "replicated" else ([None] * problem.num_nodes, {})
    allowed = []
    for i in range(problem.num_nodes):
        nd = g.nodes[int(m.graph_node[i])]
        k = int(problem.num_strategies[i])
        outs = [norm_spec(s, len(nd.out.shape)) for s in m.out_specs[i]]
        ops = [tuple(norm_spec(o, len(t.shape)) for o, t in zip(s, nd.operand_types)) for s in m.operand_specs[i]]
        used = [_axes_of(outs[s]) | set().union(*[_axes_of(o) for o in ops[s]]) for s in range(k)]
        rep = [s for s in range(k) if not used[s]]
        ok: list[int] = []
        ref = refs[i]
        if method == "replicated":
            ok = rep
        elif nd.is_input:
            if ref is not None:  # batch input
                want = fit(ref[2], data, msize)
                ok = [s for s in range(k) if outs[s][0] == want and not any(outs[s][1:])]
            elif method == "dp" or nd.role not in ("param", "opt_state"):
                ok = rep
            elif method == "megatron":
                if len(nd.out.shape) >= 2:
                    ok = [s for s in range(k) if sorted(outs[s], key=len)[-1] == (model,)
                          and sum(1 for e in outs[s] if e) == 1]
                else:
                    ok = [s for s in range(k) if used[s] <= {model} and all(e in ((), (model,)) for e in outs[s])]
            else:  # fsdp
                ok = _fsdp_storage(nd.out.shape, outs, msize)
        else:
            bax = None
            want = ()
            if ref is not None:
                _, kk, d, size = ref
                want = fit(size, data, msize)
                bax = [ops[s][kk][d] if kk < len(ops[s]) else () for s in range(k)]
            # the batch dim of each tensor: output 0, then every operand (None: no batch dim)
            bdims = [out_bdim.get(nd.id)] + [out_bdim.get(src) if src >= 0 else None for src, _ in nd.operands]
            if method == "dp":
                ok = [s for s in range(k) if (bax is None or bax[s] == want)
                      and _data_only_on_batch((outs[s],) + ops[s], bdims, want, ())]
            elif method == "megatron":
                ok = [s for s in range(k) if (bax is None or tuple(a for a in bax[s] if a != model) == want)
                      and _data_only_on_batch((outs[s],) + ops[s], bdims, want, (model,))]
            else:  # fsdp
                ok = list(range(k)) if ref is None else [s for s in range(k) if bax[s] == want]
            if not ok and bax is not None and method != "fsdp":  # relax: only the batch dim rule
                ok = [s for s in range(k) if tuple(a for a in bax[s] if a != model or method == "dp") == want
                      and (method == "megatron" or used[s] == set(want))]
        if not ok:
            ok = rep or [0]
        allowed.append(np.asarray(ok, dtype=np.int64))
    return allowed


def _data_only_on_batch(specs, bdims, want, free) -> bool:
    """Every tensor carries the data axes (all but ``free``) exactly as ``want`` on its batch dim,
    or not at all when it has no batch dim; the ``free`` axes may appear anywhere."""
    for sp, bd in zip(specs, bdims):
        for d, e in enumerate(sp):
            data = tuple(a for a in e if a not in free)
            if d == bd:
                if data not in ((), tuple(want)):
                    return False
            elif data:
                return False
    return True


def _fsdp_storage(shape, outs, msize) -> list[int]:
    """Storage layouts with one sharded dim and the most devices (then divisible, then larger dim)."""
    best, best_key = [], None
    for s, sp in enumerate(outs):
        dims = [d for d, e in enumerate(sp) if e]
        if len(dims) != 1:
            continue
        d = dims[0]
        n = math.prod(msize[a] for a in sp[d])
        key = (n, shape[d] % n == 0, shape[d], tuple(sp[d]) == tuple(sorted(sp[d], key=list(msize).index)))
        if best_key is None or key > best_key:
            best, best_key = [s], key
    return best


# ---- min time over the allowed strategies ------------------------------------------------------
def restrict(problem: Problem, allowed: list[np.ndarray]) -> Problem:
    """The sub-Problem keeping strategies ``allowed[i]`` of node i (same nodes and edges)."""
    k = problem.num_strategies
    take = np.concatenate([problem.strategy_offsets[i] + a for i, a in enumerate(allowed)])
    offs = np.zeros(problem.num_nodes + 1, dtype=np.int64)
    np.cumsum([len(a) for a in allowed], out=offs[1:])
    eidx = []
    for e, (u, v) in enumerate(problem.edges):
        base = problem.edge_offsets[e]
        eidx.append((base + allowed[u][:, None] * k[v] + allowed[v][None, :]).ravel())
    eidx = np.concatenate(eidx) if eidx else np.zeros(0, dtype=np.int64)
    eoffs = np.zeros(problem.num_edges + 1, dtype=np.int64)
    np.cumsum([len(allowed[u]) * len(allowed[v]) for u, v in problem.edges], out=eoffs[1:])
    return Problem(
        name=problem.name + "/restricted", strategy_offsets=offs,
        node_costs=problem.node_costs[take], node_usages=problem.node_usages[take],
        intervals=problem.intervals, edges=problem.edges, edge_offsets=eoffs,
        edge_costs=problem.edge_costs[eidx], usage_limit=None,
        node_redundant=problem.node_redundant[take], node_comm_bytes=problem.node_comm_bytes[take],
        edge_comm_bytes=problem.edge_comm_bytes[eidx], node_imbalance_s=problem.node_imbalance_s[take],
        meta=None)


def _min_time(problem: Problem, allowed: list[np.ndarray], use_ilp: bool, time_limit_s: float) -> list[int]:
    sub = restrict(problem, allowed)
    best = best_response(sub, greedy_by_cost(sub, order=np.arange(sub.num_nodes)), time_limit_s=np.inf, memory=False)
    best_cost = evaluate(sub, best).total
    if use_ilp:
        try:
            cand, _ = solve_ilp(sub, objective="time", time_limit_s=time_limit_s)
            c = evaluate(sub, cand).total
            if c < best_cost:
                best, best_cost = list(cand), c
        except (ValueError, RuntimeError, ImportError):  # the solver failed: keep the heuristic
            pass
    return [int(allowed[i][j]) for i, j in enumerate(best)]
