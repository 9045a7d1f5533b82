"""The solver dispatch behind ``shardgym.solve``: which exact solver runs for an objective, what
seeds it, and the rule baselines.

Every function here reads the memory cap from ONE place, the Problem's ``usage_limit``, which
``costmodel.limits.Limits.apply`` set to the effective cap min(device memory, user cap) before
the call (``shardgym.api.solve`` does it once). Nothing here takes a cap argument.

- ``solve_exact``: method "ilp". With the time objective under a cap that can bind
  (``binding_cap``) on a graph the MILP holds (``solvers.capped.milp_ok``) or on any traced graph
  with copy groups: the capped core (``solve_capped_time``), which prices the resharded copies
  (``Problem.edge_memory``) itself. Graphs too big for its MILP (gpt 125m and up on h100-2x8) went to
  the plain guarded ILP until session 26: under a binding cap it found no plan in 60 s (gpt 7b
  h100-2x8 at 58.6 GB; gpt 125m there at cap fraction 0.05, 65 s into the 60 s limit), where the core
  answers 0.3805 and 0.01498 s a step (load 3.7-3.9, results/s26_big_capped_after.json); at 80 GiB (not
  binding) 0.34406 against the guarded ILP's best seed 0.34891 (the optimum 0.34379). Otherwise
  ``solvers.ilp.solve_ilp``, seeded with the replicated plan (traced problems) and the baselines
  where they help (``baseline_seeds``), under a watchdog (``solvers.ilp.solve_ilp_guarded``: a
  forked child killed 2 s + 5 % past the limit, where HiGHS overruns natively); stopped, it answers
  the best seed (status "killed"). The memory objective under a step-time bound or with copy groups
  is seeded with the baselines, the planner's raw decode and the time-optimal plan, and never
  answers worse than the best of them within the limits (``solvers.minmem_seeds``); with copy groups
  and a bound, the bisection on the cap (``solvers.minmem_bisect``) seeds its MIP, which is killed
  ``SEEDED_GRACE_S`` past its limit, and the peak LNS (``solvers.minmem_lns``) improves the best plan.
- ``solve_baseline``: the rules of ``solvers.baselines`` (dp, megatron, fsdp, replicated).
"""
from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.baselines import METHODS as BASELINES
from solvers.baselines import baseline_plan
from solvers.capped import DEFAULT as CAPPED_DEFAULT
from solvers.capped import milp_ok, solve_guarded
from solvers.ilp.bounds import best_seed, node_min_peak
from solvers.ilp.guard import SolveOverrun, idle_cores, solve_ilp_guarded, start_child, stop_child
from solvers.minmem_bisect import BISECT_SHARE, core_descent, min_peak_within
from solvers.minmem_lns import LNS_MIN_NODES, LNS_SHARE, lns_after, peak_lns
from solvers.minmem_seeds import keep_best, memory_seeds

#: keyword options ``solve_exact`` passes to the capped core (anything else selects ``solve_ilp``)
CAPPED_OPTIONS = frozenset({"initial_plan", "initial_plans", "threads", "progress"})
#: the capped core's configuration for ``shardgym.solve``: the uncapped optimum's bound first
#: (traced graphs: the time objective proves in seconds; the IOPDDL entry point keeps the default)
#: and the Lagrangian's bundle step (``solvers.lagrange_bundle``; IOPDDL problems have no copy groups,
#: so no Lagrangian phase). No early LNS and, with copy groups, no toulbar2 (its bound ignores the
#: copies: 5e-8 - 8e-7 s against plans of 1e-4 - 1e-3 s on gpt / vit tiny h100-2x8): their ~11 s go
#: to the Lagrangian (bench_capped s20a_ab1, load 3-7: bound up in 4 of 6 cells, gpt 50 % 1.95e-4 -> 2.36e-4).
#: Graphs too big for the MILP (session 26): the uncapped MILP beside the core on an idle core, and BP first for up to 80 %
#: (``bp_big_share``): at cap fraction 0.05 on h100-2x8, load ~4, BP alone fits vit base in 21.7 s (0.01774 s a
#: step; the core without it found no plan in 60 s), gpt 125m in 13.4 s (0.01498; the core 0.02166), gpt 7b in
#: 40 s (0.3805; the core 0.3934-0.4253). BP runs before the core's least-peak search, which took 29 s on gpt 125m
#: there and found nothing. HiGHS on one thread when no core is idle (``busy_threads``; README "Session 28 (helper b)")
TRACED = replace(CAPPED_DEFAULT, uncapped_share=0.15, early_lns_share=0.0, bp_improve_s=2.0, lagrange_step="bundle",
                 cfn_copies_max_s=0.0, uncapped_beside=True, bp_big_share=0.8, big_planner_share=0.85, busy_threads=1)
#: seconds each baseline's own ILP may take when it seeds another solve
SEED_TIME_LIMIT_S = 10.0
#: the seeded memory objective's MIP is killed this long past the time left (default guard: 2 s + 5 %);
#: its seeds and the bisection's plan answer then. gpt 125m cpu-2x4 at 30 s (s21e_minmem_deadline, load
#: 1.3-3.1): the MIP was killed every time, 32.5-32.6 s in all with the default grace
SEEDED_GRACE_S = 0.5
#: the capped core is seeded with ``policy_seed``'s plan (the caller's planner) only from this
#: time limit on. The planner has no time limit of its own (17 s on gpt tiny h100-2x8 at load 1-2,
#: 20-55 s at load 7-11; session 14: the core got 5-40 s of 60 after it)
POLICY_SEED_MIN_S = 30.0
#: the memory objective under a step-time bound (copy groups, MILP-sized graphs) with a limit of at least
#: this many seconds descends with the capped core (``solvers.minmem_bisect.core_descent``) after a
#: bisection of at most ``CORE_BISECT_MAX_S``, until ``CORE_TAIL_SHARE`` of the limit is left for the MIP
#: and the peak LNS. gpt tiny "blocks" (cpu-2x4, 1.05x Megatron): see ``core_descent``
CORE_DESCENT_MIN_S = 300.0
CORE_BISECT_MAX_S = 45.0
CORE_TAIL_SHARE = 0.2
#: the last this many plans of the descent are kept as the answer's ``info["candidates"]``
CANDIDATES = 4
#: the policy seed runs in a forked child beside the core (``solve_guarded``'s ``late``) when a core is idle
#: (``idle_cores() >= 1``); on a busy machine first, inline. Beside on a busy machine (s15b_ab_h100, load 2.6-7.3:
#: the planner 23-57 s instead of 16-19 s, the Lagrangian 3-5 rounds instead of 3-14; gpt tiny h100-2x8 25/50/75 %
#: 1.015e-3 / 2.450e-4 / 1.711e-4 against 6.898e-4 / 2.455e-4 / 1.388e-4 inline) is why the gate. False: inline.
POLICY_SEED_BESIDE = True
#: beside, a planner with a time limit (``policy_seed.limited(problem, seconds)``) sends its raw decode, then its plan
#: stopped this long before the core's limit (its phases overran a limit by 0.0-2.5 s in session 27)
BESIDE_MARGIN_S = 4.0
#: inline, with copy groups: the core skips its own BP and BP's improvement (the planner's decode is
#: ``bp_solve`` with memory prices, then ``improve``: the same work; BP's bound ignores the copies)
POLICY_SKIPS_BP = True
#: on a busy machine the core waits for the policy seed at most this share of ``time_limit_s``; a
#: planner still running then goes on beside the core (its plan a late seed): the seed's share of the
#: budget is bounded (session 14 at load 7-11: 20-55 s of 60), and where it finishes in time (16-19 s
#: at load 4-7, bench_capped s15b) nothing changes
POLICY_SEED_SHARE = 0.4
#: with copy groups the seed is the planner's full search (True), or (False) the full search only beside
#: the core on an idle core (``_beside``) and its raw decode (the callable's ``raw`` attribute,
#: ``shardgym.api._policy_plan.raw``) when the core waits for it on a busy machine. Since session 16 the
#: planner's search under a cap is ``solvers.local.budgeted.capped_search`` (16 Lagrangian rounds, the
#: union MILP, polish, LNS), the work the core's own Lagrangian and union phases do: on 2 shared cores
#: at load 3-7 it took 19-74 s (gpt / vit / unet tiny h100-2x8, bench_capped s20a_ab2/ab3), the core
#: waited 24 s of 60 for it, then shared the cores with it, and its Lagrangian got 1-11 rounds (median gap
#: 56.4 % -> 13.6 % on 12 cells). The cost: where the planner would have finished in time the core alone
#: can do worse (gpt tiny tpu-4x4 at 75 %: 1.142x the planner's plan, which took 15 s at load 2; s20a_ab5).
#: Re-measured in session 26 (``bench_capped --compare policy_search=1``, interleaved, README "Session 26"):
#: at load 1-2.5 (tpu-4x4, s25_bench_capped_tpu_seedsearch_ab) the search took 8-23 s and its ILP plan was
#: cheaper in 6 of 15 cells, dearer in 0; at load 3-6 (h100-2x8 / cpu-2x4, s26a_seedsearch_ab_h100 / _cpu) it
#: was still running at the 24 s share in 16 of 36 cells and took up to 201 s (fno tiny cpu-2x4); its plan
#: was cheaper in 1 / dearer in 4 of 15 (h100) and cheaper in 3 / dearer in 10 of 21 (cpu). Over all 51:
#: cheaper 10, equal 27, dearer 14; the ILP worse than ``method="policy"`` in 4 cells with it, 7 without
#: (all on cpu-2x4 but tpu's 2). Kept False: neither setting gives "never worse"
POLICY_SEED_SEARCH = False
#: with copy groups on a busy machine (the raw decode the seed): the seed's child then goes on to the planner's own plan
#: beside the core, a late seed if in time. Session 27 A/B, 15 cells at load 2.2-4 (results/s27a_search_after_ab.json):
#: in time in 7 (28-56 s); cheaper in 2 (fno tiny tpu-4x4 50 % 1.131 -> 1.000 of the policy), dearer in 9 (the core,
#: sharing the cores, lost late phases: vit tiny cpu-2x4 25 % 0.985 -> 1.118); worse than the policy in 8, 6 without
POLICY_SEARCH_AFTER_RAW = False


def binding_cap(problem: Problem) -> float | None:
    """``problem.usage_limit`` when some plan can exceed it (every node at its largest usage
    breaks it), else None (no cap, or one no plan reaches)."""
    if problem.usage_limit is None:
        return None
    cap = float(problem.usage_limit)
    offs = problem.strategy_offsets[:-1]
    local = np.arange(len(problem.node_usages)) - np.repeat(offs, problem.num_strategies)
    order = np.lexsort((local, -problem.node_usages, np.repeat(np.arange(problem.num_nodes), problem.num_strategies)))
    worst = local[order[offs]]
    return cap if evaluate(problem.with_usage_limit(None), worst).peak_memory_bytes > cap else None


def solve_exact(problem: Problem, objective: str = "time", max_step_time_s=None, time_limit_s: float = 60,
                policy_seed=None, **kw) -> tuple[list[int], dict]:
    """Method "ilp" on ``problem`` (its usage_limit is the cap): (strategies, info dict).
    ``policy_seed(problem) -> plan`` (``shardgym.solve`` passes the pretrained planner; solvers do
    not import agent): under a binding cap with the time objective, its plan seeds the capped core
    (``solve_capped_time``); its raw decode seeds the memory objective (``solvers.minmem_seeds``).
    Every time spent here (seeds, bisection) counts against ``time_limit_s``, once."""
    t0, limit_s = time.perf_counter(), float(time_limit_s)
    cap = binding_cap(problem)
    if (cap is not None and objective == "time" and max_step_time_s is None and set(kw) <= CAPPED_OPTIONS
            and (milp_ok(problem) or problem.edge_memory is not None)):
        return solve_capped_time(problem, float(time_limit_s), t0, policy_seed=policy_seed, **kw)
    seeded = objective == "memory" and (max_step_time_s is not None or problem.edge_memory is not None)
    if seeded:
        # the memory objective under a bound, or with copy groups (its phase 1 a MIP too): seeded with
        # the baselines, the planner's raw decode and the time-optimal plan (solvers.minmem_seeds), and
        # never answering worse than the best of them within the limits (``keep_best`` below)
        base = baseline_seeds(problem)
        more, seed_info = memory_seeds(problem, limit_s, seeds_of(kw) + base, policy_seed)
        kw["initial_plans"] = list(kw.get("initial_plans") or []) + base + more
    elif objective != "time" and ((max_step_time_s is not None and "initial_plans" not in kw)
                                  or problem.edge_memory is not None):
        kw["initial_plans"] = list(kw.get("initial_plans") or []) + baseline_seeds(problem)
    if objective != "time":
        # the seeds' time counts against the limit (at least 1 s is left to the solver)
        time_limit_s = max(1.0, limit_s - (time.perf_counter() - t0))
    bisect = dinfo = None
    lns = LNS_SHARE if problem.num_nodes >= LNS_MIN_NODES else 0.0   # the peak LNS's share after the bisection
    if objective == "memory" and max_step_time_s is not None and BISECT_SHARE > 0 and problem.edge_memory is not None:
        # min peak within T by bisection on the cap (solvers.minmem_bisect), from the best seed within
        # T: its plan seeds the MIP. Only with copy groups, where the MIP does not close and where it
        # was measured; without them the MIP runs alone, as before (no 70 % of the limit spent ahead
        # of a MIP that may prove at once). Its share is of the time left after the seeds
        descend = limit_s >= CORE_DESCENT_MIN_S and milp_ok(problem)
        share = min(BISECT_SHARE * float(time_limit_s), CORE_BISECT_MAX_S) if descend else \
            BISECT_SHARE * float(time_limit_s)
        bisect, binfo = min_peak_within(problem, float(max_step_time_s), seeds_of(kw), time.perf_counter() + share)
        if bisect is not None and descend:   # long limits: the capped core's steps (solvers.minmem_bisect)
            bisect, dinfo = core_descent(problem, float(max_step_time_s), bisect,
                                         t0 + (1.0 - CORE_TAIL_SHARE) * limit_s,
                                         lambda cp, secs, seeds: _core_step(cp, secs, seeds, policy_seed),
                                         polish=lambda s, until: peak_lns(problem, s, float(max_step_time_s), until)[0],
                                         progress=kw.get("progress"))
            binfo["steps"] = binfo["steps"] + [("core",) + tuple(x) for x in dinfo["steps"]]
        if bisect is not None:   # the MIP gets 1 - LNS_SHARE of the time left, the peak LNS the rest
            kw["initial_plans"] = [bisect] + list(kw.get("initial_plans") or [])
            time_limit_s = max(1.0, (1.0 - lns) * (limit_s - (time.perf_counter() - t0)))
    if problem.meta is not None and "initial_plan" not in kw:
        # strategy 0 of every traced node is "replicated": a plan HiGHS can start from, so a
        # time-limited solve of a big graph returns a plan instead of "no feasible plan found"
        replicated = [0] * problem.num_nodes
        kw["initial_plans"] = list(kw.get("initial_plans") or []) + [replicated]
        limit = float("inf") if problem.usage_limit is None else problem.usage_limit
        if objective == "time" and evaluate(problem, replicated).peak_memory_bytes > limit:
            # replication does not fit (GPT-7B on 80 GiB): the baselines are the seeds
            kw["initial_plans"] += baseline_seeds(problem)
            time_limit_s = max(1.0, limit_s - (time.perf_counter() - t0))
    progress = kw.pop("progress", None)
    try:
        strategies, solve_info = solve_ilp_guarded(problem, objective=objective, max_step_time_s=max_step_time_s,
                                                   time_limit_s=time_limit_s, progress=progress,
                                                   grace_s=SEEDED_GRACE_S if seeded else None, **kw)
    except SolveOverrun as exc:   # HiGHS overran its limit natively: the best seed, never a hang
        strategies, info = best_seed_plan(problem, objective, max_step_time_s, seeds_of(kw), str(exc), t0,
                                          exc.incumbents)
    else:
        info = solve_info.to_dict() if hasattr(solve_info, "to_dict") else dict(solve_info)
    if bisect is not None:
        info["bisection"] = binfo["steps"]
        if dinfo is not None:   # its plans are the answer's candidates (``verify`` compiles them)
            info["core_descent"] = {k: v for k, v in dinfo.items() if k != "plans"}
            info["candidates"] = dinfo["plans"][-CANDIDATES:]
        bc, sc = evaluate(problem, bisect), evaluate(problem, strategies)
        if (bc.peak_memory_bytes, bc.total) < (sc.peak_memory_bytes, sc.total):   # the MIP's plan is worse
            strategies, sc = bisect, bc
            info.update(objective=float(bc.peak_memory_bytes), source="bisection")
        if info.get("bound") is None or not np.isfinite(info["bound"]):   # killed: the copy-free least peak
            info["bound"] = node_min_peak(problem)                         # bounds every plan's peak
        info["gap"] = max(sc.peak_memory_bytes - info["bound"], 0.0) / max(sc.peak_memory_bytes, 1e-300)
    if seeded:
        strategies, info = keep_best(problem, strategies, info, seeds_of(kw), max_step_time_s)
        info["seeds"] = seed_info
    if bisect is not None and lns > 0:   # the best plan so far, by the peak LNS until the limit
        strategies, info = lns_after(problem, strategies, info, float(max_step_time_s), t0 + limit_s)
    if progress is not None:
        c = evaluate(problem, strategies)
        progress(f"ilp ({info.get('status')}): {c.total:.10g} ({time.perf_counter() - t0:.1f}s, "
                 f"peak {c.peak_memory_bytes:.0f} B)")
    return strategies, info


def _core_step(problem: Problem, seconds: float, seeds, policy_seed):
    """``core_descent``'s step: the capped core's least-time plan under ``problem.usage_limit``, or None."""
    try:
        plan, _ = solve_capped_time(problem, seconds, time.perf_counter(), initial_plans=seeds,
                                    policy_seed=policy_seed)
    except (RuntimeError, ValueError):   # nothing fits the cap in time
        return None
    return plan if evaluate(problem, plan).feasible else None


def seeds_of(kw: dict) -> list[list[int]]:
    """The plans in ``initial_plan`` / ``initial_plans`` of a ``solve_ilp`` keyword dict."""
    plans = ([] if kw.get("initial_plan") is None else [kw["initial_plan"]]) + list(kw.get("initial_plans") or [])
    return [list(getattr(p, "strategies", p)) for p in plans]


def best_seed_plan(problem: Problem, objective: str, max_step_time_s, seeds, why: str, t0: float,
                   incumbents=()):
    """The best of ``seeds`` and ``incumbents`` (the plans the stopped child found) for
    ``objective`` among those that fit the cap (``problem.usage_limit``) and the step-time bound,
    as ``solve_exact``'s answer when the guarded ILP was stopped: status "killed", no bound, source
    "incumbent" or "seed". RuntimeError (with ``why``) when none fits."""
    value = {"memory": lambda c: c.peak_memory_bytes,
             "redundancy": lambda c: c.redundant_memory_bytes}.get(objective, lambda c: c.total)
    found = [list(p) for p in incumbents]
    plan = best_seed(problem, found + list(seeds), problem.usage_limit, max_step_time_s, lambda c: (value(c), c.total))
    if plan is None:
        raise RuntimeError(f"{why}; no seed plan fits")
    return plan, {"status": "killed", "objective": float(value(evaluate(problem, plan))), "bound": None, "gap": None,
                  "source": "incumbent" if list(plan) in found else "seed", "objective_name": objective, "wall_s": time.perf_counter() - t0, "note": why}


def solve_capped_time(problem: Problem, time_limit_s: float, t0: float, initial_plan=None, initial_plans=None,
                      threads=None, progress=None, policy_seed=None) -> tuple[list[int], dict]:
    """Time objective under a memory cap (``problem.usage_limit``) that can bind:
    ``solvers.capped.solve_guarded`` seeded with the given plans, replicated (traced problems) and
    the baselines when replication does not fit; never worse than any of them (nor than BP or the
    search inside). With ``policy_seed``, ``time_limit_s`` >= ``POLICY_SEED_MIN_S`` and a graph the core's MILP
    holds (on bigger ones the planner takes most of the limit: its raw decode 26 s, its search 170 s on gpt 7b
    h100-2x8 at 58.6 GB, session 25), the policy's plan is a seed (without it unet tiny lost to the policy by up to 1.29x in bench_capped s6, where the
    repair of every other start stalled on copies that a move makes live; with copy groups on a busy
    machine it is the planner's raw decode, ``POLICY_SEED_SEARCH``, so the answer is never worse than
    that, not than ``method="policy"``'s full search: unet tiny h100-2x8 at 50 %, 1.022x in s20a_ab3),
    computed in a forked child (``policy_seed.prime()``, if any, runs here
    first). On a busy machine the core waits for it up to ``POLICY_SEED_SHARE`` of the limit (then it
    is an ordinary seed, ``POLICY_SKIPS_BP``); with an idle core (``_beside``), or when it is not done
    by then, it runs beside the core: a candidate answer when it arrives in time, and handed to the
    core, whose later phases (the Lagrangian's target and representatives, the union, the MILP, LNS)
    start from it when it is the best; a planner still running at the limit is killed and its plan
    lost. Without fork it runs first, inline, unbounded. The other seeds' time counts against the limit. ``progress(msg)``: the core's phase log. Falls back to the guarded ``solve_ilp`` in the time left (for its
    infeasibility report) when no plan fits."""
    seeds = seeds_of({"initial_plan": initial_plan, "initial_plans": initial_plans})
    late, config = None, TRACED
    if policy_seed is not None and time_limit_s >= POLICY_SEED_MIN_S and milp_ok(problem):
        prime = getattr(policy_seed, "prime", lambda: None)   # what must not run in a forked child
        beside = _beside()
        full, then = policy_seed, False
        if beside and hasattr(full, "limited"):   # the raw decode first, then the planner stopped before the core ends
            end, policy_seed, then = t0 + time_limit_s - BESIDE_MARGIN_S, getattr(full, "raw", full), True
            full = (lambda q, f=full.limited: f(q, end - time.perf_counter()))
        elif not (POLICY_SEED_SEARCH or beside) and problem.edge_memory is not None:
            policy_seed = getattr(policy_seed, "raw", policy_seed)   # the raw decode (POLICY_SEED_SEARCH)
            then = POLICY_SEARCH_AFTER_RAW and policy_seed is not full
        if hasattr(os, "fork"):      # in a forked child: beside the core, or first for at most a share
            prime()
            late = start_child(lambda send: _send_raw_then_plan(send, policy_seed, full if then else None, problem))
            pol = None
            if not beside:
                pol, running = _await_seed(late, POLICY_SEED_SHARE * time_limit_s - (time.perf_counter() - t0),
                                           problem, progress, keep=then)
                late = late if running else None
        else:
            pol = _policy_plan_or_none(policy_seed, problem, progress)
        seeds[:0] = [] if pol is None else [pol]
        if pol is not None and POLICY_SKIPS_BP and problem.edge_memory is not None:
            config = replace(TRACED, bp_share=0.0, bp_improve_s=0.0)
    if problem.meta is not None:
        replicated = [0] * problem.num_nodes
        seeds.append(replicated)
        if evaluate(problem, replicated).peak_memory_bytes > problem.usage_limit:
            # the rules' plans; their own ILP only on graphs too big for the core's MILP (gpt 7b h100-2x8 at 80 GiB:
            # megatron 0.4101 -> 0.3489 s a step, 1.5 % over the optimum, in 4.2 s; the core's search alone got 0.3508)
            seeds += baseline_seeds(problem, use_ilp=not milp_ok(problem))
    left = max(3.0, time_limit_s - (time.perf_counter() - t0))
    r = solve_guarded(problem, left, seeds=seeds, threads=threads, relax_cap=True, config=config, progress=progress,
                      late=late)
    if r.plan is None:     # the time left, not ``left`` again (that ran 72 s of a 60 s limit), guarded: an
        # unguarded 0.5 s fallback ran 19 s (vit tiny cpu-2x4 at cap 731,651 B, load 8.7: 79.8 s of 60)
        rest = time_limit_s - (time.perf_counter() - t0)
        why = f"no plan under the memory cap {problem.usage_limit:.6g} B found within {time_limit_s:g} s ({r.status})"
        if rest - 1.0 < 0.5:     # the guard may take its 1 s of grace: never past the limit (61.1 s of 60, vit base)
            raise RuntimeError(f"{why}; raise time_limit_s or the cap")
        try:
            return solve_ilp_guarded(problem, objective="time", time_limit_s=rest - 1.0, grace_s=1.0)[0], {}
        except SolveOverrun as exc:
            raise RuntimeError(f"{why}; {exc}") from exc
    info = dict(r.milp_info.to_dict()) if r.milp_info is not None else {}
    info.update({"status": r.status, "objective": r.cost, "bound": r.bound if r.gap is not None else None,
                 "gap": r.gap, "wall_s": time.perf_counter() - t0, "source": r.source,
                 "objective_name": "time"})
    return r.plan, info


def _beside() -> bool:
    """Run the policy seed beside the core (``POLICY_SEED_BESIDE``): with fork and an idle core."""
    return POLICY_SEED_BESIDE and hasattr(os, "fork") and idle_cores() >= 1.0


def _await_seed(late, wait_s: float, problem: Problem, progress=None, keep: bool = False):
    """(plan or None, still running) of the policy seed's child (``_send_raw_then_plan``), waiting at most ``wait_s`` for its
    first message; reaped when finished (``keep``: one that sent a plan goes on), left to the caller if still running."""
    t = time.perf_counter()
    try:
        msg = late[1].recv() if late[1].poll(max(wait_s, 0.0)) else None
    except EOFError:           # the child died without a plan
        msg = ("none", "the planner's process ended without a plan")
    going = msg is None or (keep and msg[0] == "plan")
    if not going:
        stop_child(late[0])
    if progress:
        progress(f"policy seed: still running after {time.perf_counter() - t:.1f}s: beside the core" if msg is None
                 else _seed_line(problem, msg) + (": the planner's search goes on beside the core" if going else ""))
    return (msg[1] if msg is not None and msg[0] == "plan" else None), going


def _run_policy(policy_seed, problem: Problem) -> tuple:
    """("plan", plan as a list of ints, seconds) of ``policy_seed(problem)`` (a Plan or a list), or
    ("none", why) when the planner finds no plan that fits (ValueError): the core's own starts then."""
    t = time.perf_counter()
    try:
        pol = policy_seed(problem)
    except ValueError as exc:
        return ("none", str(exc))
    return ("plan", [int(x) for x in getattr(pol, "strategies", pol)], time.perf_counter() - t)


def _policy_plan_or_none(policy_seed, problem: Problem, progress=None):
    """``_run_policy`` inline: the plan, or None; said through ``progress``."""
    msg = _run_policy(policy_seed, problem)
    if progress:
        progress(_seed_line(problem, msg))
    return msg[1] if msg[0] == "plan" else None


def _seed_line(problem: Problem, msg) -> str:
    """The progress line of a ``_run_policy`` message."""
    return (f"policy seed: {evaluate(problem, msg[1]).total:.10g} ({msg[2]:.1f}s)" if msg[0] == "plan"
            else f"policy seed: none ({msg[1]})")


def _send_raw_then_plan(send, policy_seed, then, problem: Problem) -> None:
    """The policy seed's child (``start_child``): sends ``_run_policy``'s message (a "none"'s reason cut to 200
    characters); after a plan, ``then``'s too (``POLICY_SEARCH_AFTER_RAW``: the full planner after its raw decode)."""
    msg = _run_policy(policy_seed, problem)
    send.send(msg if msg[0] == "plan" else ("none", msg[1][:200]))
    if then is not None and msg[0] == "plan":
        msg = _run_policy(then, problem)
        send.send(msg if msg[0] == "plan" else ("none", msg[1][:200]))


def baseline_seeds(problem: Problem, use_ilp: bool = True) -> list:
    """The baseline plans of a traced problem, as seeds for the memory / redundancy objectives under
    a step-time bound (the ILP then never answers worse than the best baseline within the bound).
    Empty for problems without roles (IOPDDL). Costs about a second or two per baseline."""
    if problem.meta is None or not getattr(problem.meta, "roles", None):
        return []
    seeds = []
    for m in BASELINES:
        try:
            seeds.append(baseline_plan(problem, m, use_ilp, SEED_TIME_LIMIT_S))
        except (ValueError, RuntimeError):   # a rule that does not apply: skip that seed
            continue
    return seeds


def solve_baseline(problem: Problem, method: str) -> tuple[list[int], dict]:
    """One of ``solvers.baselines.METHODS``: (strategies, info); a rule does not aim at the cap."""
    return baseline_plan(problem, method), {"status": "rule", "gap": None}
