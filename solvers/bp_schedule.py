"""Lagrangian BP's schedule of memory prices, decodes and rounds, the one home of the rule that
``solvers.bp.bp_solve`` and the factor-graph network's planning run (``agent.fgnn.FGNN.plan``) both
follow, so that the network with zero learned corrections is Lagrangian BP exactly.

``PriceSchedule(mp, rounds, binding)`` over a ``bp.Messages`` ``mp``: the caller runs message rounds
and, after round r, asks ``at_price(r)``; at a price point it reads ``ratio(x)`` for the beliefs'
argmin plan x, decodes when ``decodes(r)`` (at the node costs ``c`` and edge costs ``mp.ec`` held
now), then calls ``update(r, ratio)``, which moves λ (``price_step``), may start the copy-priced phase
and leaves the priced node costs in ``c`` and the priced edge costs in ``mp.ec``. ``total`` is the
rounds to run (``COPY_ROUNDS`` times ``rounds`` once the copy-priced phase starts); ``next_stop(r)``
the next price point or ``total`` (the network runs the rounds between in one jitted call);
``restore()`` puts the true edge costs back in ``mp.ec``. See solvers/bp.py's docstring for why
each rule is what it is.

* Price points every ``price_every`` rounds (r < total) while the limit binds; the first one that
  finds neither an argmin plan over the limit nor a price > 0 switches the prices off for good.
* At the first price point the limit binds when the argmin plan's node usages break it, or, with copy groups,
  when they fit and its copies break it (``COPIES_BIND``, session 25: before, the node usages alone decided, so
  where only the copies broke the limit the prices stayed 0 and the run was plain BP's; see bp.py's docstring).
* At the first price point (r = ``price_every``), if the limit binds and the problem has copy groups
  on its edges (``solvers.bp_copies.copy_prices``), the copy-priced phase starts: prices every
  ``COPY_PRICE_EVERY`` rounds, decodes every ``COPY_DECODE_EVERY``, ``COPY_ROUNDS`` times the rounds in
  all, the rule reading the argmin plan's profile with its copies (``LocalCosts.profile``; before, its
  node usages alone, ``Messages.price_profile``), the copies priced on the edge entries that make them.
"""
from __future__ import annotations

import numpy as np

from solvers.bp_copies import copy_prices

PRICE_EVERY, DAMPING = 5, 0.5   # rounds between Lagrangian price updates (and decodes); message damping
PRICE_UP, PRICE_DECAY = 1.5, 0.8   # price_step's factors over and under the limit
COPY_PRICE_EVERY, COPY_DECODE_EVERY, COPY_ROUNDS = 2, 10, 3   # the same when the copies are priced (3x the rounds)
#: at the first price point, the argmin plan's copies may make the limit bind when its node usages fit (session 25;
#: False: the node usages alone decide, as before; experiments/bp_copies_ab.py compares the two)
COPIES_BIND = True


def price_step(lam, ratio, base, xp=np):
    """One Lagrangian price update (numpy, or ``xp=jax.numpy`` in agent/fgnn.py): where the argmin
    plan's profile is over the limit (``ratio`` = profile / limit > 1), λ ← max(PRICE_UP·λ, base·10·(ratio − 1));
    elsewhere λ ← PRICE_DECAY·λ."""
    return xp.where(ratio > 1.0, xp.maximum(lam * PRICE_UP, base * 10.0 * (ratio - 1.0)), lam * PRICE_DECAY)


def price_base(mp) -> float:
    """The price floor's unit: median |node cost| / median positive usage (cost per byte)."""
    pos = mp.g.usage[mp.g.usage > 0]
    cost_scale = float(np.median(np.abs(mp.cost)) + 1e-300) if len(mp.cost) else 1.0
    return cost_scale / (float(np.median(pos)) if len(pos) else 1.0)


class PriceSchedule:
    """The schedule's state: prices ``lam`` (cost per byte, per compressed time point), ``c`` (node
    costs priced at ``lam``; ``mp.cost`` itself while ``lam`` is 0), ``cp`` (the copy prices, None
    before the copy-priced phase), ``binding`` (prices still on), cadences and ``total``."""

    def __init__(self, mp, rounds: int, binding: bool, price_every: int = PRICE_EVERY,
                 decode_every: int | None = None):
        self.mp, self.g = mp, mp.g
        self.lam, self.base = np.zeros(len(self.g.times)), price_base(mp)
        self.price_every, self.decode_every = price_every, decode_every or price_every
        self.total, self.binding = rounds, bool(binding and self.g.cap is not None)
        self.cp, self.ec0, self.c = None, mp.ec, mp.cost

    def at_price(self, r: int) -> bool:
        return self.binding and r % self.price_every == 0 and r < self.total

    def decodes(self, r: int) -> bool:
        """Whether price point r also decodes (before its update)."""
        return r % self.decode_every == 0

    def next_stop(self, r: int) -> int:
        """The first price point after round r, or ``total`` when none comes first."""
        if not self.binding:
            return self.total
        return min((r // self.price_every + 1) * self.price_every, self.total)

    def ratio(self, x: np.ndarray, r: int | None = None) -> np.ndarray:
        """The profile the rule reads for the argmin plan ``x`` at price point ``r``, over the limit: its node
        usages before the copy-priced phase (with its copies at the first price point when only they break the
        limit, ``COPIES_BIND``), its profile with its copies in the phase."""
        if self.cp is not None:
            return self.g.profile(x) / self.g.cap
        ratio = self.mp.price_profile(x) / self.g.cap
        if COPIES_BIND and r == self.price_every and self.g.p.edge_memory is not None and not (ratio > 1.0).any():
            with_copies = self.g.profile(x) / self.g.cap
            return with_copies if (with_copies > 1.0).any() else ratio
        return ratio

    def update(self, r: int, ratio: np.ndarray, lam: np.ndarray | None = None) -> None:
        """The price update at price point r from ``ratio``; ``lam``: the prices the caller's rounds
        ended with, when they move them (the network's learned price correction), else ``self.lam``."""
        if lam is not None:
            self.lam = lam
        if not (ratio > 1.0).any() and not self.lam.any():
            self.binding = False           # the limit does not bind the beliefs: plain BP from here
        elif r == self.price_every and self.cp is None and (cp := copy_prices(self.g)) is not None:
            self.cp = cp                   # built once it binds
            self.price_every, self.decode_every = COPY_PRICE_EVERY, COPY_DECODE_EVERY
            self.total = COPY_ROUNDS * self.total
        self.lam = price_step(self.lam, ratio, self.base)
        self.c = self.priced()
        if self.cp is not None:
            self.mp.ec = np.minimum(self.ec0 + self.cp(self.lam), self.mp.big)

    def priced(self) -> np.ndarray:
        """Node costs plus usage × Σ λ over each node's live time points (``mp.cost`` while λ is 0)."""
        if not self.lam.any():
            return self.mp.cost
        g = self.g
        cum = np.concatenate([[0.0], np.cumsum(self.lam)])
        node_price = np.where(g.live_mask, cum[g.hi] - cum[g.lo], 0.0)
        return self.mp.cost + g.usage * node_price[g.node_of]

    def restore(self) -> None:
        """The true edge costs back in ``mp.ec`` (the unpriced decodes, the bound)."""
        self.mp.ec = self.ec0
