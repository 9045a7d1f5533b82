"""The proximal bundle step of ``solvers.lagrange.lagrangian_bound`` (``step="bundle"``): where to
put the memory prices λ next, from every relaxed plan seen so far rather than from the last one.

Each relaxed plan x gives an affine function of the prices, f_x(λ) = time(x) + λ·g(x) with
g_t(x) = node_t(x) + low_t(x) - cap (``solvers.lagrange``'s module docstring), and L(λ) <= f_x(λ)
for every x (L is a minimum over plans, or below it). The cutting-plane model M(λ) = min_x f_x(λ)
is therefore above L; the next prices maximise M(λ) - (u/2)|λ - c|² over λ >= 0 (a small QP,
HiGHS), c the best prices so far (the *centre*). A round whose bound rises by at least a tenth of
the model's predicted rise moves the centre there (a *serious* step; u halves when it rises by
half the prediction or more), otherwise it only adds its cut (a *null* step; u grows by half).
The bound stays what it was: only evaluated L(λ) are reported, the model only picks the prices,
so any cut, any u and any representatives keep it valid. The copy terms' representatives change
between rounds (``adapt``), so every cut's low_t(x) is recomputed with the current ones before
each QP (then each f_x is above the current L).

Scaling: μ_t = λ_t·cap/U and values /U (U the target or the first bound's size), so the QP's
numbers are O(1). The first step is ``FIRST_STEP`` times Polyak's (u = |g|²/(FIRST_STEP·(target - L))).
Why (session 17): the Polyak subgradient rule's L oscillates (vit tiny h100-2x8 at the 75 % cap:
-2.5e-4 at round 1, then 3.2e-5 / 4.9e-5 alternating) -- a target 20-40 % above the dual optimum
makes its steps too long. lagrangian_bound alone, a round count each (not seconds, so the load does
not decide), session 15's costs as targets, h100-2x8 at session 15's caps (results/s17a/lagrange_step.json,
FIRST_STEP 0.25 there), polyak -> bundle at 12 / 24 rounds: gpt tiny 25 % 4.704 -> 4.706e-4 / 4.998 ->
4.893e-4 (the bundle converged at 16), vit tiny 75 % 3.59 -> 5.00e-5 / 5.05 -> 5.58e-5, meshgraphnet
tiny 50 % 3.321 -> 3.440e-4 / 3.639 -> 3.717e-4, unet tiny 75 % 1.354 -> 1.410e-4 / 1.451 -> 1.652e-4.
In the core (bench_capped --compare lagrange_step=polyak, the 12 h100-2x8 cells of gpt/vit/unet/
meshgraphnet tiny at s15's caps, results/bench_capped_s17a_ab4c.json + _ab8.json, load 1.8-7.2): the
bound rose in 8 cells (gap e.g. unet 75 % 20.2 -> 10.5 %, gpt 75 % 28.6 -> 12.0 %, vit 75 % 41.2 ->
29.5 %) and fell in 4 (meshgraphnet 25/50/75 %, vit 25 %: its prices gave slower relaxed MILPs there,
5-13 rounds against 5-27); no cell reached 2 %.
"""
from __future__ import annotations

import highspy
import numpy as np
import scipy.sparse as sp

from solvers.ilp import new_highs

#: at most this many cuts in the model (the oldest go first)
MAX_CUTS = 60
#: the first step's length as a fraction of Polyak's toward the target. Best bound after 8 rounds
#: (h100-2x8, the rows below), FIRST_STEP 1 / 0.5 / 0.25 / the Polyak rule: gpt 4.71 / 4.61 / 4.33 /
#: 4.50e-4, vit 4.55 / 4.94 / 4.03 / 3.59e-5, meshgraphnet 3.47 / 3.30 / 3.27 / 3.28e-4, unet 1.23 / - /
#: 1.18 / 1.21e-4 (the in-core Lagrangian gets 3-8 rounds at load 5-7, 7-28 at load 1-5)
FIRST_STEP = 1.0


class Bundle:
    """The cuts (time(x), node profile of x, x) and the proximal parameter; ``next`` solves the QP."""

    def __init__(self, cap: float, scale: float):
        self.cap, self.U = float(cap), float(scale)
        self.c, self.node, self.plans = [], [], []
        self.u = None            # proximal weight in μ units (set by the first step)
        self.centre = None       # best prices (λ units) and their bound
        self.centre_L = -np.inf
        self.predicted = None    # the model's value at the last prices (λ units), for the step test

    def add(self, time_x: float, node_profile: np.ndarray, x: np.ndarray) -> None:
        self.c.append(float(time_x))
        self.node.append(np.asarray(node_profile, dtype=float))
        self.plans.append(np.asarray(x, dtype=np.int64))
        if len(self.c) > MAX_CUTS:
            del self.c[0], self.node[0], self.plans[0]

    def result(self, lam: np.ndarray, L: float) -> str:
        """Record L at ``lam`` (the last ``next``'s prices, or the start): "serious" or "null"."""
        if self.centre is None or self.predicted is None:
            if L > self.centre_L:
                self.centre, self.centre_L = lam.copy(), L
            return "serious"
        rise = self.predicted - self.centre_L
        if L >= self.centre_L + 0.1 * max(rise, 0.0) and L > self.centre_L:
            if L - self.centre_L >= 0.5 * rise:
                self.u *= 0.5
            self.centre, self.centre_L = lam.copy(), L
            return "serious"
        self.u *= 1.5
        return "null"

    def restart(self) -> np.ndarray:
        """New representatives: the centre is solved again and becomes the centre whatever its
        bound (the old one was for other copy terms); its prices."""
        self.predicted, self.centre_L = None, -np.inf
        return self.centre.copy()

    def next(self, low, target: float, time_limit_s: float = 5.0) -> tuple[np.ndarray, float]:
        """The next prices (λ units) and the model's predicted rise over the centre's bound;
        ``low(x)``: the copy lower profile of plan x at the current representatives. Only the
        time points where some cut's g is positive or the centre's price is can get a price (at
        the others every cut only falls as the price rises: 0 is optimal there)."""
        G = np.stack([n + low(x) - self.cap for n, x in zip(self.node, self.plans)]) / self.cap   # K x T
        C = np.asarray(self.c) / self.U
        mc = self.centre * self.cap / self.U
        if self.u is None:                  # Polyak's first step from the centre along its cut's subgradient
            g = G[-1] * ((mc > 0) | (G[-1] > 0))
            gap = max((target - self.centre_L) / self.U, 1e-9)
            self.u = max(float(g @ g) / (FIRST_STEP * gap), 1e-12)
        on = (G > 0).any(axis=0) | (mc > 0)
        mu = np.zeros_like(mc)
        if on.any():
            mu[on] = _prox_qp(G[:, on], C, mc[on], self.u, time_limit_s)
        z = float(np.min(C + G @ mu))
        self.predicted = z * self.U
        return mu * self.U / self.cap, self.predicted - self.centre_L


def _prox_qp(G: np.ndarray, C: np.ndarray, mc: np.ndarray, u: float, time_limit_s: float) -> np.ndarray:
    """argmax over μ >= 0 of min_k (C_k + G_k·μ) - (u/2)|μ - mc|² (HiGHS's QP, at most ``time_limit_s``),
    posed divided by u: min ½|μ|² - mc·μ - z/u, z <= C_k + G_k·μ. Posed as written (Hessian u·I, z's cost -1),
    HiGHS 1.16's QP solver ran to its limit once u was small: fno tiny tpu-4x4 at the 75 % cap, round 11,
    u = 0.00268, 11 cuts x 10 time points (2 ms per QP before that round), so the Lagrangian ended there
    and 5 s of the core's minute went nowhere (23 logged cells of sessions 25-27: fno tiny tpu-4x4 at 50 / 75 %,
    meshgraphnet tiny at 75 % on all three clusters); divided by u, ~2 ms, and the same maximiser to 9 digits
    where both finish (47 QPs of fno tiny tpu-4x4's Lagrangian at 25 / 50 %, one of which the old form lost)."""
    K, T = G.shape
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = T + 1, K
    lp.col_cost_ = np.r_[-mc, -1.0 / u]
    lp.col_lower_ = np.r_[np.zeros(T), -inf]
    lp.col_upper_ = np.full(T + 1, inf)
    lp.row_lower_ = np.full(K, -inf)
    lp.row_upper_ = C.astype(float)
    M = sp.csc_matrix(np.c_[-G, np.ones(K)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = M.indptr, M.indices, M.data
    hs = highspy.HighsHessian()
    hs.dim_, hs.format_ = T + 1, highspy.HessianFormat.kTriangular
    hs.start_ = np.r_[np.arange(T + 1), T].astype(np.int32)
    hs.index_ = np.arange(T, dtype=np.int32)
    hs.value_ = np.ones(T)
    model = highspy.HighsModel()
    model.lp_, model.hessian_ = lp, hs
    h = new_highs()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.passModel(model)
    h.run()
    x = np.asarray(h.getSolution().col_value, dtype=float)
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal or len(x) != T + 1:
        raise RuntimeError(f"bundle qp: {h.getModelStatus()}")
    return np.maximum(x[:T], 0.0)
