"""Heuristic planning for contest-size problems (30,000-60,000 nodes), where the exact ILP is too big.

``solve_large(problem, time_limit_s, progress=None, seed=0) -> list[int] | None``:

1. **Feasibility anchor**: the plan that takes each node's lowest-usage strategy minimises the live
   usage at every time point at once, so it is feasible iff any plan is (None is returned if not).
   With resharded copies (``Problem.edge_memory``) that no longer holds: an anchor over the limit
   is repaired with the copies priced (``solvers.local.repair_memory``), then the first feasible
   ``starts`` plan anchors; None then means none was found. Every kept plan is priced with its
   copies (``LocalCosts.profile``); the Lagrangian prices see node usages only (the pruned graph has
   no copy groups); a plan that fits by node bytes but not with its copies, and the tied repair, are
   repaired with the copies priced (``repair_tied(..., pr=)``).
2. **Pruning** (``solvers.local.Pruning``): strategies no forbidden-free, memory-feasible plan can use are dropped
   (node cost ≥ ``FORBIDDEN_COST``; no allowed partner on some edge, i.e. arc consistency; or over the limit even
   with every other node at its lowest usage), repeated to a fixed point.
3. **Ties** (``solvers.local.Contraction``): an edge whose allowed entries form a permutation forces one end's
   strategy from the other's; union-find merges such nodes into components (IOPDDL instance A:
   34,932 nodes -> ~300 components with a choice). Exact; memory stays on the member nodes.
   Single-node moves cannot escape a forbidden entry inside a tied group, whole-component moves can.
4. **Lagrangian relaxation of the memory limit** (the contest winner's idea), on the component
   graph: prices λ_t per time point turn usage into cost; each round is a random induced-forest
   dynamic programme (exact on the forest, the rest fixed) plus best response (ICM) on the priced
   costs; λ grows multiplicatively where the plan is over the limit and decays when it fits;
   near-feasible plans are repaired (``solvers.local.repair_tied``: cheapest cost per byte saved at
   the worst point), new best plans are polished (feasible whole-component moves on the true cost).
5. The same rounds on the **untied** graph from ICM of the cheapest / greedy plan: a different
   basin (better on instance M, where tied descent stalls). Steps 4 and 5 get 30 % of the main
   phase each; the one that found the best plan gets the rest.
6. **Feasible polish** (components, then single nodes by ``solvers.local.best_response``); on graphs
   of at most ``LNS_MAX_NODES``, **large-neighbourhood search** with the exact MILP
   (``solvers.local.lns``) on BFS neighbourhoods.

The moves, repair, greedy start, reductions and LNS are the local-search library's
(``solvers.local``); this module owns the driver: the Lagrangian rounds and the schedule.

Always keeps the best feasible plan (priced on the original problem) and checks the clock between
steps; it returns by ``time_limit_s`` (the caller keeps a margin) -- an approximation: one forest DP
or ICM sweep (about a second on contest graphs) or one MILP call may run a little past it.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem
from costmodel.profile import step_sum
from solvers.local.costs import LocalCosts
from solvers.local.greedy import greedy_by_cost, least_usage_plan
from solvers.local.lns import LNS_MAX_NODES, lns
from solvers.local.moves import best_response, forest_dp
from solvers.local.prune import Contraction, prepare
from solvers.local.repair import repair_memory, repair_tied

__all__ = ["ICM_SWEEPS", "solve_large"]


def _icm(gc: LocalCosts, sc: np.ndarray, node_cost: np.ndarray, classes, until: float, sweeps: int = 50) -> np.ndarray:
    """Colour-class best response (``solvers.local.best_response`` with ``classes``) on
    ``node_cost``, memory ignored, for at most ``sweeps`` passes over the classes or until ``until``."""
    return np.asarray(best_response(gc.p, sc, time_limit_s=until - time.perf_counter(),
                                    max_rounds=sweeps * max(len(classes), 1), lc=gc, node_cost=node_cost,
                                    memory=False, classes=classes), dtype=np.int64)


ICM_SWEEPS = 4   # colour-class best-response passes per Lagrangian round


def _polish_tied(C: Contraction, gc: LocalCosts, sc: np.ndarray, deadline: float, passes: int = 5) -> np.ndarray:
    """Best-improvement moves of whole components on the true cost that keep the memory profile
    within the limit (checked exactly: each member's usage change over its interval)."""
    g = C.g
    sc = sc.copy()
    members = np.split(np.argsort(C.cid, kind="stable"), np.cumsum(np.bincount(C.cid))[:-1])
    live = g.profile(C.expand(sc)) if g.cap is not None else None
    for _ in range(passes):
        L = gc.local(sc)
        bestL = L[gc.offs[:-1] + gc.seg_argmin(L)]
        gain = L[gc.offs[:-1] + sc] - bestL
        cand = np.nonzero(gain > 1e-9 * np.maximum(1.0, np.abs(bestL)))[0]
        cand = cand[np.argsort(-gain[cand])]
        moved = 0
        for c in cand.tolist():
            if time.perf_counter() > deadline:
                return sc
            lc = gc.node_local(sc, c)
            for a in np.argsort(lc).tolist():
                if lc[a] >= lc[sc[c]]:
                    break
                if live is not None:
                    M = members[c]
                    M = M[g.live_mask[M]]
                    du = g.usage[g.offs[M] + C.MAP[g.offs[M] + a]] - g.usage[g.offs[M] + C.MAP[g.offs[M] + sc[c]]]
                    nz = du != 0
                    if nz.any():   # the change lives on the members' span only
                        lo, hi = g.lo[M[nz]], g.hi[M[nz]]
                        a0, a1 = int(lo.min()), int(hi.max())
                        delta = float(du[nz][0]) if len(lo) == 1 else step_sum(lo - a0, hi - a0, du[nz], a1 - a0)
                        if (live[a0:a1] + delta).max(initial=-np.inf) > g.cap:
                            continue
                        live[a0:a1] += delta
                sc[c] = a
                moved += 1
                break
        if not moved:
            break
    return sc


def _lagrangian_rounds(C: Contraction, gc: LocalCosts, sc: np.ndarray, rng, consider, up: float = 2.5,
                       down: float = 0.9, repair_below: float = 1.05, polish_every_s: float = 10.0,
                       tag: str = "tied", pr=None):
    """The memory limit relaxed into prices (the contest winner's method), on the component graph.

    A generator, so that two runs can share the clock: prime it with ``next``, then
    ``gen.send(deadline)`` runs rounds until that deadline and returns; state (plan, prices) is
    kept for the next ``send``.

    λ_t ≥ 0 per compressed time point; a member node i adds usage_i[s]·Σ_{t∈interval(i)} λ_t to its
    component's strategy cost. Each round: one random induced-forest DP move plus a few ICM
    best-response rounds on the priced costs (continuing from the last plan). If the expanded plan is over the
    limit, λ grows multiplicatively at the overloaded points only (λ_t ← max(up·λ_t,
    base·10·overload_t), base = median cost / median usage), and a plan at most ``repair_below`` ×
    the limit is also repaired; if it fits, it is a candidate and every λ decays by ``down``. So the
    prices hover near the smallest that keep the plan feasible. A new best plan is also polished
    (feasible whole-component moves on the true cost, at most every ``polish_every_s``) and the
    rounds continue from it. With ``pr`` (the pruning ``C.g`` came from) of a problem with copy
    groups, a plan that fits by node bytes but not with its copies is repaired with them priced
    (``repair_tied(..., pr=pr)``). (A fixed subgradient step that doubled per infeasible round overshot
    by 100x after a few stubborn points and left the plan stuck at 0.91 of the limit.)"""
    g = C.g
    classes = gc.colour_classes()
    pos = g.cost[np.abs(g.cost) < FORBIDDEN_COST]
    cost_scale = float(np.median(np.abs(pos)) + 1.0) if len(pos) else 1.0
    use_scale = float(np.median(g.usage[g.usage > 0])) if (g.usage > 0).any() else 1.0
    base = cost_scale / use_scale
    lam = np.zeros(len(g.times))
    copies = pr is not None and pr.g.p.edge_memory is not None
    it = 0
    last_polish = -np.inf
    until = yield
    while True:
        if time.perf_counter() >= until:
            until = yield
            continue
        pen = C.penalty(g.interval_sums(lam)) if lam.any() else gc.cost
        sc = forest_dp(gc, sc, pen, rng, until)
        sc = _icm(gc, sc, pen, classes, until, sweeps=ICM_SWEEPS)
        it += 1
        if g.cap is None:
            consider(sc, f"{tag} dp[{it}]")
            continue
        r = g.profile(C.expand(sc)) / g.cap
        over = r > 1.0

        def repaired():
            return repair_tied(C, gc, sc, max(min(until - time.perf_counter(), 2.0), 0.0), pr=pr)

        if over.any():
            lam[over] = np.maximum(lam[over] * up, base * 10.0 * (r[over] - 1.0))
            if r.max() <= repair_below:
                consider(repaired(), f"{tag} dp+repair[{it}]")
        else:
            if copies and not pr.g.feasible(pr.to_orig(C.expand(sc))):   # its copies break the limit
                consider(repaired(), f"{tag} dp+copy repair[{it}]")
            elif consider(sc, f"{tag} dp[{it}]") and time.perf_counter() > last_polish + polish_every_s:
                sp = _polish_tied(C, gc, sc, min(until, time.perf_counter() + polish_every_s / 2))
                last_polish = time.perf_counter()
                if consider(sp, f"{tag} dp+polish[{it}]"):
                    sc = sp
            lam *= down


def solve_large(problem: Problem, time_limit_s: float, progress=None, seed: int = 0,
                use_lns: bool = True, tie: bool = True, starts=(), on_plan=None,
                prepared=None) -> list[int] | None:
    """Best feasible plan found within ``time_limit_s`` seconds, or None if no plan fits the memory
    limit (proved by the lowest-usage plan being over it). ``starts``: plans found elsewhere (e.g.
    ``solvers.bp``); the feasible ones are candidates, and the best of them starts the tied and
    untied Lagrangian runs where it is cheaper than their own ICM start. ``on_plan(plan)`` is called
    with every new best plan (so a caller that is stopped mid-run keeps it). ``prepared``: the
    (pruning, pruned graph, contraction, component graph) of ``prepare(problem)``, when the caller
    already built them (they take seconds on contest graphs)."""
    t0 = time.perf_counter()
    deadline = t0 + float(time_limit_s)
    say = progress or (lambda msg: None)
    rng = np.random.default_rng(seed)
    g = LocalCosts(problem)
    # 1. anchor
    minu = np.asarray(least_usage_plan(problem), dtype=np.int64)
    if not g.feasible(minu) and problem.edge_memory is not None:   # its copies break the limit: repair it
        fit = repair_memory(problem, minu, lc=g, time_limit_s=0.1 * time_limit_s)
        minu = minu if fit is None else np.asarray(fit, dtype=np.int64)
    if not g.feasible(minu):   # with copies, a given start may still fit
        minu = next((np.asarray(st, dtype=np.int64) for st in starts
                     if st is not None and len(st) == g.n and g.feasible(np.asarray(st, dtype=np.int64))), None)
    if minu is None:
        say("no plan fits: the lowest-usage plan is over the limit")
        return None
    best = minu
    best_cost = g.total(minu)
    say(f"anchor (lowest usage): {best_cost:.10g}")

    def consider(s, tag) -> bool:
        nonlocal best, best_cost
        if s is None or not g.feasible(s):
            return False
        c = g.total(s)
        if c < best_cost:
            best, best_cost = s.copy(), c
            say(f"{tag}: {best_cost:.10g} ({time.perf_counter() - t0:.1f}s)")
            if on_plan is not None:
                on_plan(best)
            return True
        return False

    # a second anchor that avoids the 1e18 "impossible" strategies where possible
    consider(np.asarray(least_usage_plan(problem, avoid_forbidden=True), dtype=np.int64),
             "anchor (lowest usage, allowed strategies)")
    have_start = False
    for st in starts:
        if st is not None and len(st) == g.n:
            have_start |= consider(np.asarray(st, dtype=np.int64), "given start")
    # 2. prune strategies no forbidden-free feasible plan uses; tie nodes joined by permutations
    pr, g2, C, gc = prepared if prepared is not None and tie else prepare(problem, tie, g)
    say(f"pruned {len(g.cost)} -> {len(g2.cost)} strategies; tied {g.n} nodes -> {gc.n} components "
        f"({int((gc.k > 1).sum())} with a choice), {len(gc.eu)} edges ({time.perf_counter() - t0:.1f}s)")

    def consider_tied(sc, tag) -> bool:
        return sc is not None and consider(pr.to_orig(C.expand(sc)), tag)

    sc = _icm(gc, gc.seg_argmin(gc.cost), gc.cost, gc.colour_classes(), deadline)
    consider_tied(sc, "tied icm")
    if have_start:
        b2 = pr.from_orig(best)
        bsc = None if b2 is None else C.contract(b2)
        if bsc is not None and gc.total(bsc) < gc.total(sc):
            sc = bsc
    if g.cap is not None and not g.feasible(pr.to_orig(C.expand(sc))):
        consider_tied(repair_tied(C, gc, sc, max(min(deadline - time.perf_counter(), 0.1 * time_limit_s), 0.0), pr=pr),
                      "tied repair")
    # 3. Lagrangian rounds on the component graph (30 % of the main phase), then (5.) on the untied
    #    graph from ICM of the cheapest / greedy plans (to 60 %): single nodes cannot break ties
    #    there, so ICM stalls in plans that keep tied groups at cheap, low-usage strategies -- on
    #    instance M a far better basin. The run that found the best plan gets the rest.
    use_lns = use_lns and g.n <= LNS_MAX_NODES
    main_deadline = t0 + (0.75 if use_lns else 0.92) * time_limit_s
    t_main = max(main_deadline - time.perf_counter(), 0.0)
    start = time.perf_counter()
    winner = ["tied"]

    def credit(name, check):
        def f(sc, tag):
            ok = check(sc, tag)
            if ok:
                winner[0] = name
            return ok
        return f

    runs = {"tied": _lagrangian_rounds(C, gc, sc, rng, credit("tied", consider_tied), pr=pr)}
    next(runs["tied"])
    runs["tied"].send(start + (0.3 if tie else 1.0) * t_main)
    if tie and time.perf_counter() + 1.0 < main_deadline:
        C1 = Contraction(g2, tie=False)
        g1 = LocalCosts(C1.problem)
        cls1 = g1.colour_classes()
        s0 = _icm(g1, g1.seg_argmin(g1.cost), g1.cost, cls1, main_deadline)
        s1 = _icm(g1, np.asarray(greedy_by_cost(C1.problem, order=np.arange(g1.n),
                                                time_limit_s=min(main_deadline - time.perf_counter(), 0.05 * time_limit_s))),
                  g1.cost, cls1, main_deadline)
        if g1.total(s1) < g1.total(s0):
            s0 = s1
        b2 = pr.from_orig(best) if have_start else None
        if b2 is not None and g1.total(b2) < g1.total(s0):
            s0 = b2

        def consider_untied(s, tag) -> bool:
            return s is not None and consider(pr.to_orig(s), tag)

        credit("untied", consider_untied)(s0, "untied icm")
        runs["untied"] = _lagrangian_rounds(C1, g1, s0, rng, credit("untied", consider_untied), tag="untied",
                                             pr=pr)
        next(runs["untied"])
        runs["untied"].send(start + 0.6 * t_main)
    if time.perf_counter() < main_deadline:
        say(f"continuing the {winner[0]} run")
        runs[winner[0]].send(main_deadline)
    # 4. polish: component moves, then single-node moves, that keep the plan feasible; without
    #    LNS, time the polish leaves goes back to the winning run (then one more polish)
    for again in (False, True):
        if again:
            if use_lns or time.perf_counter() + 3.0 > deadline:
                break
            runs[winner[0]].send(deadline - 1.5)
        b2 = pr.from_orig(best)
        bsc = None if b2 is None else C.contract(b2)
        if bsc is not None:
            consider_tied(_polish_tied(C, gc, bsc, deadline), "tied polish")
        consider(np.asarray(best_response(problem, best, time_limit_s=deadline - time.perf_counter(), lc=g)), "polish")
    # 5. LNS with the exact MILP on neighbourhoods of the original graph
    if use_lns and time.perf_counter() + 3.0 < deadline:
        s, c = lns(g, best.copy(), best_cost, deadline - 0.5, rng, say)
        consider(s, "lns")
    return [int(x) for x in best]
