"""Memory-capped solving with a cost-function-network solver (toulbar2, the optional ``pytoulbar2``
package): the pairwise cost problem is a weighted CSP, and the memory limit an adaptive soft
penalty (the IOPDDL contest winner's approach).

``cfn_solve(problem, time_limit_s, starts=(), on_plan=None, progress=None) -> CFNResult`` (the best
feasible plan, its cost, a lower bound, rounds run). ``available()`` says whether pytoulbar2 imports.

* **Model**: the problem is pruned and its permutation ties contracted exactly as the
  large-instance search does (``solvers.local.prepare``: ``Pruning``, ``Contraction``; IOPDDL A goes
  from 34,932 nodes to 285 with a choice). One toulbar2 variable per component; unary cost
  functions are the component costs, binary ones the edge matrices. Each function's minimum is
  kept aside as a constant, so what toulbar2 sees is ≥ 0. Costs are integers in toulbar2: they are
  multiplied by ``scale`` (1 when they are integers already, as in the contest files; otherwise so
  that the lowest-usage plan costs about 1e9 units) and rounded **down**, so toulbar2's dual bound
  stays a valid lower bound of the real costs. Forbidden entries (≥ ``FORBIDDEN_COST``) and anything above
  ``TOP_UNITS`` are clipped to ``TOP_UNITS`` (lowering a cost keeps the bound valid).
* **Memory** as a Lagrangian penalty: prices λ_t ≥ 0 per compressed time point add
  usage_i(s)·Σ_{t∈interval(i)} λ_t to the unary costs. A round builds the model at the current
  prices and runs toulbar2's branch and bound (HBFS) for a slice of the time; its plan is priced on
  the real problem: if it fits it is a candidate and λ decays by ``DOWN``; if not, the search's
  greedy repair (``solvers.local.repair_tied``) is tried and λ grows at the overloaded points only
  (λ_t ← max(UP·λ_t, base·10·overload_t), base = median cost / median usage; as in
  ``search._lagrangian_rounds``). Each round's initial upper bound is the priced cost of the best
  plan so far, so toulbar2 only looks for plans that beat it at these prices.
* **Lower bound** (weak duality): for any plan x that fits, c(x) ≥ c(x) + Σ_t λ_t (live_t(x) − cap)
  ≥ min_y priced(y) − cap·Σλ ≥ dual/scale + constants − cap·Σλ, whatever λ; the best over the rounds
  is kept, and never below the unpriced floor (every table at its minimum, λ = 0). A round's own
  bound can be far below zero: toulbar2 stopped at its limit returns a dual bound near its
  preprocessing's, while cap·Σλ grows with λ (×2.5 a round at the overloaded points): unet tiny
  h100-2x8 gave −2.6e5 against plans of ~1e-3 s before the floor was kept. It assumes the optimum
  is free of forbidden entries (the pruning's premise) and is dropped (−inf) when the best plan
  found is not. With resharded copies (``Problem.edge_memory``)
  live_t counts node usages only, a relaxation of the copy-priced limit (copies only add memory),
  so the bound still holds; the prices react to the profile with copies, a round's plan whose
  copies break the limit is repaired with them priced (``solvers.local.fit_with_copies``), and only
  plans that fit with their copies are kept.

Time: each round runs in its own forked process (toulbar2 keeps global state), killed
``ROUND_MARGIN_S`` after the deadline, so an overrun costs only the round in flight. toulbar2's
own limit is whole CPU seconds; the round converts its wall-time slice with the CPU share the
process got while building the model (under a load of 5 on 2 cores a CPU second took ~2.5 s).
A slice is a quarter of the budget; a round that times out with no plan doubles it (IOPDDL S takes
~25 s a round under load: pruning and preprocessing), or ends the rounds (``give_up_empty``). Plans are streamed through ``on_plan`` as
they are found, so the caller's watchdog (``capped.solve_guarded``) keeps them.

Contest-size graphs (``give_up_empty``, ``stream``), where the search polishes toulbar2's plan and
the machine may be busy: the CPU the process gets decides, not the wall clock. On S under a load
of ~5 on 2 cores (8-17 CPU s in the minute) the wall-scaled limit gave toulbar2 ~1 CPU s, never
enough for its first plan (6.5 CPU s + ~1 s to post 2.9e6 table entries), so the search started
from the warm-up's 3.50e9 (score 0.60-0.67, results/s17d_base*). Now (1) a round's limit is its
slice in CPU seconds, however long that takes in wall time, and toulbar2 writes each plan it
finds (``showSolutions``) to a file, so a round killed at the deadline still gives its last
plan (``cfn_fork.streamed``); (2) before the first round, the CPU share measured over the model and the
warm-up must pay for ``CPU_PER_ENTRY_S`` per table entry by the deadline, else no round runs
and the search gets the time (a round that cannot finish only starves it); (3) a round that
used its whole slice without a better plan ends the rounds (S idle: rounds 2-4 gave nothing in
27 s; A and M's rounds end on their own in under a second and are not cut).
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem
from solvers.cfn_fork import forked, streamed
from solvers.local import LocalCosts, best_response, fit_with_copies, prepare, repair_tied
from solvers.search import ICM_SWEEPS

TOP_UNITS = 1e14          # forbidden / clipped cost in toulbar2's integer units
TARGET_UNITS = 1e9        # non-integer costs: the lowest-usage plan costs about this many units
UP, DOWN = 2.5, 0.9       # price update factors (as in search._lagrangian_rounds)
WARM_SHARE = 0.1          # of the budget at most for the best-response price warm-up
ROUND_MARGIN_S = 0.5      # a round's process is killed this long after the deadline
CPU_PER_ENTRY_S = 3e-6    # streamed rounds: CPU seconds a first plan takes per table entry (S, 2.9e6 entries:
#                           toulbar2's first plan after 6.5 CPU s + ~1 s to post the model; M, 1.9e6: ~5 s)
MAX_VARS = 20_000         # no rounds above this many contracted variables with a choice: a round
#                           on synth-65k (49,917) gave no plan in 25 s; M (5,404) gets one in ~13 s


@dataclass(frozen=True)
class CFNResult:
    """``plan`` (None if no round found one that fits), its ``cost``, the best Lagrangian
    ``lower_bound`` (−inf without one), ``rounds`` run and ``wall_s``."""
    plan: list[int] | None
    cost: float
    lower_bound: float
    rounds: int
    wall_s: float


def available() -> bool:
    try:
        import pytoulbar2  # noqa: F401
    except ImportError:
        return False
    return True


class _Model:
    """The contracted graph's cost tables, grouped by shape for toulbar2's vectorised posting."""

    def __init__(self, gc: LocalCosts, scale: float):
        self.gc, self.scale = gc, scale
        k = gc.k
        self.free = k > 1                                   # variables with a choice
        self.var = np.cumsum(self.free) - 1                 # component -> toulbar2 variable
        eu, ev = gc.eu, gc.ev
        both = self.free[eu] & self.free[ev]
        # edges with a single-strategy end fold into the other end's unary cost (fixed per model)
        self.fold = np.zeros(len(gc.cost))
        self.const = 0.0
        for e in np.nonzero(~both)[0].tolist():
            M = gc.matrix(e)
            u, v = int(eu[e]), int(ev[e])
            if self.free[u]:
                self.fold[gc.offs[u]:gc.offs[u + 1]] += M[:, 0]
            elif self.free[v]:
                self.fold[gc.offs[v]:gc.offs[v + 1]] += M[0, :]
            else:
                self.const += float(M[0, 0])
        self.pairs = []                                     # (scopes, tables in units, constant)
        be = np.nonzero(both)[0]
        shapes = np.stack([k[eu[be]], k[ev[be]]], axis=1) if len(be) else np.zeros((0, 2), int)
        for shape in np.unique(shapes, axis=0):
            sel = be[(shapes == shape).all(axis=1)]
            size = int(shape[0] * shape[1])
            idx = gc.eoff[sel][:, None] + np.arange(size)[None, :]
            raw = np.minimum(gc.ec[idx], FORBIDDEN_COST)
            low = raw.min(axis=1, keepdims=True)
            self.const += float(low.sum())
            units = self._units(raw - low).reshape(len(sel), int(shape[0]), int(shape[1]))
            scopes = np.stack([self.var[eu[sel]], self.var[ev[sel]]], axis=1).astype(np.int64)
            self.pairs.append((scopes, units))

    def entries(self) -> int:
        """Cost table entries toulbar2 gets (unary and binary)."""
        return int(self.gc.k[self.free].sum()) + sum(int(u.size) for _, u in self.pairs)

    def _units(self, x: np.ndarray) -> np.ndarray:
        return np.minimum(np.floor(x * self.scale), TOP_UNITS)

    def floor_bound(self, unary: np.ndarray) -> float:
        """Every table at its minimum: a lower bound of the model at these unary costs (real units)."""
        c = np.minimum(unary + self.fold, FORBIDDEN_COST)
        return self.const + float(np.minimum.reduceat(c, self.gc.offs[:-1]).sum())

    def solve(self, unary: np.ndarray, wall_s: float, ub: float | None, stream: str | None = None):
        """toulbar2 at these unary costs for about ``wall_s`` seconds of wall time: (component plan
        or None, dual bound in real cost units including the constants, whether it timed out).
        toulbar2's limit counts CPU seconds; on a shared machine a process gets a fraction of a
        core, so the limit is the wall time left after building the model times the CPU share
        this process got while building it (at least 1 s). With ``stream`` (a file name; in a
        forked child only: it takes over fd 1) the limit is the slice itself in CPU seconds, a
        loaded machine stretches the round in wall time, and every plan toulbar2 finds is written
        to that file as it is found (``cfn_fork.streamed`` reads the last one when the round is killed)."""
        import pytoulbar2
        w0, c0 = time.perf_counter(), time.process_time()
        gc = self.gc
        c = np.minimum(unary + self.fold, FORBIDDEN_COST)
        low = np.minimum.reduceat(c, gc.offs[:-1])
        const = self.const + float(low.sum())
        rel = c - np.repeat(low, gc.k)
        cfn = pytoulbar2.CFN(ubinit=None if ub is None else max(ub - const, 0.0) * self.scale + 1.0, verbose=-1)
        w = cfn.CFN.wcsp
        free = np.nonzero(self.free)[0]
        for i in free.tolist():
            w.makeEnumeratedVariable(f"x{i}", 0, int(gc.k[i]) - 1)
        kf = gc.k[free]
        for kk in np.unique(kf).tolist():
            sel = free[kf == kk]
            tab = self._units(rel[gc.offs[sel][:, None] + np.arange(kk)[None, :]])
            cfn.AddFunctions(self.var[sel].astype(np.int64), np.ascontiguousarray(tab, dtype=np.float64))
        for scopes, units in self.pairs:
            cfn.AddFunctions(scopes, np.ascontiguousarray(units, dtype=np.float64))
        spent = time.perf_counter() - w0
        if stream:                 # the slice in CPU seconds, less the CPU the model took; toulbar2
            limit = max(1, int(wall_s - (time.process_time() - c0)))   # prints "New solution: ..." and the values on fd 1
            fd = os.open(stream, os.O_WRONLY | os.O_TRUNC)
            os.dup2(fd, 1)
            os.close(fd)
        else:
            share = min(1.0, max(0.05, (time.process_time() - c0) / max(spent, 1e-3)))
            limit = max(1, int((wall_s - spent) * share))
        c1 = time.process_time()
        try:
            res = cfn.Solve(timeLimit=limit, showSolutions=1 if stream else 0)
        except Exception:          # toulbar2's Contradiction: nothing below the upper bound
            res = None
        dual = cfn.GetDDualBound()
        bound = const + float(dual) / self.scale if np.isfinite(dual) else -np.inf
        timed_out = time.process_time() - c1 >= 0.9 * limit     # its limit is CPU time
        if res is None:
            return None, bound, timed_out
        return self.expand(res[0]), bound, timed_out

    def expand(self, values) -> np.ndarray:
        """The component plan of toulbar2's values (one per variable with a choice)."""
        sc = np.zeros(self.gc.n, dtype=np.int64)
        sc[self.free] = np.asarray(values, dtype=np.int64)
        return sc


def cfn_solve(problem: Problem, time_limit_s: float, starts=(), on_plan=None, progress=None,
              round_time_limit_s: float | None = None, max_rounds: int | None = None, give_up_empty: bool = False,
              prepared=None, stream: bool | None = None) -> CFNResult:
    """Rounds of toulbar2 at adaptive memory prices within ``time_limit_s`` (see the module
    docstring). ``starts``: feasible plans found elsewhere (the best is the first upper bound);
    ``on_plan(plan, cost)`` on every new best plan; ``round_time_limit_s``: toulbar2's time per round
    (default a quarter of the budget, at least 1 s); ``max_rounds``: stop after that many;
    ``give_up_empty``: stop after a round that timed out without a plan (instead of doubling the
    slice), so that a caller with other solvers gets the time back; ``prepared``: the problem's
    ``solvers.local.prepare`` (built once for this and the search); ``stream`` (default
    ``give_up_empty``): toulbar2's limit in CPU seconds and its plans streamed (``_Model.solve``),
    so a round stretched by a loaded machine past the deadline still gives the plan it found."""
    t0, c0 = time.perf_counter(), time.process_time()
    deadline = t0 + float(time_limit_s)
    say = progress or (lambda msg: None)
    pr, g2, C, gc = prepared if prepared is not None else prepare(problem)
    g = pr.g
    best: list = [None, float("inf")]

    def consider(s, tag) -> bool:
        if s is None or len(s) != g.n:
            return False
        s = np.asarray(s, dtype=np.int64)
        if g.cap is not None and (problem.edge_memory is not None or g.profile(s).max() > g.cap):
            # over the limit, or copies may put it over (the prices charge node usages only)
            fit = fit_with_copies(problem, s, lc=g, time_limit_s=max(min(2.0, deadline - time.perf_counter()), 0.1))
            if fit is None:
                return False
            s = np.asarray(fit, dtype=np.int64)
        c = g.total(s)
        if c < best[1]:
            best[:] = [s.copy(), c]
            say(f"{tag}: {c:.10g} ({time.perf_counter() - t0:.1f}s)")
            if on_plan is not None:
                on_plan([int(x) for x in s], c)
            return True
        return False

    for s in starts:
        consider(s, "cfn start")
    if int((gc.k > 1).sum()) > MAX_VARS:
        say(f"cfn: {int((gc.k > 1).sum())} variables with a choice, over {MAX_VARS}: no rounds")
        return CFNResult(None if best[0] is None else [int(x) for x in best[0]], best[1], -np.inf, 0,
                         time.perf_counter() - t0)
    model = _Model(gc, _scale(gc))
    say(f"cfn: {int(model.free.sum())} variables, {sum(len(s) for s, _ in model.pairs)} binary functions, "
        f"scale {model.scale:.3g} ({time.perf_counter() - t0:.1f}s)")
    prices = _Prices(g2)
    if g2.cap is not None:      # warm prices: ICM on the priced costs until its plan fits
        prices.warm(C, gc, min(deadline, time.perf_counter() + WARM_SHARE * time_limit_s),
                    lambda sc: consider(pr.to_orig(C.expand(sc)), "cfn warm-up icm"))
    bound, rounds = model.floor_bound(gc.cost), 0     # unpriced: dropping the cap is a relaxation
    slice_s = round_time_limit_s or max(1.0, time_limit_s / 4.0)
    stream = give_up_empty if stream is None else stream
    need = CPU_PER_ENTRY_S * model.entries()      # CPU seconds to toulbar2's first plan, roughly
    while True:
        t = min(slice_s, deadline - time.perf_counter() - ROUND_MARGIN_S)
        if t < 1.0 or (max_rounds is not None and rounds >= max_rounds):
            break
        if stream and rounds == 0:     # the CPU this process gets (building the model, the warm-up)
            share = min(1.0, (time.process_time() - c0) / max(time.perf_counter() - t0, 1e-3))
            if share * (deadline - time.perf_counter()) < need:
                say(f"cfn: a first plan needs ~{need:.0f} CPU s, {share:.2f} of a core gives "
                    f"{share * (deadline - time.perf_counter()):.1f} by the deadline: giving the time back")
                break
            t = max(t, min(1.2 * need, 0.5 * time_limit_s))    # CPU seconds, stretched in wall time
        unary = prices.unary(C, gc)
        before = best[1]
        ub = None
        if best[0] is not None:
            b2 = pr.from_orig(best[0])
            bsc = None if b2 is None else C.contract(b2)
            if bsc is not None:
                ub = float(unary[gc.offs[:-1] + bsc].sum()) + _edges(gc, bsc)
        if stream:
            fd, path = tempfile.mkstemp(prefix="shardgym-cfn-", suffix=".txt")
            os.close(fd)
            try:
                sc, lb, timed_out = forked(model.solve, (unary, t, ub, path), deadline, ROUND_MARGIN_S)
                if sc is None:                         # killed at the deadline: its last plan, if any
                    sc = streamed(path, model)
            finally:
                os.unlink(path)
        else:
            sc, lb, timed_out = forked(model.solve, (unary, t, ub), deadline, ROUND_MARGIN_S)
        rounds += 1
        if sc is None and timed_out:
            if give_up_empty:
                say(f"cfn round {rounds}: no plan in {t:.0f} s; giving the time back")
                break
            if round_time_limit_s is None:
                slice_s *= 2.0    # no plan in the slice (S: ~25 s a round under load): longer rounds
        bound = max(bound, lb - prices.penalty())
        if best[0] is not None and bound >= best[1] - 1e-9 * max(abs(best[1]), 1.0):
            say(f"cfn round {rounds}: optimal ({time.perf_counter() - t0:.1f}s)")
            break
        if sc is None:                                 # nothing beats the best plan at these prices
            prices.lam *= DOWN
            say(f"cfn round {rounds}: no better plan; bound {bound:.10g} ({time.perf_counter() - t0:.1f}s)")
            continue
        if g2.cap is None:
            consider(pr.to_orig(C.expand(sc)), f"cfn[{rounds}]")
            break
        ratio = prices.update(C.expand(sc))
        if ratio.max() > 1.0:
            # a streamed round killed at the deadline still gets its repair (the search comes next)
            rep = repair_tied(C, gc, sc, max(min(deadline - time.perf_counter(), 2.0), 1.0 if stream else 0.0), pr=pr)
            if rep is not None:
                consider(pr.to_orig(C.expand(rep)), f"cfn+repair[{rounds}]")
        else:
            consider(pr.to_orig(C.expand(sc)), f"cfn[{rounds}]")
        say(f"cfn round {rounds}: peak/cap {ratio.max():.3f}; bound {bound:.10g} ({time.perf_counter() - t0:.1f}s)")
        if give_up_empty and timed_out and best[1] >= before:
            # a whole slice for no better plan (S: rounds 2-4 gave nothing in 27 s, where the search
            # went 1.649e9 -> 1.576e9 in 12 s from round 1's plan): the search gets the time
            say(f"cfn round {rounds}: no better plan in {t:.0f} s; giving the time back")
            break
    if best[0] is not None and best[1] >= FORBIDDEN_COST:
        bound = -np.inf
    return CFNResult(None if best[0] is None else [int(x) for x in best[0]], best[1], bound, rounds,
                     time.perf_counter() - t0)


class _Prices:
    """Memory prices λ_t over g's compressed time points and their adaptive update."""

    def __init__(self, g: LocalCosts):
        self.g = g
        pos = g.usage[g.usage > 0]
        fin = np.abs(g.cost[np.abs(g.cost) < FORBIDDEN_COST])
        self.base = (float(np.median(fin)) + 1.0 if len(fin) else 1.0) / (float(np.median(pos)) if len(pos) else 1.0)
        self.lam = np.zeros(len(g.times))

    def unary(self, C, gc: LocalCosts) -> np.ndarray:
        return C.penalty(self.g.interval_sums(self.lam)) if self.lam.any() else gc.cost

    def penalty(self) -> float:
        """cap · Σλ: what the priced minimum overstates a fitting plan's bound by."""
        return 0.0 if self.g.cap is None else self.g.cap * float(self.lam.sum())

    def update(self, s: np.ndarray) -> np.ndarray:
        """Grow λ where plan ``s`` (of g) is over the limit, decay it everywhere if it fits; the
        live/cap ratio per time point."""
        r = self.g.profile(s) / self.g.cap
        over = r > 1.0
        if over.any():
            self.lam[over] = np.minimum(np.maximum(self.lam[over] * UP, self.base * 10.0 * (r[over] - 1.0)),
                                        self.base * 1e12)   # a point no plan clears must not overflow
        else:
            self.lam *= DOWN
        return r

    def warm(self, C, gc: LocalCosts, until: float, consider, fits_needed: int = 3) -> None:
        """Price rounds with colour-class best response (ICM) (a fraction of a toulbar2 round each) until
        ``fits_needed`` plans have fit or ``until``: toulbar2 then starts near the right prices
        instead of at λ = 0, whose plan is far over the limit where memory binds (S: 16x)."""
        classes = gc.colour_classes()
        sc = gc.seg_argmin(gc.cost)
        fits = 0
        while fits < fits_needed and time.perf_counter() < until:
            sc = np.asarray(best_response(gc.p, sc, time_limit_s=until - time.perf_counter(),
                                         max_rounds=ICM_SWEEPS * max(len(classes), 1), lc=gc,
                                         node_cost=self.unary(C, gc), memory=False, classes=classes), dtype=np.int64)
            if self.update(C.expand(sc)).max() <= 1.0:
                fits += 1
                consider(sc)


def _edges(gc: LocalCosts, sc: np.ndarray) -> float:
    if not len(gc.eu):
        return 0.0
    return float(gc.ec[gc.eoff[:-1] + sc[gc.eu] * gc.k[gc.ev] + sc[gc.ev]].sum())


def _scale(gc: LocalCosts) -> float:
    """1 for integer costs whose plans stay far below TOP_UNITS; else TARGET_UNITS / a plan's cost."""
    fin = np.concatenate([gc.cost[gc.cost < FORBIDDEN_COST], gc.ec[gc.ec < FORBIDDEN_COST]])
    if not len(fin):
        return 1.0
    ref = float(np.abs(gc.cost[gc.offs[:-1] + gc.seg_argmin(gc.cost)]).sum()) + float(np.abs(fin).max())
    if np.all(fin == np.round(fin)) and ref < 1e12:
        return 1.0
    return TARGET_UNITS / max(ref, 1e-300)
