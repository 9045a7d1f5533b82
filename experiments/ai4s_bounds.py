"""Lower bounds on the Alpa-space step time and peak memory, and the uncapped min-time plan, for
experiments/bench_ai4s.py: what its ``speedup_proven`` / ``speedup_bounded`` / ``memory_ratio_proven``
figures rest on. Each bound holds for every plan of the Problem (proofs in the docstrings)."""
from __future__ import annotations

from solvers.ilp.bounds import node_min_peak as usage_lower_bound  # noqa: F401  (the least-usage peak: copies only add)


def alpa_time_bound(res: dict, tlb: float) -> float:
    """The best proven lower bound on every Alpa-space plan's step time: the larger of ``tlb`` (a
    bound computed without the capped solve: ``time_lower_bound`` or ``block_lower_bound``) and
    the Alpa-space min-time ILP's dual bound (HiGHS's, on the model the ILP
    solves: exact for the time objective; its own objective where it proved optimality and stored no
    bound, i.e. within HiGHS's relative MIP gap, 1e-4 by default)."""
    a = res["alpa-time"]
    b = a.get("bound")
    if b is None and a.get("status") == "optimal":
        b = a["step_time_s"]
    return max(tlb, b) if b is not None else tlb


def time_lower_bound(problem) -> float:
    """A lower bound on any plan's step time in ``problem``: every node at its cheapest strategy,
    no resharding (edge costs are >= 0)."""
    return float(sum(problem.node_costs[problem.node_slice(i)].min() for i in range(problem.num_nodes)))


def sub_problem(problem, nodes):
    """The Problem on ``nodes`` (sorted ids) with only the edges inside them, no memory cap and no
    copy groups: its optimum, plus the other blocks', is a lower bound on ``problem``'s
    (``block_lower_bound``)."""
    import numpy as np

    from costmodel.problem import Problem
    nodes = np.asarray(nodes, dtype=np.int64)
    pos = np.full(problem.num_nodes, -1, dtype=np.int64)
    pos[nodes] = np.arange(len(nodes))
    sl = [problem.node_slice(int(i)) for i in nodes]
    keep = [e for e in range(problem.num_edges) if pos[problem.edges[e, 0]] >= 0 and pos[problem.edges[e, 1]] >= 0]
    ecost = [problem.edge_costs[problem.edge_offsets[e]:problem.edge_offsets[e + 1]] for e in keep]
    return Problem.from_lists(f"{problem.name}[block]", [problem.node_costs[x] for x in sl],
                              [problem.node_usages[x] for x in sl], problem.intervals[nodes],
                              pos[problem.edges[keep]] if keep else np.zeros((0, 2), dtype=np.int64), ecost)


def over_cap(problem):
    """Per strategy (flat, as ``node_costs``): True where no plan under ``problem.usage_limit``
    can take it: the live profile of every other node at its least usage, plus this strategy's
    usage over its node's interval, exceeds the cap somewhere (copies only add to it)."""
    import numpy as np

    from costmodel.problem import usage_profile
    S = len(problem.node_costs)
    if problem.usage_limit is None:
        return np.zeros(S, dtype=bool)
    k = problem.num_strategies
    node = np.repeat(np.arange(problem.num_nodes), k)
    mins = np.minimum.reduceat(problem.node_usages, problem.strategy_offsets[:-1])
    times, live = usage_profile(problem, mins)
    top = np.zeros(problem.num_nodes)
    for i, (a, b) in enumerate(problem.intervals):   # the least-usage profile's max over i's interval
        lo, hi = np.searchsorted(times, a, "right") - 1, np.searchsorted(times, b, "left")
        if b > a and hi > max(lo, 0):
            top[i] = live[max(lo, 0):hi].max()
    return top[node] - mins[node] + problem.node_usages > problem.usage_limit * (1 + 1e-9)


def block_lower_bound(problem, block: int = 150, time_limit_s: float = 10.0) -> float:
    """A lower bound on every plan's step time (memory cap dropped): the nodes cut into blocks of
    ``block`` consecutive ids (topological order, so chains stay together), each block's min-time
    ILP on its own edges only; the sum of the blocks' optima (their dual bounds where a solve
    stops at its limit). Valid because node and edge costs are >= 0: a plan's cost is at least its
    blocks' node costs plus their inner edges'. Tighter than ``time_lower_bound`` (blocks of one
    node) by the resharding inside the blocks; the edges between blocks are what it leaves out. A
    block whose solve finds no plan within the limit is split in two (below 32 nodes: its cheapest
    nodes, ``time_lower_bound``). The cap is not a constraint, but strategies ``over_cap`` cost
    1000 s more: a plan under the cap takes none of them, so the bound still holds for those."""
    import dataclasses

    import numpy as np
    problem = dataclasses.replace(problem, node_costs=problem.node_costs + np.where(over_cap(problem), 1e3, 0.0))
    def bound(nodes) -> float:
        import shardgym as sg
        sub = sub_problem(problem, nodes)
        try:
            plan = sg.solve(sub, method="ilp", time_limit_s=time_limit_s)
        except RuntimeError:   # no incumbent within the limit
            if len(nodes) < 32:
                return time_lower_bound(sub)
            h = len(nodes) // 2
            return bound(nodes[:h]) + bound(nodes[h:])
        info = plan.info or {}
        if info.get("bound") is not None:
            return float(info["bound"])
        if info.get("status") == "optimal":
            return sg.evaluate(sub, plan).step_time_s
        return time_lower_bound(sub)
    n = problem.num_nodes
    return sum(bound(list(range(b0, min(n, b0 + block)))) for b0 in range(0, n, block))


def uncapped_time_plan(problem, time_limit_s: float):
    """The min-time ILP's plan with the memory cap dropped, as a plan of ``problem`` when it fits
    its cap (None otherwise, or when the solve finds nothing). Its info (status, bound) holds for
    ``problem`` too: dropping the cap can only lower the optimum, so a plan that fits and is
    optimal without it is optimal with it. Measured: on meshgraphnet mesh-131k over tpu-4x4 the
    capped Alpa-space ILP stops at 60 s with 50.5 ms; uncapped it proves 36.8 ms in 22 s, but with
    a plan of 61.1 GiB per device, over the 32 GiB cap: not kept (its bound still holds, see
    ``block_lower_bound``). Where the cap does not bind, it is the capped optimum even when the
    capped search stops short of it."""
    import dataclasses

    import shardgym as sg
    from costmodel.problem import Plan
    if problem.usage_limit is None:
        return None
    try:
        u = sg.solve(dataclasses.replace(problem, usage_limit=None), method="ilp", time_limit_s=time_limit_s)
    except RuntimeError:
        return None
    if not sg.evaluate(problem, u).feasible:
        return None
    return Plan.for_problem(problem, u.strategies, method="ilp-uncapped", info=dict(u.info or {}))


def fill_bounded(rows: list[dict]) -> None:
    """Add ``speedup_bounded`` to rows of an earlier run that lack it, from each row's stored
    Alpa-space min-time status (its own figure where the ILP proved optimality, else
    ``time_lower_bound``): no solve."""
    for r in rows:
        if "speedup_bounded" not in r and "speedup_proven" in r:
            b = alpa_time_bound({"alpa-time": dict(r["plans"]["alpa-time"])}, r["alpa_step_lower_bound_ms"] / 1e3)
            r.update(alpa_step_bound_ms=b * 1e3, speedup_bounded=b * 1e3 / r["full_step_ms"])


def lagrangian_bound(problem, lam: float, times, time_limit_s: float = 60.0):
    """(bound, plan): a lower bound on every plan's step time under ``problem.usage_limit``, from
    the cap at the time points ``times`` relaxed with multiplier ``lam`` (s per byte, >= 0) each:
    min over all plans of step + lam * sum_t (nodes' usage live at t - cap), the uncapped min-time
    ILP on node costs + lam * usage * (number of ``times`` in the node's interval), its dual bound
    less lam * cap * len(times). Valid: a plan under the cap has its nodes' usage live at each t at
    most the cap (copies only add, ``usage_profile``), so its term is <= 0 and the min is <= its
    step. Strategies ``over_cap`` cost 1000 s more, as in ``block_lower_bound``. ``plan``: the
    relaxed problem's plan (its usage at ``times`` is the subgradient), None when none is found."""
    import dataclasses

    import numpy as np

    import shardgym as sg
    t = np.asarray(times)
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    cnt = ((st[:, None] <= t[None, :]) & (t[None, :] < en[:, None])).sum(1)
    node = np.repeat(np.arange(problem.num_nodes), problem.num_strategies)
    costs = problem.node_costs + np.where(over_cap(problem), 1e3, 0.0) + lam * problem.node_usages * cnt[node]
    try:
        plan = sg.solve(dataclasses.replace(problem, node_costs=costs, usage_limit=None), method="ilp",
                        time_limit_s=time_limit_s)
    except RuntimeError:
        return time_lower_bound(problem), None
    info = plan.info or {}
    b = info.get("bound")
    if b is None and info.get("status") == "optimal":   # its own relaxed objective, as alpa_time_bound
        c = sg.evaluate(problem, plan)
        b = c.step_time_s - c.node_cost + float(costs[problem.strategy_offsets[:-1] + np.asarray(plan.strategies)].sum())
    if b is None:
        return time_lower_bound(problem), plan
    return float(b) - lam * problem.usage_limit * len(t), plan


def lagrangian_time_bound(problem, upper: float, iters: int = 6, time_limit_s: float = 60.0) -> float:
    """The best ``lagrangian_bound`` over ``iters`` multipliers at one time point: where the
    uncapped min-time plan's node usage peaks (0.0 when the cap is None or that plan fits:
    ``block_lower_bound`` is then the capped optimum). The first multiplier prices the uncapped
    plan's excess at (``upper`` - its step) (``upper``: any plan's step, e.g. the capped ILP's);
    then doubled while the relaxed plan stays over the cap at that point, bisected (geometric
    mean) between the last over and the first under. Every value tried is a valid bound (measured:
    meshgraphnet mesh-131k over tpu-4x4, 36.8 ms uncapped optimum, 44.9 ms at 0.28 ms/GiB)."""
    import numpy as np

    from costmodel.problem import usage_profile
    if problem.usage_limit is None:
        return 0.0
    best, plan = lagrangian_bound(problem, 0.0, [0], time_limit_s)

    def at(plan, ts=None):
        times, live = usage_profile(problem, problem.node_usages[problem.strategy_offsets[:-1] + np.asarray(plan.strategies)])
        return (times[int(np.argmax(live))], live.max()) if ts is None else live[np.searchsorted(times, ts, "right") - 1]
    if plan is None:
        return best
    ts, peak = at(plan)
    if peak <= problem.usage_limit:
        return 0.0
    lo, hi = 0.0, None
    lam = max(upper - best, 1e-9) / (peak - problem.usage_limit)
    for _ in range(iters):
        b, plan = lagrangian_bound(problem, lam, [ts], time_limit_s)
        best = max(best, b)
        if plan is None:
            break
        if at(plan, ts) > problem.usage_limit:
            lo = lam
        else:
            hi = lam
        lam = 2 * lam if hi is None else (np.sqrt(lo * hi) if lo > 0 else hi / 2)
    return best
