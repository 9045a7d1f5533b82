"""The factor-graph network's planning run (agent/fgnn.py's ``FGNN._run``): its jitted blocks of rounds
driven by ``bp_solve``'s schedule (``solvers.bp.PriceSchedule``), so that with zero learned corrections the
run is Lagrangian BP's: price points every ``bp.PRICE_EVERY`` rounds, the copy-priced phase (its cadence,
its ``COPY_ROUNDS`` times the rounds, the copies priced on the edge entries: the blocks read the edge costs
``A["ec"]`` the schedule leaves in ``mp.ec``), the decode points. The schedule's rule runs in numpy on the
beliefs fetched at each price point; the block of rounds is compiled once per cadence (5 and 2 rounds).
"""
from __future__ import annotations

import numpy as np


def scheduled_run(inputs, params, A, fns, sched, read_lam: bool, on_snap=None) -> tuple:
    """(final, carry): ``final`` = (c', to_u, to_v, ec) after the last round, c', to_u, to_v float64 numpy
    in the problem's cost units, ec the flat edge costs a decode of them uses (``mp.ec`` then: copy-priced
    in the copy-priced phase); ``carry`` the last padded (to_u, to_v, λ). ``on_snap`` gets the same tuple at
    each of the schedule's decode points, while the next block of rounds runs (jax dispatches it
    asynchronously). ``fns``: the jitted "block" and "readout" (``agent.fgnn._jit_fns``); ``A``: the padded
    float64 arrays; ``read_lam``: the rounds move λ (a live learned price correction), so the schedule reads
    it back from them (λ_net = λ·``_lam_unit``)."""
    import jax
    import jax.numpy as jnp
    mp, s = inputs.mp, inputs.scale
    g = mp.g
    S, U, V, N, Tg = inputs.sizes[0], inputs.sizes[1], inputs.sizes[2], inputs.sizes[3], inputs.sizes[6]
    unit, Tp = float(inputs.raw["_lam_unit"]), A["pmin"].shape[0]
    carry = tuple(jnp.zeros(A[k].shape[0], jnp.float64) for k in ("u_flat", "v_flat", "pmin"))

    def unpad(cp, tu, tv):
        cp, tu, tv = jax.device_get((cp, tu, tv))
        return (np.asarray(cp[:S], np.float64) * s, np.asarray(tu[:U], np.float64) * s,
                np.asarray(tv[:V], np.float64) * s, mp.ec)
    pending, r = [], 0
    while r < sched.total:
        stop = sched.next_stop(r)
        while r < stop:      # one compiled scan per cadence
            L = sched.price_every
            carry, cp = fns["block"](params, A, carry, np.int32(r), np.int32(min(L, stop - r)), length=L)
            r = min(r + L, stop)
        while pending:
            on_snap(pending.pop())
        if not sched.at_price(r):
            continue
        snap = unpad(cp, carry[0], carry[1])
        ratio = sched.ratio(g.seg_argmin(mp.belief(*snap[:3])), r)
        if sched.decodes(r) and on_snap is not None:
            pending.append(snap)
        sched.update(r, ratio, np.asarray(jax.device_get(carry[2]), np.float64)[:Tg] / unit if read_lam else None)
        carry = (carry[0], carry[1], jnp.asarray(np.concatenate([sched.lam * unit, np.zeros(Tp - Tg)])))
        if sched.cp is not None:     # the copies priced on their edge entries, as bp_solve's rounds see them
            A = {**A, "ec": jnp.asarray(np.concatenate([mp.ec / s, np.zeros(A["ec"].shape[0] - N)]))}
    out = fns["readout"](params, A, carry)
    while pending:
        on_snap(pending.pop())
    return unpad(out, carry[0], carry[1]), carry
