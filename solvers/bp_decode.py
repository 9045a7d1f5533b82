"""The masked one-node-at-a-time decode of solvers/bp.py (split out of it for the 400-line limit;
``solvers.bp.decode`` is this): ``decode(mp, c, to_u, to_v)`` turns a ``bp.Messages``'s beliefs into a
plan in node index order, with the memory limit's least-usage floor and arc consistency over forbidden
entries (``_Domains``). See bp.py's module docstring for the rule.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from costmodel.problem import FORBIDDEN_COST
from solvers.local import LocalCosts


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


def decode(mp, c, to_u, to_v, tries: int = 4, copies: bool = False) -> np.ndarray | None:
    """Masked one-node-at-a-time decode in index order (see the module docstring), with forward
    checking: of the ``tries`` cheapest strategies that fit, the first whose arc-consistency
    propagation (``_Domains.decide``) empties no undecided domain and keeps the least-usage floor
    within the limit is taken; if none passes, the cheapest, propagated leniently. ``copies`` (a
    problem with copy groups under a limit): the floor also carries the resharded copies each
    decision makes live with its decided neighbours (``CopyTracker``), and a strategy whose copies
    would break the limit is skipped (any number of them, not only ``tries``); such a decode fits
    the limit, copies included, unless some node had no strategy left (then it went leniently)."""
    g = mp.g
    b = mp.belief(c, to_u, to_v)
    d = _Domains(g)
    cap = g.cap
    if d.floor is not None and d.floor.max(initial=0.0) > cap:
        d.alive[:] = True                       # only through forbidden strategies, if at all
        d.mc = np.minimum.reduceat(g.usage, g.offs[:-1])
        d.floor = g.profile_of(np.where(g.live_mask, d.mc, 0.0))
        if d.floor.max(initial=0.0) > cap:
            return None
    x, ec, xs = d.x, mp.ec, [0] * g.n       # xs: x as Python ints (nodes decide in index order)
    copies = mp.copy_tracker() if copies and d.floor is not None else None
    sx = [-1] * g.n                          # x for the copy tracker (−1: undecided)
    offs, ks, tlo, thi = g.offs.tolist(), g.k.tolist(), g.lo.tolist(), g.hi.tolist()
    timed = (g.live_mask & (g.hi > g.lo)).tolist() if d.floor is not None else [False] * g.n
    # free: a node's domain changes only when it is decided, so whether it is all alive is known now
    all_alive = np.logical_and.reduceat(d.alive, g.offs[:-1]).tolist() if d.free and g.n else None
    for i, terms in enumerate(mp.earlier()):
        lo, hi, ki = offs[i], offs[i + 1], ks[i]
        sc = b[lo:hi].copy()
        for j, idx, first, msl, from_u in terms:     # the decided neighbours' true edge costs
            if from_u:
                sc += ec[idx + xs[j]] - to_u[msl]
            else:
                sc += ec[first + xs[j] * ki: first + (xs[j] + 1) * ki] - to_v[msl]
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
