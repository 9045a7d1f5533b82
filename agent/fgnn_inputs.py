"""The factor-graph network's per-problem inputs (agent/fgnn.py): ``FGInputs.of(problem)`` prunes the
problem (``solvers.local.prune``, as ``bp_solve`` does), builds bp.py's index structure
(``bp.Messages``), divides costs by one scale per problem (the median positive node cost) and
usages by the cap (the greatest-usage peak when uncapped), and pads the arrays to shape buckets
(agent/fgnn_pack.py). ``raw_arrays`` is the unpadded dict; ``warm_hint`` the plain-base network's
optional Lagrangian-BP hint. ``tbase`` carries bp.py's price unit (``bp.price_base``) in the
network's units, so the network's Lagrangian rule is bp.py's exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.fgnn_pack import bucket_sizes, pack
from costmodel.problem import FORBIDDEN_COST, Problem
from solvers import bp
from solvers.local import LocalCosts, prune

WARM_ROUNDS = 60        # Lagrangian BP's rounds for the warm hint (the bp_lagrangian baseline's)


def warm_hint(problem: Problem) -> np.ndarray:
    """Per flat strategy of ``problem``: 1 at Lagrangian BP's plan (all 0 when it finds none)."""
    offs = np.asarray(problem.strategy_offsets, np.int64)
    out = np.zeros(int(offs[-1]))
    x = bp.bp_plan(problem, rounds=WARM_ROUNDS, memory_prices=True, pruned=False)
    if x is not None:
        out[offs[:-1] + np.asarray(x, np.int64)] = 1.0
    return out


def raw_arrays(mp, scale: float, hint: np.ndarray | None = None) -> dict:
    """One problem's unpadded network inputs from its ``bp.Messages`` (costs divided by ``scale``;
    ``hint``: ``warm_hint``'s array, zeros when None)."""
    g = mp.g
    S, n, m = len(g.cost), g.n, len(g.eu)
    U, V, N = int(mp.su[-1]), int(mp.sv[-1]), len(mp.ec)
    ec = mp.ec / scale
    # memory: profiles at the least / greatest usage of each node, over the cap
    us = g.usage
    umin = np.minimum.reduceat(us, g.offs[:-1]) if n else np.zeros(0)
    umax = np.maximum.reduceat(us, g.offs[:-1]) if n else np.zeros(0)
    live = g.live_mask
    pmin = g.profile_of(np.where(live, umin, 0.0)) if n else np.zeros(0)
    pmax = g.profile_of(np.where(live, umax, 0.0)) if n else np.zeros(0)
    Tg = len(g.times)
    cap = g.cap
    binds = float(cap is not None and Tg and pmin.max() <= cap < pmax.max())
    ref = float(cap) if cap is not None else float(pmax.max() if Tg and pmax.max() > 0 else 1.0)
    ref = ref if ref > 0 else 1.0
    base = bp.price_base(mp) * ref / scale       # bp.py's price unit in these units (λ_net = λ·ref/scale)
    if N:   # per-edge spread of the finite entries (a scale for the residual correction)
        emin = np.minimum.reduceat(ec, g.eoff[:-1])
        emax = np.maximum.reduceat(np.where(g.ec < FORBIDDEN_COST, ec, -np.inf), g.eoff[:-1])
        espr = np.maximum(np.where(np.isfinite(emax), emax - emin, 0.0), 0.0)
    else:
        espr = np.zeros(m)
    return {
        "c": mp.cost / scale, "un": us / ref, "node_of": g.node_of, "smask": np.ones(S), "sbinds": np.full(S, binds),
        "u_flat": mp.u_flat, "v_flat": mp.v_flat,
        "eu_slot": np.repeat(np.arange(m), g.k[g.eu]) if m else np.zeros(0, np.int64),
        "ev_slot": np.repeat(np.arange(m), g.k[g.ev]) if m else np.zeros(0, np.int64),
        "umask": np.ones(U), "vmask": np.ones(V), "row_slot": mp.row_slot, "col_slot": mp.col_slot, "ec": ec,
        "espr": espr, "lo": g.lo, "hi": g.hi, "live": live.astype(np.float64), "pmin": pmin / ref,
        "pmax": pmax / ref, "tmask": np.ones(Tg), "tbinds": np.full(Tg, binds), "tlam0": np.full(Tg, float(max(n, 1))),
        "tbase": np.full(Tg, base), "tcap": np.full(Tg, float(cap is not None)),
        "hint": np.zeros(S) if hint is None else np.asarray(hint, np.float64),
        "_sizes": {"S": S, "U": U, "V": V, "N": N, "n": n, "m": m, "T": Tg},
        "_lam_unit": ref / scale,      # λ_net = λ·_lam_unit (λ: bp.py's prices, cost per byte)
    }


@dataclass(frozen=True)
class FGInputs:
    """One problem's padded arrays (``arrays``: a dict for the jitted forward), the BP index
    structure they came from (``mp``), the pruned problem and the map of its plans back (``back``),
    the cost ``scale``, the unpadded ``raw`` arrays (for ``pack``) and the real sizes."""
    problem: Problem            # the (pruned) problem the network runs on
    back: object                # pruned plan -> original plan (None: not pruned)
    mp: object                  # bp.Messages of ``problem``
    scale: float
    arrays: dict
    raw: dict
    sizes: tuple                # (S, U, V, N, n, m, T) real sizes

    @classmethod
    def of(cls, problem: Problem, pruned: bool = True, coarse: bool = False, warm: bool = False) -> FGInputs:
        """``coarse``: power-of-2 buckets instead of √2; ``warm``: with ``warm_hint`` (on the pruned problem)."""
        back = None
        if pruned:
            problem, back = prune(problem)
        mp = bp.Messages(LocalCosts(problem))
        pos = np.abs(mp.cost[mp.cost != 0])
        scale = float(np.median(pos)) if len(pos) else 1.0
        if not scale > 0 or not np.isfinite(scale):
            scale = 1.0
        raw = raw_arrays(mp, scale, warm_hint(problem) if warm else None)
        sz = raw["_sizes"]
        arrays = pack([raw], bucket_sizes(sz, coarse))
        return cls(problem, back, mp, scale, arrays, raw, tuple(sz[k] for k in "SUVNnmT"))
