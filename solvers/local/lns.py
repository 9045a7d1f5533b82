"""Large-neighbourhood search (LNS) with the exact MILP, and ``improve``: the planner's post-processing.

* ``refine(problem, plan, time_limit_s)``: BFS neighbourhoods re-optimised by ``solvers.ilp``
  (everything else fixed), from a feasible plan; never worse or infeasible.
* ``lns(lc, s, ...)``: the loop ``refine`` and the large-instance driver (``solvers.search``) run.
* ``improve(problem, plan)``: memory repair if over the limit, ``polish``, then ``refine`` for
  ``refine_time_limit_s``: what ``agent.planner.Planner.plan`` does to a decoded plan, for any start.
* ``REFINE_TIME_LIMIT_S``: the refinement the planners give a plan when the memory cap binds.
* ``whole_milp(problem, plan, time_limit_s)``: the whole graph as one MILP seeded with the plan;
  ``improve`` runs it first when given ``whole_time_limit_s`` (the planners, when the cap does not
  bind: ``whole_milp_time_limit``) and stops there when HiGHS proves the optimum.
* ``lagrange_starts(problem, plan, time_limit_s)``: under a usage limit, the plans of a short
  Lagrangian relaxation (``solvers.lagrange``: memory priced into the costs, each priced problem an
  uncapped MILP), repaired to fit; given ``lagrange_time_limit_s`` (the planners under a cap:
  ``lagrange_time_limit``), ``improve`` searches from the cheapest of them and from the plan and
  keeps the cheaper result.
* ``capped_search`` (the factor-graph planner's search under a usage limit, budgeted in work units)
  lives in solvers/local/budgeted.py and calls the pieces here.

Imports ``solvers.ilp``, which may itself use this library: ``solvers.local`` exports the names of
this module lazily (its ``__getattr__``), so importing the library does not import the ILP.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.ilp import IlpConfig
from solvers.ilp.bounds import best_seed
from solvers.ilp.guard import SolveOverrun, solve_ilp_guarded
from solvers.lagrange import lagrangian_bound
from solvers.local.costs import LocalCosts
from solvers.local.polish import polish
from solvers.local.repair import repair_memory
from solvers.local.subproblem import subproblem

_subproblem = subproblem   # the name tests/test_capped_copies.py imports

REFINE_TIME_LIMIT_S = 1.5   # planners: refinement when the memory cap binds
CAPPED_REFINE_TIME_LIMIT_S = 3.0   # the factor-graph planner's, after the Lagrangian starts (``improve``)
WHOLE_MILP_TIME_LIMIT_S = 2.0   # planners: the whole-graph MILP when the memory cap does not bind
WHOLE_MILP_S_PER_NODE, WHOLE_MILP_MAX_S = 0.01, 5.0   # uncapped: 10 ms a node up to 5 s (``whole_milp_time_limit``)
WHOLE_MILP_MAX_NODES = 2000
LAGRANGE_TIME_LIMIT_S, LAGRANGE_ROUND_S = 8.0, 3.0   # planners under a cap: ``lagrange_starts``
LAGRANGE_S_PER_NODE, LAGRANGE_MIN_S = 0.02, 2.0   # ... 20 ms a node, 2 to 8 s (``lagrange_time_limit``)
LNS_SIZE = 90   # refine's neighbourhood size; with copy groups (each node in tens of them) 40:
LNS_COPIES_SIZE = 40   # meshgraphnet tiny @ h100-2x8 cap 0.5 from BP's decode, 6 s, 1-s MILPs (load 5.4):
#                        90 nodes 1.807x (no MILP finished), 60 (2 s) 1.654x, 40 1.481x, 25 1.785x
#: deterministic refine (``max_neighbourhoods``): each neighbourhood MILP's node limit and its
#: wall-clock safety cap (40-node neighbourhoods solve in 0.5-1.3 s at load 5-7; a cap hit makes
#: that neighbourhood's answer load-dependent, so it is set far above that)
SUB_NODES, SAFE_SUB_TIME_LIMIT_S = 200, 10.0
LNS_MAX_NODES = 5000  # MILP neighbourhood search only below this: on contest-size graphs one HiGHS
#                       call (reduction + presolve) overran its limit by tens of seconds


def refine(problem: Problem, plan, time_limit_s: float, seed: int = 0, lns_size: int | None = None,
           max_neighbourhoods: int | None = None, sub_nodes: int | None = None) -> np.ndarray:
    """Improve a feasible ``plan`` for ``time_limit_s`` seconds by large-neighbourhood search; never
    returns a worse or infeasible plan (ValueError if ``plan`` is over the memory limit).

    BFS neighbourhoods of ``lns_size`` nodes (None: ``LNS_SIZE``, ``LNS_COPIES_SIZE`` with copy
    groups) are re-optimised exactly by the MILP (the rest fixed:
    their edges fold into unary costs and their live usage into the limit), centred half the time
    on nodes in proportion to the resharding cost the current plan pays on their edges. These are
    the coordinated moves single-node and forest moves miss: e.g. sharding a parameter, its
    optimizer state and its whole update chain at once, which pays only when all of them move.
    Measured on the capped held-out problems (1.5 s, 5 seeds): fno tiny reached the ILP optimum
    in 5 of 5 runs from a polished plan at 1.27x; meshgraphnet tiny went 1.45x -> 1.22-1.37x.
    Lagrangian rounds (``solvers.search``) before the search, and 30/60/120-node
    neighbourhoods, did no better at this budget. Approximate in time: the last MILP call (given
    the time left) may overrun by its set-up. Each MILP runs under the ILP watchdog
    (``solve_ilp_guarded``, killed 0.5-1 s past its limit, the neighbourhood then skipped): one ran
    20 minutes past a 1.5 s limit in HiGHS (meshgraphnet tiny @ h100-2x8, cap 0.5).
    With copy groups (session 14): on meshgraphnet tiny cap 0.5 (819 nodes, 652 time points, 8,351
    copy groups) a 90-node neighbourhood was a 790-825-node MILP (one background node per time
    point, one node per outside copy reader) and none finished in 1 s at load 5-7, so ``refine``
    never moved BP's decode (h100-2x8 1.807x session 12's ILP, 6 s). Merged background runs and
    40 nodes (125-230-node MILPs, most solved in 0.5-1.3 s): 6 s from the decode, load 6-7,
    h100-2x8 1.807 -> 1.481x (seed 0; seed 1 stayed, no improving neighbourhood drawn), a100-hetero-2x4
    1.514 -> 1.211x; 3 s from a 1.422x plan: 1.400x / 1.308x (seeds 0 / 1)."""
    deadline = time.perf_counter() + float(time_limit_s)
    rng = np.random.default_rng(seed)
    g = LocalCosts(problem)
    s = np.asarray(plan, dtype=np.int64).copy()
    if not g.feasible(s):
        raise ValueError("refine needs a plan that fits the memory limit")
    if lns_size is None:
        em = problem.edge_memory
        lns_size = LNS_COPIES_SIZE if em is not None and em.num_groups else LNS_SIZE
    if g.n:
        counted = max_neighbourhoods is not None   # deterministic: each MILP node-limited, its time a safety cap
        s, _ = lns(g, s, g.total(s), deadline, rng, None, size=lns_size,
                   sub_time_limit_s=SAFE_SUB_TIME_LIMIT_S if counted else 1.0, margin_s=0.0, min_sub_time_limit_s=0.05,
                   weighted=True, max_neighbourhoods=max_neighbourhoods,
                   sub_nodes=(SUB_NODES if sub_nodes is None else sub_nodes) if counted else None)
    return s


def lns(g: LocalCosts, s: np.ndarray, best_cost: float, deadline: float, rng, progress, size: int = 300,
         sub_time_limit_s: float = 5.0, margin_s: float = 1.0, min_sub_time_limit_s: float = 0.5, weighted: bool = False,
         max_neighbourhoods: int | None = None, sub_nodes: int | None = None):
    """Re-optimise BFS neighbourhoods exactly with the MILP, everything else fixed. Each MILP gets
    at most ``sub_time_limit_s`` and ends ``margin_s`` before ``deadline``; none starts with less than
    ``min_sub_time_limit_s`` to run. Centres are uniform over the nodes with a choice or (``weighted``) drawn
    half the time in proportion to the resharding cost the current plan pays on their edges.
    ``max_neighbourhoods``: stop after that many (a deterministic budget); ``sub_nodes``: each MILP's
    branch-and-bound node limit (HiGHS ``mip_max_nodes``). With both and a ``sub_time_limit_s`` and
    ``deadline`` that stop no MILP, the search does not depend on the machine's load."""
    p = g.p
    free = np.nonzero(g.k > 1)[0]
    if not len(free):
        return s, best_cost
    config = IlpConfig.node_limited(sub_nodes)
    done = 0
    while time.perf_counter() + margin_s + min_sub_time_limit_s < deadline and (
            max_neighbourhoods is None or done < max_neighbourhoods):
        done += 1
        seed_node = int(rng.choice(free))
        if weighted and len(g.eu) and rng.random() < 0.5:
            paid = g.ec[g.eoff[:-1] + s[g.eu] * g.k[g.ev] + s[g.ev]]
            w = np.bincount(g.eu, paid, minlength=g.n) + np.bincount(g.ev, paid, minlength=g.n)
            w = np.where(g.k > 1, np.maximum(w, 0.0), 0.0)
            if w.sum() > 0:
                seed_node = int(rng.choice(g.n, p=w / w.sum()))
        sel = _bfs(g, seed_node, size)
        sub = subproblem(g, s, sel)[0]
        budget = min(sub_time_limit_s, deadline - time.perf_counter() - margin_s)
        if budget < min_sub_time_limit_s:
            break
        try:
            t, c, _ = resolve(p, s, sel, sub, time_limit_s=budget, grace_s=min(1.0, max(0.5, margin_s)),
                              reduce=True, config=config)
        except Exception:  # infeasible, timed out without a plan, or overran (killed): keep the current one
            continue
        if c.feasible and c.total < best_cost - 1e-9 * max(1.0, abs(best_cost)):
            s, best_cost = t, c.total
            if progress:
                progress(f"lns: {best_cost:.10g}")
    return s, best_cost


def start_of(sub: Problem, s: np.ndarray, sel: np.ndarray) -> list[int]:
    """The plan of ``sub = subproblem(g, s, sel)[0]`` that keeps ``s``'s choices (background nodes: 0)."""
    return [int(x) for x in s[sel]] + [0] * (sub.num_nodes - len(sel))


def resolve(problem: Problem, s: np.ndarray, sel: np.ndarray, sub: Problem, **solve_kw):
    """``s`` with neighbourhood ``sel`` re-solved by the sub-MILP ``sub = subproblem(g, s, sel)[0]``
    (``solve_ilp_guarded`` from ``start_of``, the cap not relaxed, ``solve_kw`` passed on), the rest
    fixed: (plan, its Cost on ``problem``, the sub-MILP's info). Raises what ``solve_ilp_guarded``
    raises (no plan in time, infeasible, killed)."""
    plan, info = solve_ilp_guarded(sub, initial_plan=start_of(sub, s, sel), relax_cap=False, **solve_kw)
    t = s.copy()
    t[sel] = np.asarray(plan[:len(sel)])
    return t, evaluate(problem, t), info


def _bfs(g: LocalCosts, start: int, size: int) -> np.ndarray:
    seen = {start}
    frontier = [start]
    while frontier and len(seen) < size:
        nxt = []
        for i in frontier:
            for j in g.adj[g.adj_ptr[i]:g.adj_ptr[i + 1]]:
                j = int(j)
                if j not in seen and g.k[j] > 1:
                    seen.add(j)
                    nxt.append(j)
                    if len(seen) >= size:
                        break
            if len(seen) >= size:
                break
        frontier = nxt
    return np.array(sorted(seen), dtype=np.int64)


def whole_milp_time_limit(problem: Problem) -> float:
    """The planners' limit for ``whole_milp``: without a usage limit 10 ms a node, between
    ``WHOLE_MILP_TIME_LIMIT_S`` and ``WHOLE_MILP_MAX_S`` (it stops at its proof, so the limit costs
    only where it cannot prove); with one, ``WHOLE_MILP_TIME_LIMIT_S``. Why: HiGHS's clock is wall
    time. On fno large @ h100-2x8 (543 nodes, no cap) the seeded MILP proves the optimum in 0.4-0.6 s
    at load 0.4-3, but the session-11 held-out run (load 2.9, its own ILP 1.74 s) left it at the
    seed, 1.222x, within 2 s. A capped MILP rarely proves: meshgraphnet tiny @ h100-2x8 cap 0.5 (819
    nodes; its decode fits with room, so the planner calls the cap not binding) spent the whole 5 s
    for nothing (improve 6.0 s against 3.0 s with 2 s, load 3)."""
    if problem.usage_limit is not None:
        return WHOLE_MILP_TIME_LIMIT_S
    return min(WHOLE_MILP_MAX_S, max(WHOLE_MILP_TIME_LIMIT_S, WHOLE_MILP_S_PER_NODE * problem.num_nodes))


def whole_milp(problem: Problem, plan, time_limit_s: float, return_status: bool = False):
    """The whole graph as one neighbourhood: the MILP over every node, seeded with the feasible
    ``plan``, for ``time_limit_s`` under the watchdog (killed 1 s past it, its streamed incumbents kept). Returns its incumbent
    when that fits and is cheaper, else ``plan``; never worse. Graphs over ``WHOLE_MILP_MAX_NODES``
    are returned as they are.

    Why: BFS neighbourhoods cannot make a move that spans the graph. On the held-out fno large @
    h100-2x8 (543 nodes, no cap) Lagrangian BP + polish lands at 1.222x the optimum, 250 of 543
    decisions away from it (one layout for the whole spectral chain), and 3 s of ``refine`` does not
    move it; the uncapped MILP proves the optimum in 0.35 s there. ``return_status``: (plan, proven),
    proven when HiGHS proved its answer optimal (the plan returned then is an optimum: the seed is
    kept only at an equal cost)."""
    s = np.asarray(plan, dtype=np.int64)
    if problem.num_nodes > WHOLE_MILP_MAX_NODES or time_limit_s <= 0:
        return (s, False) if return_status else s
    proven = False
    try:
        found, info = solve_ilp_guarded(problem, time_limit_s=time_limit_s, grace_s=1.0,
                                        initial_plan=[int(x) for x in s])
        found, proven = [found], info.status == "optimal"
    except SolveOverrun as exc:   # killed: what it streamed before
        found = exc.incumbents
    except Exception:  # noqa: BLE001 -- no plan in time or infeasible: keep the seed
        found = []
    # the seed first: best_seed keeps the first of equal costs, so only a strictly cheaper plan replaces it
    out = np.asarray(best_seed(problem, [s, *found], problem.usage_limit, None, key=lambda c: c.total), dtype=np.int64)
    return (out, proven) if return_status else out


def lagrange_starts(problem: Problem, plan, time_limit_s: float, round_s: float = LAGRANGE_ROUND_S,
                    lc: LocalCosts | None = None) -> tuple[np.ndarray, float]:
    """(the cheapest fitting plan among ``plan`` and the relaxed plans of ``solvers.lagrange.lagrangian_bound``
    run for about ``time_limit_s`` from ``plan`` (its reference and Polyak target), each repaired
    with ``repair_memory`` when over the limit; the Lagrangian lower bound, −inf when none). Never
    worse than a fitting ``plan``. Without a usage limit, above ``WHOLE_MILP_MAX_NODES`` nodes or
    with no time: ``plan`` and −inf. Each round is an uncapped MILP (``round_s`` at most), so the
    exact reductions apply: the round at λ = 0 is the uncapped optimum, which is the capped one
    (bound = cost) when it fits.

    Why: under a binding cap the cost can be all memory's. On meshgraphnet tiny @ h100-2x8 cap 0.5
    the uncapped optimum costs 1.0e-7 s and peaks at 2.0x the cap; the capped 60-s ILP incumbent
    costs 5.5e-4 s; BP's masked decode (index order, memory filled first come first served) 1.81x
    that, at 0.997 of the cap, and polish, ``refine`` (5 s), the seeded capped MILP (5 s) and
    ``solvers.search.solve_large`` (5 s) all leave it there (load 7). The relaxed plans of 12 s
    (3-s rounds, load 7) cost 0.68-1.80x at 1.09-1.21x the cap; the one at 1.09x repaired to 1.57x,
    polished 1.42x; the repair failed on the others (it stalls: a node moved to a smaller strategy
    makes resharded copies live, and shaving node bytes alone to the cap left copies at 1.28x).
    Measured through ``solve(method="policy")`` against session 12's 60-s ILP costs, main -> this,
    same load (6.6-7.2): meshgraphnet tiny cap 0.5 @ h100-2x8 1.807 -> 1.422 (7.7 -> 20.8 s),
    @ tpu-4x4 1.902 -> 1.364 (10.7 -> 22.0 s), @ a100-hetero-2x4 1.422 both (7.0 -> 15.1 s); fno
    tiny @ h100-2x8 cap 0.5 0.937 -> 0.767 (eval_policy_s13b, load 7-11). At load 9.6 one
    meshgraphnet h100 run stayed at 1.807: the 3-s rounds are wall time (HiGHS)."""
    s = np.asarray(plan, dtype=np.int64)
    if problem.usage_limit is None or problem.num_nodes > WHOLE_MILP_MAX_NODES or time_limit_s <= 0:
        return s, -float("inf")
    deadline = time.perf_counter() + float(time_limit_s)
    lc = lc or LocalCosts(problem)
    c0 = evaluate(problem, s)
    best, best_cost = s, (c0.total if c0.feasible else float("inf"))
    res = lagrangian_bound(problem, time_limit_s, upper=c0.total, ref=[int(v) for v in s],
                           round_s=min(round_s, max(time_limit_s / 2, 1.0)))
    for x in res.plans:
        x = np.asarray(x, dtype=np.int64)
        if not lc.feasible(x):
            x = repair_memory(problem, x, lc=lc, time_limit_s=max(min(deadline - time.perf_counter(), 1.0), 0.1))
            if x is None:
                continue
        c = evaluate(problem, x)
        if c.feasible and c.total < best_cost:
            best, best_cost = np.asarray(x, dtype=np.int64), c.total
    return best, float(res.bound)


def lagrange_time_limit(problem: Problem) -> float:
    """The planners' limit for ``lagrange_starts``: 20 ms a node between ``LAGRANGE_MIN_S`` and
    ``LAGRANGE_TIME_LIMIT_S`` (the rounds run to their limit: with 8 s flat the 18- and 55-node
    capped outside-the-zoo steps took 8.5 and 10.3 s against 1.6 and 2.7 s before)."""
    return min(LAGRANGE_TIME_LIMIT_S, max(LAGRANGE_MIN_S, LAGRANGE_S_PER_NODE * problem.num_nodes))


def improve(problem: Problem, plan, polish_time_limit_s: float | None = 0.5, refine_time_limit_s: float = 0.0,
            lc: LocalCosts | None = None, seed: int = 0, repair_time_limit_s: float | None = None,
            whole_time_limit_s: float = 0.0, lagrange_time_limit_s: float = 0.0,
            report: dict | None = None) -> list[int] | None:
    """Memory repair if ``plan`` is over the limit (within ``repair_time_limit_s``, None: no limit;
    returns None if the repair fails), ``polish`` for ``polish_time_limit_s``, then ``refine`` for
    ``refine_time_limit_s`` (``whole_time_limit_s`` > 0: ``whole_milp`` first, and if it proves its
    plan optimal that plan is returned without polish or refine; ``lagrange_time_limit_s`` > 0
    under a usage limit: before that, ``lagrange_starts``' plan, returned at once when it meets
    the Lagrangian bound; when it differs from ``plan`` both are repaired and polished (and given
    ``whole_time_limit_s``) and the cheaper is refined).
    ``report`` (a dict): ``report["proven"] = True`` when the plan returned is proven optimal (the whole
    MILP's or the Lagrangian bound's proof). ``polish_time_limit_s=None`` (with a ``repair_time_limit_s``): repair and
    polish share that one limit, the polish getting what the repair left (at least 0.1 s). Gives the
    comparison rows of experiments/eval_policy.py the same post-processing as the policy; the capped
    core (``solvers.capped``) runs it on the uncapped optimum and on BP's plan."""
    t0 = time.perf_counter()
    lc = lc or LocalCosts(problem)
    if not evaluate(problem, plan).feasible:
        plan = repair_memory(problem, plan, lc=lc, time_limit_s=repair_time_limit_s)
        if plan is None:
            return None
    if polish_time_limit_s is None:
        if repair_time_limit_s is None:
            raise ValueError("improve: polish_time_limit_s=None needs a repair_time_limit_s to share")
        polish_time_limit_s = max(repair_time_limit_s - (time.perf_counter() - t0), 0.1)
    if lagrange_time_limit_s > 0 and problem.usage_limit is not None:
        start, lb = lagrange_starts(problem, plan, lagrange_time_limit_s, lc=lc)
        if evaluate(problem, start).total <= lb + 1e-9 * abs(lb):   # meets the bound: optimal
            if report is not None:
                report["proven"] = True
            return [int(x) for x in start]
        if not np.array_equal(start, np.asarray(plan)):   # both starts polished: the cheaper after
            # polish is not always the cheaper before (meshgraphnet tiny @ a100-hetero-2x4 cap 0.5:
            # 1.42x from the Lagrangian start alone, 1.36x from the decode); then one refine from the
            # cheaper for the whole ``refine_time_limit_s`` (before: each refined for it, twice the time)
            rest = dict(polish_time_limit_s=polish_time_limit_s, lc=lc, seed=seed, whole_time_limit_s=whole_time_limit_s,
                        report=report)
            out = min((improve(problem, x, **rest) for x in (plan, start)), key=lambda x: evaluate(problem, x).total)
            if refine_time_limit_s > 0:
                out = [int(x) for x in refine(problem, out, refine_time_limit_s, seed=seed)]
            return out
    if whole_time_limit_s > 0:   # first: a proven optimum needs no polish (the default planner's speed)
        plan, proven = whole_milp(problem, plan, whole_time_limit_s, return_status=True)
        if proven:
            if report is not None:
                report["proven"] = True
            return [int(x) for x in plan]
    plan = polish(problem, plan, time_limit_s=polish_time_limit_s, lc=lc, seed=seed)
    if refine_time_limit_s > 0:
        plan = refine(problem, plan, refine_time_limit_s, seed=seed)
    return [int(x) for x in plan]
