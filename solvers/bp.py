"""Min-sum belief propagation over a Problem's strategy graph, with Lagrangian memory prices, a masked
one-node-at-a-time decode and a lower bound.

``bp_solve(problem, rounds=60, memory_prices=True, time_limit_s=None) -> BPResult`` (plan, its
cost, a lower bound, rounds run); ``bp_plan(problem, ...)`` returns the plan alone.

* **Messages** (one per edge direction and strategy), all edges at once over the flat edge-cost
  array: m_{u→v}(t) = min_s [c_u(s) + Σ_{w≠v} m_{w→u}(s) + M_uv(s, t)], normalised to min 0 and
  damped (m ← (1−α)·m_new + α·m_old). Row and column minima are segment minima over the flat
  entries, gathered once into blocks of equal segment length (``solvers.bp_blocks.Blocks``), so a
  round costs a few passes over the edge-cost entries whatever the matrix shapes. Exact on trees
  (flooding converges after diameter rounds; damping only slows it).
* **Memory prices** (``memory_prices``, when the limit binds): λ_t ≥ 0 per compressed time point of
  the liveness grid turn usage into cost, c_i(s) + u_i(s)·Σ_{t∈interval(i)} λ_t. Every ``price_every``
  rounds the beliefs' argmin plan is priced (``price_step``): λ grows ×1.5 where it is over the limit (at
  least base·10·overload, ``price_base``) and decays ×0.8 where it fits (the contest winner's adaptive soft
  penalty; an additive subgradient step crawls or overshoots on costs spanning 10 decades). ×2.5/×0.9 before s17 overshot (decodes at 0.66-0.86 of the cap); ×1.5/×0.8: held-out mgn tiny cap 0.5
  1.47/1.40/1.47x -> 1.26/1.31/1.13x best-known; 0.50-1.04x the old plan on 14 capped training problems.
  With copy groups on the edges (solvers/bp_copies.py), once the limit binds the copies are priced on the edge entries
  that make them (binds: the argmin plan's node usages break it, or, at the first price point, its node usages fit
  and its copies break it, ``bp_schedule.COPIES_BIND``; session 25: outside:rnn on cpu-2x4 at eval_outside's cap
  1.90x -> 1.14x the ILP; vit tiny cpu-2x4 cap fraction 0.2 0.89x and gpt tiny there 0.99x the plan before; the
  other 52 of 54 zoo tiny capped problems and all 18 held-out ones, fno tiny cap 0.5 included, unchanged), the rule reads the argmin plan's profile with its copies, and the prices update
  every ``COPY_PRICE_EVERY`` rounds for ``COPY_ROUNDS`` times the rounds (decodes every ``COPY_DECODE_EVERY``):
  held-out meshgraphnet tiny cap 0.5 (h100/tpu/a100), raw decode 2.14/1.93/1.84x -> 1.47/1.40/1.47x
  the best-known (experiments/raw_decode_bench.py); fno tiny cap 0.5 unchanged (1.41x, 1.18x); 3x not 2x (s17):
  1.26/1.31/1.13x -> 1.26/1.28/1.09x, 14 capped training problems 0.97-1.00x (4x: as 3x). Built at the first
  price update that finds the limit binding (a Python loop: 0.7 s at fno large's 17,629 members).
* **Decode** (solvers/bp_decode.py): nodes in index order; node i takes the argmin of its belief with the messages from
  already-decided neighbours replaced by the true edge costs to their strategies, skipping
  strategies that would break the limit given the decided nodes and the least usage of the
  undecided ones (so the plan always fits when the lowest-usage plan does). Exact on trees with a
  unique optimum and converged messages (see tests/test_bp.py).
* **Resharded copies** (``Problem.edge_memory``): the pruned problem keeps them (``prune``). The
  price rule (without copy prices) reads the argmin plan's node usages (``Messages.price_profile``; with the copies
  too, the fg held-out split's meshgraphnet and unet problems ended 5-100 % dearer, measured in
  session 10). Every decode point decodes twice: the plain decode, and the copy-aware one
  (``decode(copies=True)``: the floor also carries the copies each decision makes live, so it fits
  with them unless it went leniently). ``Candidates`` keeps the cheapest that fits; a decode whose
  copies break the limit is repaired with the copies priced (``solvers.local.fit_with_copies``),
  cheapest first and only while it could still win. On the fg held-out split (26 problems with a
  plan, 20 s ILP labels) this took Lagrangian BP from a median 1.089 to 1.015 (geometric mean
  1.194 to 1.094). The bound stays valid: node usages alone are a relaxation (copies only add memory).
* **Lower bound**: any messages reparametrise the energy exactly: θ_i = belief_i,
  θ_e(s,t) = M_e(s,t) − m_{u→v}(t) − m_{v→u}(s). Each edge off a maximum-spread spanning forest
  gives its row minima to its producer's θ (what is left on it is ≥ 0), and min E ≥ the exact
  min over the forest of the θ terms (tree DP). The bound is taken at the zero messages too (the
  tree-plus-projections bound) and the larger one is kept. With prices,
  min over plans within the limit ≥ that bound on the priced costs − cap·Σ_t λ_t (weak duality).
  Equal to the optimum on trees; valid (never above the optimum) on any graph and any messages.
  Forbidden entries (≥ ``FORBIDDEN_COST``, the contest's "impossible") are clamped to 1000× the largest finite
  cost for the arithmetic: lowering costs keeps the bound valid.
* **Where it misses (held-out split, session 12, ratios to session 11's 60 s ILP labels):**
  fno tiny @ h100-2x8 cap 0.5 (1.61x, the split's max): resharded copies are 44 % of the cap at
  the peak of the ILP's plan and of BP's; the price rule reads node usage (argmin plan at 72 % of
  the cap), so λ stays 0; the plain decode breaks the cap by 16 % with its copies and repairs to
  1.78x, the copy-aware one fills memory in index order (1.61x). Tried and dropped: the copies in the
  price profile (1.60x); a second run pricing each copy on its (producer, consumer) edge entries,
  its rule reading the argmin plan or the plain decode (1.60-1.61x); ties broken by least usage;
  120-240 rounds, price_every 3 / 10 (1.60x); a price unit from positive node costs, or node and
  edge costs (the median |node cost| is 1e-13 s, the median edge cost 3e-5 s; meshgraphnet tiny cap
  0.5: 11 % dearer on h100-2x8, 4 % cheaper on tpu-4x4; with the edge unit 2.8-5.1x dearer); a MILP repair of the cheap decode over the
  120 nodes live at its over-cap points (no plan in 3 s). fno tiny @ a100-hetero cap 0.5 (1.18x):
  the plain decode costs 0.76x but breaks the cap by its copies; repair 1.18x (no λ helps: s17, raw_decode_bench.py). fno large @ h100-2x8
  uncapped (1.22x): BP shards the spectral chain on the batch (node cost 0.41 vs 0.79 ms) and pays 0.73 vs
  0.15 ms of resharding where the optimum keeps it replicated; 60-200 rounds and damping 0.3-0.7 give the same plan (bound 0.51 ms, optimum 0.94 ms).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from costmodel.edge_memory import CopyTracker
from costmodel.problem import FORBIDDEN_COST, Problem
from solvers.bp_blocks import Blocks
from solvers.bp_decode import Candidates, DecodeQueue, decode
from solvers.bp_schedule import (  # noqa: F401
    COPY_DECODE_EVERY,
    COPY_PRICE_EVERY,
    COPY_ROUNDS,
    DAMPING,
    PRICE_DECAY,
    PRICE_EVERY,
    PRICE_UP,
    PriceSchedule,
    price_base,
    price_step,
)
from solvers.local import LocalCosts, prune

__all__ = ["BPResult", "Candidates", "DecodeQueue", "Messages", "PriceSchedule", "bp_plan", "bp_solve", "decode",
           "price_step"]

BOUND_EVERY_NODES = 5000   # the bound (a Python tree DP, ~2 s at 40k nodes) at every price update up to this size


@dataclass(frozen=True)
class BPResult:
    """A BP run: ``plan`` (None when the lowest-usage plan is already over the limit), its true
    ``cost`` (inf without a plan), ``lower_bound`` (−inf when not computed), rounds and wall time; ``found``: (s
    from the start, cost) each time a plan that fits and is cheaper than those before was decoded (or repaired)."""
    plan: list[int] | None
    cost: float
    lower_bound: float
    rounds: int
    wall_s: float
    found: tuple = ()

    @property
    def gap(self) -> float | None:
        """(cost − bound) / |cost|, or None without a finite bound."""
        if self.plan is None or not np.isfinite(self.lower_bound):
            return None
        return max(0.0, self.cost - self.lower_bound) / max(abs(self.cost), 1e-300)


class Messages:
    """Index arrays for the vectorised min-sum update (built once per problem)."""

    def __init__(self, g: LocalCosts):
        self.g = g
        ku, kv = g.k[g.eu], g.k[g.ev]
        m = len(g.eu)
        self.su = np.zeros(m + 1, dtype=np.int64)       # to_u message of edge e: su[e]:su[e+1]
        self.sv = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(ku, out=self.su[1:])
        np.cumsum(kv, out=self.sv[1:])
        self.u_flat = g.gu_flat                          # flat strategy of u for each to_u slot
        self.v_flat = g.gv_flat
        N = len(g.ec)
        ent = np.repeat(np.arange(m), ku * kv)
        loc = np.arange(N) - g.eoff[ent]
        row, col = loc // kv[ent], loc % kv[ent]
        self.row_slot = self.su[ent] + row               # to_u slot of each entry's row
        self.col_slot = self.sv[ent] + col
        self.ent = ent
        eu_slot = np.repeat(np.arange(m), ku)             # (edge, row) segments, row-major order
        self.seg_u = g.eoff[eu_slot] + (np.arange(len(eu_slot)) - self.su[eu_slot]) * kv[eu_slot]
        ev_slot = np.repeat(np.arange(m), kv)             # (edge, column) segments, transposed order
        self.seg_v = g.eoff[ev_slot] + (np.arange(len(ev_slot)) - self.sv[ev_slot]) * ku[ev_slot]
        finite = np.concatenate([np.abs(g.cost[g.cost < FORBIDDEN_COST]), np.abs(g.ec[g.ec < FORBIDDEN_COST]), [1.0]])
        self.big = 1000.0 * float(finite.max())
        self.ec = np.minimum(g.ec, self.big)
        self.cost = np.minimum(g.cost, self.big)
        self._earlier = self._copies = self._blk = self._ecb = None

    def earlier(self) -> list:
        """Per node i, what ``decode`` adds for each neighbour j < i (decided before i), in adjacency
        order: (j, entry index of strategy 0 of each of i's rows or None, first entry, message slice,
        from to_u): the edge row is ``ec[idx + x_j]`` or ``ec[first + x_j·k_i : … + k_i]``. Built once."""
        if self._earlier is None:
            g, k = self.g, self.g.k.tolist()
            eu, eoff, adj, adj_edge, ptr = g.eu.tolist(), g.eoff.tolist(), g.adj.tolist(), g.adj_edge.tolist(), \
                g.adj_ptr.tolist()
            out = [[] for _ in range(g.n)]
            for i in range(g.n):
                for q in range(ptr[i], ptr[i + 1]):
                    j, e = adj[q], adj_edge[q]
                    if j >= i:
                        continue
                    if eu[e] == i:
                        out[i].append((j, eoff[e] + np.arange(k[i]) * k[j], 0, slice(self.su[e], self.su[e + 1]), True))
                    else:
                        out[i].append((j, None, eoff[e], slice(self.sv[e], self.sv[e + 1]), False))
            self._earlier = out
        return self._earlier

    def copy_tracker(self):
        """A fresh ``CopyTracker`` of the problem's copy groups on its time grid (None without them):
        ``decode`` adds the copies each decision makes live to its floor."""
        em = self.g.p.edge_memory
        if em is None:
            return None
        if self._copies is None:
            self._copies = CopyTracker(em, self.g.times, self.g.n)
        return self._copies.fresh()

    def price_profile(self, x: np.ndarray) -> np.ndarray:
        """The profile the price rule reads for the beliefs' argmin plan ``x``: its node usages, not
        its resharded copies (``g.profile(x)`` with them was tried: see the module docstring)."""
        g = self.g
        return g.profile_of(g.live_usage[g.offs[:-1] + x])

    def unpriced(self, rounds: int, damping: float = DAMPING, deadline: float | None = None, start=None) -> tuple:
        """Plain BP's messages (to_u, to_v) after ``rounds`` rounds without memory prices, whose decodes are
        Lagrangian BP's extra candidates under a binding cap, for where the prices make every decode dear
        (fno large @ h100-2x8 cap 0.1: 3.92x the ILP label with the prices, 1.42x plain BP's plan). Fewer
        rounds if ``deadline`` (perf_counter) passes. ``start``: (r, to_u, to_v), the messages after r
        such rounds already run (bp_solve's own rounds before its first price: the same numbers)."""
        r, to_u, to_v = start or (0, np.zeros(int(self.su[-1])), np.zeros(int(self.sv[-1])))
        for _ in range(r, rounds):
            if deadline is not None and time.perf_counter() > deadline:
                break
            to_u, to_v = self.update(self.cost, to_u, to_v, damping)
        return to_u, to_v

    def belief(self, c: np.ndarray, to_u: np.ndarray, to_v: np.ndarray) -> np.ndarray:
        n = len(c)
        return c + np.bincount(self.u_flat, to_u, minlength=n) + np.bincount(self.v_flat, to_v, minlength=n)

    def blocks(self) -> tuple:
        """(row minima, column minima, to_u per edge, to_v per edge) as ``Blocks`` (built once), and the
        message slots the row and column minima read, in their ``idx`` order."""
        if self._blk is None:
            g, nu, nv = self.g, np.diff(self.su), np.diff(self.sv)
            ku, kv = g.k[g.eu], g.k[g.ev]
            eus, evs = np.repeat(np.arange(len(nu)), nu), np.repeat(np.arange(len(nv)), nv)
            rows = Blocks(self.seg_u, kv[eus], 1)
            cols = Blocks(g.eoff[evs] + np.arange(len(evs)) - self.sv[evs], ku[evs], kv[evs])
            self._blk = (rows, cols, Blocks(self.su[:-1], nu, 1), Blocks(self.sv[:-1], nv, 1),
                         self.col_slot[rows.idx], self.row_slot[cols.idx])
        return self._blk

    def update(self, c, to_u, to_v, damping: float):
        """One damped round: the segment minima by ``Blocks`` (the same numbers as reduceat's), the edge
        costs gathered in their order once per ``ec`` (bp_solve's copy prices replace it)."""
        if not len(self.ec):
            return to_u, to_v
        rows, cols, eu, ev, cs, rs = self.blocks()
        if self._ecb is None or self._ecb[0] is not self.ec:
            self._ecb = (self.ec, self.ec[rows.idx], self.ec[cols.idx])
        b = self.belief(c, to_u, to_v)
        hu = b[self.u_flat] - to_u                       # u's belief without v's message
        hv = b[self.v_flat] - to_v
        new_v = cols.min(hu[rs] + self._ecb[2])
        new_u = rows.min(hv[cs] + self._ecb[1])
        new_v -= np.repeat(ev.min(new_v[ev.idx]), np.diff(self.sv))
        new_u -= np.repeat(eu.min(new_u[eu.idx]), np.diff(self.su))
        return (damping * to_u + (1 - damping) * new_u, damping * to_v + (1 - damping) * new_v)

    def lower_bound(self, c, to_u, to_v) -> float:
        """Forest-exact + off-forest-minimum bound of min Σ c + Σ M (valid for any messages)."""
        g = self.g
        b = self.belief(c, to_u, to_v)
        if not len(g.eu):
            return float(np.minimum.reduceat(b, g.offs[:-1]).sum())
        th = self.ec - to_v[self.col_slot] - to_u[self.row_slot]
        emin = np.minimum.reduceat(th, g.eoff[:-1])
        spread = np.maximum.reduceat(th, g.eoff[:-1]) - emin
        parent = np.arange(g.n)

        def find(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        tree = np.zeros(len(g.eu), dtype=bool)
        for e in np.argsort(-spread, kind="stable").tolist():
            ra, rb = find(int(g.eu[e])), find(int(g.ev[e]))
            if ra != rb:
                parent[ra] = rb
                tree[e] = True
        # each edge off the forest gives its row minima to its producer: θ_e − rowmin ≥ 0
        off = ~tree[self.ent]
        rowmin = np.minimum.reduceat(np.where(off, th, np.inf), self.seg_u)
        b = b + np.bincount(self.u_flat, np.where(np.isfinite(rowmin), rowmin, 0.0), minlength=len(b))
        U = [b[g.offs[i]:g.offs[i + 1]].copy() for i in range(g.n)]
        nb: list[list[int]] = [[] for _ in range(g.n)]
        for e in np.nonzero(tree)[0].tolist():
            nb[int(g.eu[e])].append(e)
            nb[int(g.ev[e])].append(e)
        seen = np.zeros(g.n, dtype=bool)
        total = 0.0
        for r in range(g.n):
            if seen[r]:
                continue
            seen[r] = True
            order, stack = [], [(r, -1)]
            while stack:
                i, pe = stack.pop()
                order.append((i, pe))
                for e in nb[i]:
                    j = int(g.ev[e]) if g.eu[e] == i else int(g.eu[e])
                    if not seen[j]:
                        seen[j] = True
                        stack.append((j, e))
            for i, e in reversed(order):
                if e < 0:
                    total += float(U[i].min())
                    continue
                u, v = int(g.eu[e]), int(g.ev[e])
                T = th[g.eoff[e]:g.eoff[e + 1]].reshape(int(g.k[u]), int(g.k[v]))
                if i == u:
                    U[v] += (U[i][:, None] + T).min(axis=0)
                else:
                    U[u] += (T + U[i][None, :]).min(axis=1)
        return total


def bp_solve(problem: Problem, rounds: int = 60, damping: float = DAMPING, memory_prices: bool = True,
             price_every: int = PRICE_EVERY, time_limit_s: float | None = None, bound: bool = True,
             decode_every: int | None = None, pruned: bool = True) -> BPResult:
    """Run ``rounds`` of min-sum BP (fewer if ``time_limit_s`` runs out), with memory prices when the
    limit binds and ``memory_prices``; return the best masked decode seen and the best bound.
    Decodes after the last round and, with prices, after every price update (``decode_every``
    rounds, default ``price_every``). ``pruned``: run on the problem without the strategies no
    forbidden-free, memory-feasible plan uses (``solvers.local.prune``; exact for that question), so the
    decode cannot walk into a forbidden entry that arc consistency sees coming; the bound then
    holds whenever a forbidden-free plan fits (it is dropped, −inf, when the plan found is not).
    ``bound="end"``: the bound at the start and the end only (not at each price update); the
    planner's cheap optimality check (agent/fgnn_planner.py)."""
    t0 = time.perf_counter()
    deadline = None if time_limit_s is None else t0 + float(time_limit_s)
    orig, (problem, back) = problem, (prune(problem) if pruned else (problem, None))
    g = LocalCosts(problem)
    mp = Messages(g)
    to_u, to_v = np.zeros(int(mp.su[-1])), np.zeros(int(mp.sv[-1]))
    lb = -float("inf")
    sched = PriceSchedule(mp, rounds, memory_prices, price_every, decode_every)   # solvers/bp_schedule.py
    cands = Candidates(orig, back)
    variants = (False, True) if sched.binding and problem.edge_memory is not None else (False,)

    queue = DecodeQueue(mp, cands.add)     # the decodes, run together (the same plans, in order)

    def consider(c):      # the plain decode (repaired later if its copies break the cap) and the copy-aware one
        for copies in variants:
            queue.add(c, to_u, to_v, copies)

    r, plain = 0, (0, to_u, to_v)    # plain: (r, to_u, to_v) until a price enters (the unpriced run's start)
    if bound:
        lb = mp.lower_bound(sched.c, to_u, to_v)       # zero messages: the forest-plus-projections bound
    while r < sched.total and (deadline is None or time.perf_counter() < deadline):
        to_u, to_v = mp.update(sched.c, to_u, to_v, damping)
        r += 1
        if plain is not None:
            plain = (r, to_u, to_v) if sched.c is mp.cost and mp.ec is sched.ec0 else None
        if sched.at_price(r):
            ratio = sched.ratio(g.seg_argmin(mp.belief(sched.c, to_u, to_v)), r)
            if bound is True and g.n <= BOUND_EVERY_NODES and sched.cp is None:   # copy prices over-count: no bound
                lb = max(lb, mp.lower_bound(sched.c, to_u, to_v) - g.cap * float(sched.lam.sum()))
            if sched.decodes(r):
                consider(sched.c)
            sched.update(r, ratio)
    consider(sched.c)
    sched.restore()                               # true edge costs again (unpriced decodes, bound)
    if g.cap is not None and memory_prices and (deadline is None or time.perf_counter() < deadline):
        tu, tv = mp.unpriced(rounds, damping, deadline, plain if plain is not None and plain[0] <= rounds else None)
        for copies in variants:
            queue.add(mp.cost, tu, tv, copies)
    queue.flush()
    best, best_cost = cands.best(None if deadline is None else max(deadline - time.perf_counter(), 0.1))
    if bound:
        lam = sched.lam
        lb = max(lb, mp.lower_bound(sched.c, to_u, to_v) - (g.cap * float(lam.sum()) if lam.any() else 0.0))
    if best is None and back is not None:     # only plans through forbidden entries fit
        left = None if deadline is None else max(deadline - time.perf_counter(), 0.1)
        # the unpruned run starts at the cadence this one ended with (the copy-priced phase's, if it began): what
        # bp_solve did before the schedule had one home (session 25), and what found gpt tiny cpu-2x4 cap fraction
        # 0.05 10.7 % cheaper and meshgraphnet tiny there any fitting plan at all (results/s25_bp_copies_ab.json)
        return bp_solve(orig, rounds, damping, memory_prices, sched.price_every, left, bound, sched.decode_every, False)
    if best_cost >= FORBIDDEN_COST:
        lb = -float("inf")
    return BPResult(plan=None if best is None else [int(v) for v in best], cost=best_cost,
                    lower_bound=lb, rounds=r, wall_s=time.perf_counter() - t0,
                    found=tuple((t - t0, c) for t, c in cands.found))


def bp_plan(problem: Problem, rounds: int = 60, memory_prices: bool = True,
            time_limit_s: float | None = None, **kw) -> list[int] | None:
    """The plan of ``bp_solve`` (None when nothing fits the limit)."""
    return bp_solve(problem, rounds=rounds, memory_prices=memory_prices, time_limit_s=time_limit_s,
                    bound=False, **kw).plan
