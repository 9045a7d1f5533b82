"""The masked one-node-at-a-time decode of solvers/bp.py (split out of it for the 400-line limit;
``solvers.bp.decode`` is this): ``decode(mp, c, to_u, to_v)`` turns a ``bp.Messages``'s beliefs into a
plan in node index order, with the memory limit's least-usage floor and arc consistency over forbidden
entries (``_Domains``). See bp.py's module docstring for the rule.

Also the decodes of a whole run at once (``decode_many``, ``DecodeQueue``: the same plans, the Python
loop over the nodes paid once for all of a run's decode points; session 19, random problems at load
2-6: see ``DecodeQueue``) and the cheapest plan among them (``Candidates``, ``solvers.bp.Candidates``).
"""
from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem, evaluate
from solvers.local import LocalCosts, fit_with_copies


class _Domains:
    """The decode's state: decided strategies ``x`` (−1: undecided), the strategies still allowed
    (``alive``), each node's least usage over them (its chosen usage once decided) and the live
    usage profile of those least usages (``floor``: no completion can use less at any point)."""

    def __init__(self, g: LocalCosts):
        self.g = g
        self.x = np.full(g.n, -1, dtype=np.int64)
        self.alive = g.cost < FORBIDDEN_COST
        self.alive[np.repeat(~np.logical_or.reduceat(self.alive, g.offs[:-1]), g.k)] = True
        self.ok_e = g.ec < FORBIDDEN_COST
        self.free = bool(self.ok_e.all())      # no forbidden entry: propagation can never shrink a domain
        self.mc = np.minimum.reduceat(np.where(self.alive, g.usage, np.inf), g.offs[:-1])
        self.floor = None if g.cap is None else g.profile_of(np.where(g.live_mask, self.mc, 0.0))

    def _set_min(self, k: int, m: float, log: list | None) -> bool:
        """Node k's least usage becomes m; False if that breaks the limit somewhere."""
        g = self.g
        old = float(self.mc[k])
        if log is not None:
            log.append(("m", k, old))
        self.mc[k] = m
        if self.floor is None or not g.live_mask[k] or g.hi[k] <= g.lo[k] or m == old:
            return True
        seg = self.floor[g.lo[k]:g.hi[k]]
        seg += m - old
        return bool(seg.max() <= g.cap)

    def decide_free(self, i: int, s: int, lo: int, hi: int, span: tuple | None) -> bool:
        """``decide(i, s, strict=True)``, then ``undo`` if it fails, when ``free`` (no forbidden entry:
        nothing to propagate): the same state, floor rounding included, without the log. ``lo, hi``:
        node i's strategy slots; ``span``: its live time points when the floor is kept, else None."""
        m, old = float(self.g.usage[lo + s]), float(self.mc[i])
        if span is not None and m != old:
            seg = self.floor[span[0]:span[1]]
            seg += m - old
            if not seg.max() <= self.g.cap:
                seg -= m - old              # as undo: (floor + d) − d
                return False
        self.mc[i], self.x[i] = m, s
        self.alive[lo:hi] = False
        self.alive[lo + s] = True
        return True

    def undo(self, log: list) -> None:
        g = self.g
        for rec in reversed(log):
            if rec[0] == "m":
                _, k, old = rec
                if self.floor is not None and g.live_mask[k] and g.hi[k] > g.lo[k]:
                    self.floor[g.lo[k]:g.hi[k]] -= self.mc[k] - old
                self.mc[k] = old
            elif rec[0] == "a":
                _, k, old = rec
                self.alive[g.offs[k]:g.offs[k + 1]] = old
            else:
                self.x[rec[1]] = -1

    def decide(self, i: int, s: int, strict: bool, log: list | None = None, max_visits: int = 20000) -> bool:
        """Fix node i at s and propagate arc consistency (a strategy with no forbidden-free partner
        left in a neighbour's domain leaves its own) with the least-usage floor. ``strict``: False
        on a domain wipe-out or a floor over the limit (then ``undo(log)`` restores the state);
        otherwise such revisions are skipped."""
        g = self.g
        if log is not None:
            log.append(("x", i))
            log.append(("a", i, self.alive[g.offs[i]:g.offs[i + 1]].copy()))
        self.x[i] = s
        self.alive[g.offs[i]:g.offs[i + 1]] = False
        self.alive[g.offs[i] + s] = True
        if not self._set_min(i, float(g.usage[g.offs[i] + s]), log) and strict:
            return False
        queue, visits = deque([] if self.free else [i]), 0
        while queue and visits < max_visits:
            j = queue.popleft()
            visits += 1
            dom = self.alive[g.offs[j]:g.offs[j + 1]]
            for q in range(g.adj_ptr[j], g.adj_ptr[j + 1]):
                k = int(g.adj[q])
                if self.x[k] >= 0:
                    continue
                e = int(g.adj_edge[q])
                A = self.ok_e[g.eoff[e]:g.eoff[e + 1]].reshape(int(g.k[g.eu[e]]), int(g.k[g.ev[e]]))
                sup = A[dom].any(axis=0) if g.eu[e] == j else A[:, dom].any(axis=1)
                cur = self.alive[g.offs[k]:g.offs[k + 1]]
                new = cur & sup
                if np.array_equal(new, cur):
                    continue
                if not new.any():
                    if strict:
                        return False
                    continue
                if log is not None:
                    log.append(("a", k, cur.copy()))
                self.alive[g.offs[k]:g.offs[k + 1]] = new
                m = float(g.usage[g.offs[k]:g.offs[k + 1]][new].min())
                if not self._set_min(k, m, log) and strict:
                    return False
                queue.append(k)
        return True


def _start(g: LocalCosts) -> _Domains | None:
    """The decode's first state; where the least-usage floor breaks the limit, every strategy
    allowed again (only plans through forbidden strategies fit, if any); None if still over."""
    d = _Domains(g)
    cap = g.cap
    if d.floor is not None and d.floor.max(initial=0.0) > cap:
        d.alive[:] = True                       # only through forbidden strategies, if at all
        d.mc = np.minimum.reduceat(g.usage, g.offs[:-1])
        d.floor = g.profile_of(np.where(g.live_mask, d.mc, 0.0))
        if d.floor.max(initial=0.0) > cap:
            return None
    return d


def decode(mp, c, to_u, to_v, tries: int = 4, copies: bool = False, ec=None) -> np.ndarray | None:
    """Masked one-node-at-a-time decode in index order (see the module docstring), with forward
    checking: of the ``tries`` cheapest strategies that fit, the first whose arc-consistency
    propagation (``_Domains.decide``) empties no undecided domain and keeps the least-usage floor
    within the limit is taken; if none passes, the cheapest, propagated leniently. ``copies`` (a
    problem with copy groups under a limit): the floor also carries the resharded copies each
    decision makes live with its decided neighbours (``CopyTracker``), and a strategy whose copies
    would break the limit is skipped (any number of them, not only ``tries``); such a decode fits
    the limit, copies included, unless some node had no strategy left (then it went leniently).
    ``ec``: the flat edge costs to decode with (default ``mp.ec``, which bp_solve's copy prices replace)."""
    g = mp.g
    b = mp.belief(c, to_u, to_v)
    d = _start(g)
    if d is None:
        return None
    cap = g.cap
    x, ec, xs = d.x, mp.ec if ec is None else ec, [0] * g.n   # xs: x as Python ints (nodes decide in index order)
    copies = mp.copy_tracker() if copies and d.floor is not None else None
    sx = [-1] * g.n                          # x for the copy tracker (−1: undecided)
    offs, ks, tlo, thi = g.offs.tolist(), g.k.tolist(), g.lo.tolist(), g.hi.tolist()
    timed = (g.live_mask & (g.hi > g.lo)).tolist() if d.floor is not None else [False] * g.n
    # free: a node's domain changes only when it is decided, so whether it is all alive is known now
    all_alive = np.logical_and.reduceat(d.alive, g.offs[:-1]).tolist() if d.free and g.n else None
    for i, terms in enumerate(mp.earlier()):
        lo, hi, ki = offs[i], offs[i + 1], ks[i]
        sc = b[lo:hi].copy()
        _add_decided(sc, terms, xs, ki, ec, to_u, to_v)
        if timed[i]:
            room = cap - d.floor[tlo[i]:thi[i]].max()
            sc = np.where(g.usage[lo:hi] - d.mc[i] <= room, sc, np.inf)
        al = d.alive[lo:hi]
        if not (all_alive[i] if d.free else al.all()):
            sc = np.where(al, sc, np.where(np.isfinite(sc), sc + 1e300, sc))
        order = sc.argsort(kind="stable")
        done = False
        for s in order[:tries if copies is None else ki].tolist():
            if not math.isfinite(sc[s]) or not al[s]:
                break
            clog, made = None, []
            if copies is not None:           # the copies s makes live with the decided neighbours
                clog = []
                made = copies.decide(i, s, sx, clog)
                if made and not _add(d.floor, made, cap):
                    copies.undo(clog)
                    continue
            if d.free:
                if d.decide_free(i, s, lo, hi, (tlo[i], thi[i]) if timed[i] else None):
                    done = True
                    break
            else:
                log: list = []
                if d.decide(i, s, strict=True, log=log):
                    done = True
                    break
                d.undo(log)
            if clog is not None:
                _add(d.floor, made, None, -1.0)
                copies.undo(clog)
        if not done:
            d.decide(i, int(order[0]), strict=False)
            if copies is not None:
                _add(d.floor, copies.decide(i, int(order[0]), sx), None)
        xs[i] = sx[i] = int(x[i])
    return x


def forced_offsets(mp, to_u, to_v, x, ec=None) -> np.ndarray:
    """Per flat strategy, what ``decode`` adds to its node's belief when every earlier node was decided
    as plan ``x`` (teacher forcing): the decided neighbours' true edge costs in place of their messages.
    The belief plus these offsets is the score ``decode`` ranks at each node along ``x`` (before its
    memory mask); agent/fgnn_finetune.py imitates ``x`` on it."""
    g = mp.g
    ec = mp.ec if ec is None else ec
    off, x = np.zeros(len(g.cost)), np.asarray(x, np.int64)
    offs, ks = g.offs.tolist(), g.k.tolist()
    for i, terms in enumerate(mp.earlier()):
        _add_decided(off[offs[i]:offs[i + 1]], terms, x, ks[i], ec, to_u, to_v)
    return off


def _add_decided(sc: np.ndarray, terms, xs, ki: int, ec, to_u, to_v) -> None:
    """Add to node scores ``sc`` (a view, ``ki`` strategies) its decided neighbours' true edge costs in
    place of their messages (``terms``: ``mp.earlier()``'s for the node; ``xs``: the decided strategies)."""
    for j, idx, first, msl, from_u in terms:
        if from_u:
            sc += ec[idx + xs[j]] - to_u[msl]
        else:
            sc += ec[first + xs[j] * ki: first + (xs[j] + 1) * ki] - to_v[msl]


def _add(floor: np.ndarray, made: list, cap: float | None, sign: float = 1.0) -> bool:
    """Add (``sign`` −1: remove) the copies ``made`` ([(lo, hi, bytes)] on the grid) to the floor;
    with ``cap``, False (and the floor as it was) when that puts a point over it."""
    for lo, hi, b in made:
        floor[lo:hi] += sign * b
    if cap is None or all(floor[lo:hi].max() <= cap for lo, hi, _ in made):
        return True
    for lo, hi, b in made:
        floor[lo:hi] -= b
    return False


def decode_many(mp, snaps: list, tries: int = 4, ec=None) -> list:
    """``[decode(mp, c, to_u, to_v, tries, ec=ec) for c, to_u, to_v in snaps]``, the same plans bit for bit
    (tests/test_bp.py), in one pass over the nodes for all the snapshots when no edge entry is forbidden
    (``_Domains.free``: an undecided node's domain and least usage are then the start's, whatever was
    decided, so only the decisions and the floors differ between snapshots): each node's scores, floor
    check and tries are (snapshot, strategy) arrays, the Python work per node paid once, not once per
    snapshot. With forbidden entries, one ``decode`` each."""
    g = mp.g
    ec = mp.ec if ec is None else ec
    d = _start(g) if len(snaps) > 1 else None
    if d is None or not d.free:
        return [decode(mp, c, to_u, to_v, tries=tries, ec=ec) for c, to_u, to_v in snaps]
    K, cap, usage, mc, alive = len(snaps), g.cap, g.usage, d.mc, d.alive
    B = np.stack([mp.belief(c, to_u, to_v) for c, to_u, to_v in snaps])
    TU, TV = np.stack([s[1] for s in snaps]), np.stack([s[2] for s in snaps])
    X = np.zeros((K, g.n), dtype=np.int64)
    F = None if d.floor is None else np.repeat(d.floor[None, :], K, axis=0)   # one floor per snapshot
    offs, ks, tlo, thi = g.offs.tolist(), g.k.tolist(), g.lo.tolist(), g.hi.tolist()
    timed = (g.live_mask & (g.hi > g.lo)).tolist() if F is not None else [False] * g.n
    all_alive = np.logical_and.reduceat(alive, g.offs[:-1]).tolist() if g.n else []
    rows, ar = np.arange(K), np.arange(max(ks, default=1))
    for i, terms in enumerate(mp.earlier()):
        lo, hi, ki = offs[i], offs[i + 1], ks[i]
        sc = B[:, lo:hi].copy()
        for j, idx, first, msl, from_u in terms:
            xj = X[:, j]
            if from_u:
                sc += ec[idx[None, :] + xj[:, None]] - TU[:, msl]
            else:
                sc += ec[(first + xj * ki)[:, None] + ar[:ki]] - TV[:, msl]
        if timed[i]:
            a, z = tlo[i], thi[i]
            room = cap - F[:, a:z].max(axis=1)
            sc = np.where((usage[lo:hi] - mc[i])[None, :] <= room[:, None], sc, np.inf)
        al = alive[lo:hi]
        if not all_alive[i]:
            sc = np.where(al, sc, np.where(np.isfinite(sc), sc + 1e300, sc))
        order = sc.argsort(axis=1, kind="stable")
        choice, pend, lenient = order[:, 0].copy(), rows, []
        for t in range(min(tries, ki)):       # decide_free's tries, for the snapshots still trying
            s = order[pend, t]
            go = np.isfinite(sc[pend, s]) & al[s]
            if not go.all():                  # a masked or dead strategy ends the tries: lenient
                lenient.append(pend[~go])
                pend, s = pend[go], s[go]
            if not len(pend):
                break
            ok = np.ones(len(pend), dtype=bool)
            if timed[i]:
                dl = usage[lo + s] - mc[i]
                ch = np.nonzero(dl != 0.0)[0]
                if len(ch):
                    r, dd = pend[ch], dl[ch][:, None]
                    F[r, a:z] += dd
                    bad = ~(F[r, a:z].max(axis=1) <= cap)
                    if bad.any():
                        F[r[bad], a:z] -= dd[bad]      # as decide_free's undo: (floor + d) − d
                        ok[ch[bad]] = False
            choice[pend[ok]] = s[ok]
            pend = pend[~ok]
            if not len(pend):
                break
        lenient.append(pend)
        r = np.concatenate(lenient)
        if len(r) and timed[i]:               # decide(strict=False): the cheapest, its usage on the floor
            dl = usage[lo + choice[r]] - mc[i]
            r, dl = r[dl != 0.0], dl[dl != 0.0]
            F[r, a:z] += dl[:, None]
        X[:, i] = choice
    return list(X)


class DecodeQueue:
    """Decodes asked for during a BP run, run together (``decode_many``) and handed to ``sink`` in the
    order they were asked for (as ``Candidates.add``, which reads nothing else, wants them). ``add(c,
    to_u, to_v, copies, ec=None)``: one decode at the edge costs ``ec`` (default: those ``mp.ec`` holds now; a
    change of them, as bp_solve's copy prices make, or ``max_pending`` waiting, runs those waiting first);
    copy-aware ones run one by one. ``flush()`` runs the rest.

    A copy-aware decode of a snapshot whose plain decode fits the limit with its copies is that plan
    (``twin_fits``), so it is not run (session 28: 17 of bp_solve's 20 on gpt 7b @ h100-2x8 at cap 0.05, ~0.5 s
    each). With no forbidden edge entry both score alike, and the copy-aware floor (the plain one plus the
    decided nodes' copies) stays under the final plan's profile, so where that fits the plain choice passes the
    copy-aware checks and each strategy ranked before it fails them too. Exact with integral bytes (traced
    problems: float64 sums exact); else a 1e-9 margin. With forbidden entries both run (tests/test_bp.py)."""

    def __init__(self, mp, sink, max_pending: int = 16):
        self.mp, self.sink, self.max_pending, self.pending = mp, sink, max_pending, []
        self.free = mp.g.cap is not None and bool((mp.g.ec < FORBIDDEN_COST).all())   # ``twin_fits``

    def add(self, c, to_u, to_v, copies: bool = False, ec=None) -> None:
        ec = self.mp.ec if ec is None else ec
        if self.pending and (self.pending[0][4] is not ec or len(self.pending) >= self.max_pending):
            self.flush()
        self.pending.append((c, to_u, to_v, copies, ec))

    def twin_fits(self, x) -> bool:
        """Whether plan ``x`` (a plain decode) fits the limit with its copies, with no forbidden edge entry."""
        return x is not None and self.free and bool(self.mp.g.profile(np.asarray(x, dtype=np.int64)).max(initial=0.0)
                                                    <= self.mp.g.cap * (1 - 1e-9))

    def flush(self) -> None:
        if not self.pending:
            return
        plain = [k for k, w in enumerate(self.pending) if not w[3]]
        done = dict(zip(plain, decode_many(self.mp, [self.pending[k][:3] for k in plain], ec=self.pending[0][4])))
        for k, (c, to_u, to_v, copies, ec) in enumerate(self.pending):
            if k in done:
                self.sink(done[k])
                continue
            twin = next((j for j in plain if all(a is b for a, b in zip(self.pending[j], (c, to_u, to_v)))
                         and self.pending[j][4] is ec), None)
            self.sink(done[twin] if twin is not None and self.twin_fits(done[twin])
                      else decode(self.mp, c, to_u, to_v, copies=True, ec=ec))
        self.pending = []


class Candidates:
    """The cheapest plan of ``problem`` that fits among decodes; bp_solve's and FGNN.plan's. ``add(x)``:
    a decode (of the pruned problem when ``back`` maps its plans to ``problem``'s; None: none). One
    that fits by ``evaluate`` counts at once; one that breaks the limit (by its resharded copies, or a
    lenient decode) waits: ``best()`` repairs the waiting ones (``fit_with_copies``, the costly part:
    0.1-1 s each on 300-900-node zoo problems), cheapest first, and only while the unrepaired cost
    is below the best fitting cost (a repair rarely makes a plan cheaper: approximate, it skips a
    repair that would have), at most ``max_repairs`` (bp_solve decoded 12 a run before, each repaired). ``last``: the last decode, mapped."""

    def __init__(self, problem: Problem, back=None, max_repairs: int = 12):
        self.problem, self.back, self.max_repairs = problem, back, max_repairs
        self.plan, self.cost, self.last = None, float("inf"), None
        self.waiting, self.seen, self.found = [], set(), []   # found: (perf_counter, cost) of each new best

    def add(self, x) -> None:
        if x is None:
            return
        x = np.asarray(x if self.back is None else self.back(x), dtype=np.int64)
        self.last = x
        key = x.tobytes()
        if key in self.seen:
            return
        self.seen.add(key)
        c = evaluate(self.problem, x)
        if c.feasible:
            if c.total < self.cost:
                self.plan, self.cost = x, c.total
                self.found.append((time.perf_counter(), c.total))
        elif self.problem.edge_memory is not None:
            self.waiting.append((c.total, len(self.waiting), x))

    def best(self, time_limit_s: float | None = None) -> tuple:
        """(plan, cost) after the repairs; (None, inf) when nothing fits."""
        deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
        for n, (c0, _, x) in enumerate(sorted(self.waiting, key=lambda w: w[:2])):
            if c0 >= self.cost or n >= self.max_repairs:
                break
            left = None if deadline is None else max(deadline - time.perf_counter(), 0.1)
            fit = fit_with_copies(self.problem, x, time_limit_s=left)
            if fit is not None and (cost := evaluate(self.problem, fit).total) < self.cost:
                self.plan, self.cost = np.asarray(fit, dtype=np.int64), cost
                self.found.append((time.perf_counter(), cost))
        self.waiting = []
        return self.plan, self.cost
