"""A lower bound of the capped time objective that sees the resharded copies: Lagrangian
relaxation of the memory rows, each relaxed problem solved by HiGHS.

``lagrangian_bound(problem, time_limit_s, upper=..., ref=...) -> LagrangeResult`` (bound, plans).

For prices λ_t >= 0 on the compressed time points t (``LocalCosts.times``) and any plan x that fits
(mem_t(x) <= cap at every t):

    time(x) >= time(x) + Σ_t λ_t (mem_t(x) - cap) >= time(x) + Σ_t λ_t (node_t(x) + low_t(x)) - cap Σ_t λ_t

where node_t(x) is the node usages live at t and low_t(x) <= copies_t(x) is a pairwise lower bound
of the live copies (below). The middle term is a pairwise problem with no memory rows (node costs
+ usage_i[s]·Σ_{t∈interval(i)} λ_t, edge costs + the copy terms): HiGHS's dual bound B(λ) on it,
reached or not, bounds its minimum, so L(λ) = B(λ) - cap·Σλ bounds the capped optimum from
below. λ = 0 is the uncapped bound.

Copies (``costmodel.edge_memory.CopyGroups``): a group's copy is live at t when *some* member
makes it live there (an OR, not pairwise). A lower bound charges each (group, t) to at most one
representative member (the OR is at least any one of its terms). A collective-made (*early*) copy
lives from the producer's step to its last active member's step: each grid point t of the group's
span goes to the highest-priority member whose step reaches t, which then charges bytes·λ_t when
active under an early producer strategy; the members' charged intervals are disjoint, so at most
one charges per (group, t). Priority: members active under the last relaxed plan, then under the
reference plan ``ref`` (the incumbent), then the latest step, so the last relaxed plan is charged
its copies exactly (``adapt``). Per (group, step) the *short* representative (same priority)
charges bytes·λ_step when active with any other producer strategy. Both are functions of the
(producer, consumer) strategy pair: an edge term (a new edge where the two share none). Any choice
of representatives gives a valid bound, so they may change from round to round. With one fixed
representative per group (the latest member; no ``ref``, no adapting) gpt tiny on
h100-2x8 at cap 1,947,600 B converged at L = 4.76e-4 (48 rounds); adapting reached 5.49e-4 in
40 s (the plan's 7.80e-4): at the converged prices the relaxed plans were 15-35 % over the cap,
their copies charged 262 of 623 KB at the peak.

λ moves by Polyak's subgradient step toward ``upper`` (the best known cost): λ += θ (upper - L) /
|h|² h, h_t = node_t(x) + low_t(x) - cap for the relaxed problem's plan x, θ halved after
``patience`` rounds without a better bound; a round whose MILP stops at its limit (its dual bound
is weak and its plan no minimiser), or gives no bound at all (gpt tiny h100-2x8 at the 75 % cap, load
6: the loop used to end there, 15 s before the deadline), steps no further: λ goes half way back to the
best prices and θ is halved. ``restart`` (default): a round whose L falls below the best by more than
the gap left (target - best) steps again from the best prices along the best round's subgradient at
half the step (gpt tiny h100-2x8, load 7-11: the first step from λ = 0 lands at L = -1.1e-3 with the
plan at 9.0e-4; without it unet tiny h100-2x8 at the 50 % cap stayed at round 7's bound for 19 rounds
after one such round and stopped with 200 s of its 240 s left in a 600 s solve, session 13). Every relaxed plan is returned as a candidate. ``deflect`` (default): after a round that
raised the bound, the step direction is h + β d, d the last direction, β = max(0, -1.5 h·d / |d|²)
(Camerini, Fratta and Maffioli's deflected subgradient), which damps the zig-zag of plain steps
between two price vectors; any λ >= 0 gives a valid bound, so the bound stays valid. Deflecting after
every round diverged on the 4-node hand case (tests/test_capped_copies.py: L fell to -200 with the
target 3 above the dual optimum 1.5), so a round that does not raise the bound steps plainly. Session
12, lagrangian_bound alone for 30 s at load 9-11, s11's best cost as the target, plain -> deflected:
gpt tiny h100-2x8 cap 1,947,600 B 3.837e-4 -> 4.631e-4 (5 rounds each), cap 3,289,744 B 2.501e-4
-> 2.557e-4 (17 / 25 rounds); unet tiny h100-2x8 cap 2,514,164 B 8.235e-4 -> 8.141e-4 (7 / 7
rounds: 1.1 % lower there); the hand case with early copies 0.749 -> 0.885 (the dual optimum 1.5 without).
``step="bundle"`` (``solvers.lagrange_bundle``, what ``shardgym.solve`` uses) picks the prices from every round's plan instead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from costmodel.problem import Problem, evaluate
from costmodel.profile import step_sum
from solvers.bp import bp_solve
from solvers.ilp import IlpConfig, solve_ilp
from solvers.lagrange_bundle import Bundle
from solvers.local.costs import LocalCosts
from solvers.local.polish import polish


@dataclass(frozen=True)
class LagrangeResult:
    """``bound`` (-inf when no relaxed problem gave one), ``rounds`` solved, ``plans`` (the
    relaxed problems' plans, candidates for the caller), ``lam`` (the best bound's prices)."""
    bound: float
    rounds: int
    plans: list = field(default_factory=list)
    lam: np.ndarray | None = None


class CopyTerms:
    """The pairwise copy lower bound of a Problem on the time grid ``times``: per member the
    flat positions its term occupies in the relaxed problem's edge costs and the two unit
    matrices (early, short) there."""

    def __init__(self, problem: Problem, times: np.ndarray):
        em = problem.edge_memory
        self.em = em
        k = problem.num_strategies.astype(np.int64)
        g_of = em.member_group
        self.g_of = g_of
        self.u = em.group_node[g_of].astype(np.int64)
        self.v = em.member_node.astype(np.int64)
        self.lo_e = np.searchsorted(times, em.group_time[g_of])
        self.hi = np.searchsorted(times, em.member_time + 1)
        self.at = np.searchsorted(times, em.member_time)
        self.ok_e = em.member_time >= em.group_time[g_of]
        index = {}
        for e, (a, b) in enumerate(problem.edges.tolist()):
            index.setdefault((a, b), (e, False))
            index.setdefault((b, a), (e, True))
        eoff = problem.edge_offsets.astype(np.int64)
        new_edges, new_sizes, new_base, pos, ev, sv, size = [], [], [], [], [], [], []
        n_flat = int(eoff[-1])
        for m in range(len(self.v)):
            u, v = int(self.u[m]), int(self.v[m])
            want = em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
            free = em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]]
            g = int(g_of[m])
            a, b = int(em.early_offsets[g]), int(em.early_offsets[g + 1])
            early = em.group_early[a:b] if b > a else np.zeros(int(k[u]), dtype=bool)
            byt = float(em.group_bytes[g])
            E = byt * np.outer(~free & early, want)          # (k_u, k_v)
            S = byt * np.outer(~free & ~early, want)
            if (u, v) not in index:
                index[(u, v)] = (len(problem.edges) + len(new_edges), False)
                index[(v, u)] = (len(problem.edges) + len(new_edges), True)
                new_edges.append((u, v))
                new_base.append(n_flat + sum(new_sizes[-1:]) + (new_base[-1] - n_flat if new_base else 0))
                new_sizes.append(int(k[u] * k[v]))
            e, flip = index[(u, v)]
            if flip:
                E, S = E.T, S.T
            base = int(eoff[e]) if e < len(problem.edges) else new_base[e - len(problem.edges)]
            # only the entries a price can charge: the two terms are byte-weighted outer products of masks,
            # mostly 0 (gpt 7b h100-2x8: 3.5 M of 86.5 M entries; ``relaxed_problem`` spread the prices over all
            # of them, 5.2 s a Lagrangian round at load 3, now 0.08 s); the dropped A·0 + B·0 = 0.0 added
            # nothing, so the relaxed costs are the same to the bit
            E, S = E.ravel(), S.ravel()
            nz = np.flatnonzero((E != 0) | (S != 0))
            pos.append(base + nz)
            ev.append(E[nz])
            sv.append(S[nz])
            size.append(len(nz))
        self.new_edges = np.asarray(new_edges, dtype=np.int64).reshape(-1, 2)
        self.new_sizes = np.asarray(new_sizes, dtype=np.int64)
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dtype=dt))
        self.pos, self.ev, self.sv = cat(pos, np.int64), cat(ev, float), cat(sv, float)
        self.member = np.repeat(np.arange(len(size), dtype=np.int64), np.asarray(size, dtype=np.int64))   # each entry's

    def representatives(self, *plans) -> tuple[np.ndarray, np.ndarray]:
        """(early start, short rep): per member the grid index from which its early term charges
        (it charges [start, its step + 1); start >= that end: nothing), and the short
        representatives' mask (see the module docstring). Priority: members active under the
        first plan of ``plans`` (None entries skipped) first, then under the next, ..., then the
        latest step; each grid point of a group's span goes to the highest-priority member whose
        step reaches it, so the members' charged intervals are disjoint within a group."""
        M = len(self.v)
        acts = [self.em.active(np.asarray(s, dtype=np.int64)) for s in plans if s is not None]
        hi = self.hi
        start = hi.copy()
        cand = np.nonzero(self.ok_e)[0]
        if len(cand):
            # lexsort: the last key is primary (group), then priority (active, ...), then the latest step
            keys = [-self.em.member_time[cand]] + [~a[cand] for a in reversed(acts)] + [self.g_of[cand]]
            o = cand[np.lexsort(keys)]
            g, h = self.g_of[o].astype(np.int64), hi[o].astype(np.int64)
            span = int(hi.max()) + 2 if M else 1
            run = np.maximum.accumulate(g * span + h)            # running max of hi within a group
            first = np.r_[True, g[1:] != g[:-1]]
            prev = np.where(first, 0, np.r_[0, run[:-1]] - g * span)
            start[o] = np.maximum(self.lo_e[o], prev)
        keys = [~a for a in reversed(acts)] + [self.em.member_time, self.g_of]
        o = np.lexsort(keys)
        sr = np.zeros(M, dtype=bool)
        if M:
            first = np.r_[True, (self.g_of[o][1:] != self.g_of[o][:-1]) | (self.em.member_time[o][1:] != self.em.member_time[o][:-1])]
            sr[o[first]] = True
        return start, sr

    def prices(self, lam: np.ndarray, start: np.ndarray, sr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per member: the λ-sum its early and its short term charge per byte (0 off the reps)."""
        P = np.concatenate([[0.0], np.cumsum(lam)])
        return np.maximum(P[self.hi] - P[np.minimum(start, self.hi)], 0.0), np.where(sr, P[self.hi] - P[self.at], 0.0)

    def low_profile(self, s: np.ndarray, start: np.ndarray, sr: np.ndarray, length: int) -> np.ndarray:
        """low_t(s): the representatives' copies live at each grid point under plan s."""
        em = self.em
        act = em.active(s)
        early = em._early_all(s)[self.g_of]
        b = em.group_bytes[self.g_of]
        e = act & early & (start < self.hi)
        t = act & sr & ~early
        return (step_sum(start[e], self.hi[e], b[e], length)
                + step_sum(self.at[t], self.hi[t], b[t], length))


def relaxed_problem(problem: Problem, lc: LocalCosts, terms: CopyTerms | None, lam: np.ndarray,
                    er=None, sr=None) -> Problem:
    """The pairwise problem at prices ``lam`` (no limit, no copy groups; its minimum minus
    cap·Σλ bounds the capped optimum)."""
    nc = problem.node_costs + lc.live_usage * lc.interval_sums(lam)[lc.node_of]
    if terms is None:
        return replace(problem, node_costs=nc, usage_limit=None, edge_memory=None)
    ec = np.concatenate([problem.edge_costs, np.zeros(int(terms.new_sizes.sum()))])
    A, B = terms.prices(lam, er, sr)
    np.add.at(ec, terms.pos, A[terms.member] * terms.ev + B[terms.member] * terms.sv)
    offs = np.concatenate([problem.edge_offsets, problem.edge_offsets[-1] + np.cumsum(terms.new_sizes)])
    return replace(problem, node_costs=nc, edges=np.concatenate([problem.edges, terms.new_edges]).astype(np.int64),
                   edge_offsets=offs.astype(np.int64), edge_costs=ec, edge_comm_bytes=None, usage_limit=None,
                   edge_memory=None, meta=None)


def lagrangian_bound(problem: Problem, time_limit_s: float, upper, ref=None, lam0=None,
                     threads: int = 2, round_s: float | None = None, patience: int = 2,
                     progress=None, on_plan=None, first=None, adapt: bool = True,
                     deflect: bool = True, restart: bool = True, max_rounds: int | None = None,
                     round_nodes: int | None = None, relaxed_solver=None, step: str = "polyak",
                     repeat_stop: int | None = None) -> LagrangeResult:
    """Subgradient ascent on L(λ) for at most ``time_limit_s`` (the module docstring). ``upper``:
    the best known cost of a fitting plan (the Polyak target; a float, or a function returning
    the current one); ``on_plan(plan)``: called with each relaxed plan; ``ref``: a plan whose active copy
    members pick the representatives (the incumbent); ``lam0``: start prices (default 0: the first
    round is the uncapped bound); ``repeat_stop``: stop after this many rounds in a row that repeat an
    earlier round's plan without raising L (random 2,000 nodes, cap 0.3: L peaks at round 7, rounds 10
    and 12-16 repeat 9 and 11); ``round_s``: each relaxed MILP's limit (default a quarter of the
    budget, at least 1 s); ``first``: (bound, plan) of the problem without its cap, when the caller
    has solved it (the round at λ = 0, so it is not solved again; ignored with ``lam0``); ``adapt``:
    each round's representatives put the previous relaxed plan's active members first; ``restart``: a
    round whose L falls below the best by more than the gap left (target - best) steps again from the
    best prices along the best round's subgradient at half the step size (the module docstring)."""
    t0 = time.perf_counter()
    deadline = t0 + float(time_limit_s)
    say = progress or (lambda msg: None)
    cap = problem.usage_limit
    lc = LocalCosts(problem)
    T = len(lc.times)
    lam = np.zeros(T) if lam0 is None else np.asarray(lam0, dtype=float).copy()
    if cap is None:
        lam[:] = 0.0
    terms = CopyTerms(problem, lc.times) if problem.edge_memory is not None and len(problem.edge_memory.member_node) else None
    er, sr = terms.representatives(ref) if terms is not None else (None, None)
    round_s = round_s or max(0.25 * time_limit_s, 1.0)
    config = IlpConfig.node_limited(round_nodes)
    best, best_lam, rounds, theta, stall, plans = -np.inf, lam.copy(), 0, 1.0, 0, []
    seen, repeats, repeated = set(), 0, False    # ``repeat_stop``: the plans so far, rounds in a row repeating one
    d = None            # the last step's direction (``deflect``)
    best_h = None       # the subgradient at best_lam (``restart``)
    pending = first if lam0 is None and first is not None and np.isfinite(first[0]) else None
    bundle = None       # ``step="bundle"``: the cutting-plane model (made at the first bound)
    reps = centre_reps = 0   # ... which representatives are current, and were when the centre was solved
    best_at_restart = -np.inf
    low = (lambda x: terms.low_profile(x, er, sr, T)) if terms is not None else (lambda x: 0.0)
    while time.perf_counter() + 0.5 < deadline and (max_rounds is None or rounds < max_rounds):
        if pending is not None:       # λ = 0: the caller's uncapped solve
            qb, x, pending, exact = float(pending[0]), pending[1], None, True
        else:
            q = relaxed_problem(problem, lc, terms, lam, er, sr)
            try:
                if relaxed_solver is not None:
                    x, qb, exact = relaxed_solver(q, ref)
                    info = None
                else:
                    x, info = solve_ilp(q, time_limit_s=max(min(round_s, deadline - time.perf_counter()), 0.5),
                                        threads=threads, mip_rel_gap=1e-5, initial_plan=ref, config=config)
            except (RuntimeError, ValueError) as exc:
                say(f"lagrange: relaxed milp gave nothing: {exc}")
                qb = np.nan       # no bound: backed off below, as a round stopped at its limit
            else:
                rounds += 1
                if info is not None:
                    qb, exact = float(info.bound), info.status == "optimal"
                plans.append([int(a) for a in x])
                repeated = (key := tuple(plans[-1])) in seen
                seen.add(key)
                if on_plan is not None:
                    on_plan(plans[-1])
        if not np.isfinite(qb):     # no bound (the round failed, or had no time on a loaded machine)
            if bundle is not None:     # a null step: nearer the centre
                lam = _bundle_back(bundle, low, best, say)
                if lam is None:
                    break
                continue
            if not np.any(lam != best_lam):
                break
            lam, theta, d = 0.5 * (lam + best_lam), theta / 2, None
            continue
        L = qb - (0.0 if cap is None else float(cap) * float(lam.sum()))
        x = np.asarray(x, dtype=np.int64)
        up = float(upper()) if callable(upper) else float(upper)
        repeats, repeated = (repeats + 1 if repeated and not L > best else 0), False
        if L > best:
            best, best_lam, stall = L, lam.copy(), 0
        else:
            stall += 1
            if stall >= patience:
                theta, stall = theta / 2, 0
        say(f"lagrange[{rounds}]: L={L:.10g} best={best:.10g} ({time.perf_counter() - t0:.1f}s)")
        if repeat_stop is not None and repeats >= repeat_stop:
            break
        if cap is None or L >= up - 1e-9 * abs(up):
            break
        if step == "bundle":
            target = up if np.isfinite(up) else best + 0.1 * max(abs(best), 1e-12)
            if bundle is None:
                bundle = Bundle(float(cap), target if target > 0 else max(abs(L), 1e-12))
            bundle.add(evaluate(problem, x).total, lc.profile_of(lc.live_usage[lc.offs[:-1] + x]), x)
            if bundle.result(lam, L) == "serious":
                centre_reps = reps
            if terms is not None and adapt:     # as the subgradient rule: x's active members first
                er, sr = terms.representatives(x, ref)
                reps += 1
            try:
                lam, rise = bundle.next(low, target, max(min(5.0, deadline - time.perf_counter() - 0.5), 0.1))
            except (RuntimeError, ValueError) as exc:
                say(f"lagrange: bundle step failed: {exc}")
                break
            if rise <= 1e-6 * max(abs(best), 1e-300):     # the model's optimum is the centre
                if centre_reps == reps or best <= best_at_restart:   # ... at these copy terms (or no better
                    break                                              # since the last restart): converged
                # the centre's bound was for other copy terms (``adapt``): solve it again under these
                lam, centre_reps, best_at_restart = bundle.restart(), reps, best
            continue
        if not exact:     # too hard at these prices to solve in a round: back half way to the best, smaller steps
            theta, d = theta / 2, None
            if np.any(lam != best_lam):
                lam = 0.5 * (lam + best_lam)
                continue
            # these prices are the best ones: going back re-solved the same relaxed MILP, as hard (gpt tiny
            # h100-2x8 at cap 1,947,600 B, load 8.5: rounds 3 and 4 repeated round 2's bound, 7.3 s of 14.5),
            # so step from its (not minimal) plan's subgradient instead, at half the step size
        target = up if np.isfinite(up) else L + 0.1 * max(abs(L), 1e-12)
        if restart and best_h is not None and L < best - (target - best) and np.any(lam != best_lam):
            # overshot: these prices lost more than the gap left; from the best ones at half the step
            theta, d, stall = theta / 2, None, 0
            lam = np.maximum(best_lam + theta * (target - best) / float(best_h @ best_h) * best_h, 0.0)
            continue
        h = lc.profile_of(lc.live_usage[lc.offs[:-1] + x]) - float(cap)
        if terms is not None:
            h = h + terms.low_profile(x, er, sr, T)
            if adapt:     # the next rounds' representatives: x's active members first (any choice is valid)
                er, sr = terms.representatives(x, ref)
        h = np.where((lam > 0) | (h > 0), h, 0.0)     # no step below λ = 0
        if L >= best and float(h @ h) > 0:
            best_h = h.copy()
        if deflect and d is not None and stall == 0 and float(d @ d) > 0:   # after a step that raised L only
            h = h + max(0.0, -1.5 * float(h @ d) / float(d @ d)) * d
        d = h
        nrm = float(h @ h)
        if nrm <= 0 or theta < 1e-3:
            break
        lam = np.maximum(lam + theta * (target - L) / nrm * h, 0.0)
    return LagrangeResult(best, rounds, plans, best_lam)


def _bundle_back(bundle: Bundle, low, best: float, say):
    """After a round with no bound (``step="bundle"``): prices nearer the centre (u doubled), or
    None when the model's QP fails too."""
    bundle.u *= 2.0
    try:
        return bundle.next(low, best + 0.1 * abs(best), 1.0)[0]
    except (RuntimeError, ValueError) as exc:
        say(f"lagrange: bundle step failed: {exc}")
        return None


def bp_relaxed(rounds: int = 30, polish_moves: int = 64):
    """A ``relaxed_solver`` for ``lagrangian_bound`` without HiGHS: min-sum BP (``solvers.bp.bp_solve``,
    ``rounds``) on the relaxed problem, then ``solvers.local.polish`` on it (forest moves
    ``polish_moves``, its wall-clock limit a safety cap only); the bound is BP's tree lower bound
    (valid, weaker than HiGHS's dual bound), the plan a local optimum, not a minimiser, so its
    subgradient steps are heuristic. Deterministic: no wall-clock budget shapes the answer.
    Why: on meshgraphnet tiny @ tpu-4x4 cap 0.5 one relaxed MILP (819 nodes, copy terms: 26,124
    columns) took 10.7 s to its optimum at load 2.4, most of it the root's cuts and sub-MIPs, and
    its node limit does not bound that; BP + polish took 0.2-0.3 s for a plan 1.5-9 % above it."""
    def solve(q, ref):
        r = bp_solve(q, rounds=rounds, bound="end")
        lqc = LocalCosts(q)
        x = polish(q, r.plan, time_limit_s=SAFE_POLISH_S, lc=lqc, tree_moves=polish_moves)
        return [int(a) for a in x], float(r.lower_bound), True
    return solve


#: ``bp_relaxed``'s polish wall-clock safety cap (a capped relaxed problem polishes in 0.1-0.3 s)
SAFE_POLISH_S = 10.0


def union_plan(problem: Problem, plans, time_limit_s: float, start=None, threads: int = 2,
               max_nodes: int | None = None):
    """The capped MILP restricted to the strategies the ``plans`` use (node i: the union of their
    strategies at i; ``solve_ilp``'s ``allowed``, the resharded copies priced exactly): a plan of
    ``problem`` at least as cheap as ``start`` (a fitting plan among them), or None when HiGHS gives
    none in time. The Lagrangian rounds' plans jump between a cheap one over the cap and a dearer one
    under it, at a coarse decision (gpt tiny h100-2x8 at cap 3,472,048 B: 1.82e-4 at 1.12x the cap,
    2.88e-4 at 0.91x; the memory repair of the former fails in 2 s); the union's MILP picks per node
    between them: 2.45e-4 in 12 s there (results/s14c_capped_gap). Its bound holds for the restriction only.
    ``max_nodes``: HiGHS's ``mip_max_nodes`` (a deterministic budget; with it and a ``time_limit_s``
    that does not stop the MILP, the answer does not depend on the machine's load)."""
    k = problem.num_strategies
    P = np.asarray([list(s) for s in plans if s is not None], dtype=np.int64).reshape(-1, problem.num_nodes)
    if not len(P) or bool((P >= k).any()) or bool((P < 0).any()):
        return None
    mask = np.zeros(len(problem.node_costs), dtype=bool)
    mask[(problem.strategy_offsets[:-1] + P).ravel()] = True
    try:
        x, _ = solve_ilp(problem, time_limit_s=time_limit_s, initial_plan=start, threads=threads, relax_cap=False,
                         allowed=mask, config=IlpConfig.node_limited(max_nodes))
    except (RuntimeError, ValueError):
        return None
    return [int(a) for a in x]
