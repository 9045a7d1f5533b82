"""The factor-graph network: learned min-sum message passing over a Problem's strategy graph.

It owns the network (``FGNN``: parameters, ``forward``), its padded per-problem inputs
(``FGInputs.of``) and the raw plan (``FGNN.plan``: one forward pass, then ``solvers.bp``'s masked
one-node-at-a-time decode with the learned messages in place of BP's).

One message per (edge direction, strategy), as in ``solvers.bp``. Costs are divided by one scale
per problem (the median positive node cost), so the network sees the same numbers whatever the
units. Round r (of ``rounds``), with beliefs b_i(s) = c'_i(s) + Σ incoming messages:

* **hard min**: m_{u→v}(t) = min_s [b_u(s) − m_{v→u}(s) + M_uv(s, t)] (bp.py's update, all edges at
  once as segment minima over the flat edge-cost entries);
* **soft min**: the same with −τ·log Σ exp(−x/τ), mixed in with a learned weight w_r (0: hard);
* **residual**: + g_r · spread_e · MLP(message features), g_r a learned gate per round;
* normalised to min 0 per edge and damped with a learned α_r = sigmoid(d_r) (d_r = 0: bp.py's 0.5).
* **memory prices** λ_t over the compressed time grid (only where the cap binds: the least-usage
  peak fits and the greatest-usage peak does not): λ ← λ + p_r · tanh(MLP(min, max, argmin and
  expected usage profiles over the cap, λ)) · (λ + λ0); node i pays u_i(s)/cap · Σ_{t∈live(i)} λ_t.
* **readout**: score_i(s) = b_i(s) + g_out · spread_i · MLP(node-strategy features).

With every gate, mixing weight, price gate and damping parameter at zero (``zero_corrections``)
the network is plain BP: its messages equal ``bp.Messages.update``'s (tests/test_fgnn.py, to
float32 rounding) and its plan equals ``bp_solve(memory_prices=False, pruned=True)``'s.

Shapes are padded to buckets (agent/fgnn_pack.py) so one compiled forward serves every problem of
a similar size; padded slots and entries point at a spare slot whose values are masked.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from agent.fgnn_pack import bucket_sizes, pack
from costmodel.limits import Limits
from costmodel.problem import FORBIDDEN_COST, Problem
from solvers import bp
from solvers.local import LocalCosts, fit_with_copies, prune

SOFT_TAU = 0.1          # soft-min temperature, in units of the problem's cost scale
NOFEAT_MSG = 6
NOFEAT_PRICE = 6
NOFEAT_READ = 5
NOFEAT_WARM = 6
WARM_ROUNDS = 60        # Lagrangian BP's rounds for the warm hint (the bp_lagrangian baseline's)
WARM_GATE0 = 4.0        # initial weight of the hint, in units of the node's belief spread


@dataclass(frozen=True)
class FGConfig:
    """Architecture: ``rounds`` of message passing, MLP ``hidden`` width; ``warm``: the inputs carry
    Lagrangian BP's plan (``solvers.bp.bp_plan`` with memory prices, ``WARM_ROUNDS`` rounds) as a
    per-strategy hint the readout may follow (checkpoints before it have ``warm`` False)."""
    rounds: int = 24
    hidden: int = 32
    seed: int = 0
    warm: bool = False

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "hidden": self.hidden, "seed": self.seed, "warm": self.warm, "kind": "fgnn"}

    @classmethod
    def from_dict(cls, d: dict) -> FGConfig:
        return cls(**{k: d[k] for k in ("rounds", "hidden", "seed", "warm") if k in d})


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
        "hint": np.zeros(S) if hint is None else np.asarray(hint, np.float64),
        "_sizes": {"S": S, "U": U, "V": V, "N": N, "n": n, "m": m, "T": Tg},
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


def _mlp_def(hidden: int):
    import flax.linen as nn

    class MLP(nn.Module):
        """Two hidden layers; the output layer starts at zero (the correction starts switched off)."""
        @nn.compact
        def __call__(self, x):
            x = nn.gelu(nn.Dense(hidden)(x))
            x = nn.gelu(nn.Dense(hidden)(x))
            return nn.Dense(1, kernel_init=nn.initializers.zeros)(x)[..., 0]
    return MLP()


@functools.lru_cache(maxsize=None)
def _jit_forward(hidden: int):
    import jax
    shell = FGNN.__new__(FGNN)
    shell.mlp = _mlp_def(hidden)
    return jax.jit(shell._forward)


def _symlog(x):
    import jax.numpy as jnp
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


class FGNN:
    """The network's definition and parameters; ``forward`` is jitted per padded shape."""

    def __init__(self, config: FGConfig | None = None, params=None):
        import jax
        import jax.numpy as jnp
        self.config = config or FGConfig()
        self.mlp = _mlp_def(self.config.hidden)
        if params is None:
            k1, k2, k3 = jax.random.split(jax.random.PRNGKey(self.config.seed), 3)
            T = self.config.rounds
            params = {
                "msg": self.mlp.init(k1, jnp.zeros((1, NOFEAT_MSG)))["params"],
                "price": self.mlp.init(k2, jnp.zeros((1, NOFEAT_PRICE)))["params"],
                "read": self.mlp.init(k3, jnp.zeros((1, NOFEAT_READ)))["params"],
                "warm": self.mlp.init(jax.random.fold_in(k3, 1), jnp.zeros((1, NOFEAT_WARM)))["params"],
                "wgate": jnp.array(WARM_GATE0 if self.config.warm else 0.0),
                "damp": jnp.zeros(T), "soft": jnp.zeros(T), "gate": jnp.full(T, 0.1),
                "pgate": jnp.full(T, 0.1), "gout": jnp.array(0.1), "logit_scale": jnp.array(1.0),
            }
        self.params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)   # strong float32: no retrace
        self._fwd = _jit_forward(self.config.hidden)   # shared by every FGNN of this width (compiled once a shape)

    @staticmethod
    def zero_corrections(params):
        """The same parameters with every learned correction switched off: plain BP."""
        import jax.numpy as jnp
        out = dict(params)
        for k in ("damp", "soft", "gate", "pgate"):
            out[k] = jnp.zeros_like(params[k])
        out["gout"] = jnp.zeros_like(params["gout"])
        out["wgate"] = jnp.zeros_like(params["wgate"])
        return out

    @staticmethod
    def complete(config: FGConfig, params: dict) -> dict:
        """``params`` (e.g. a checkpoint's) with the entries added since it was written taken from a
        fresh network without the warm hint (``wgate`` 0): an older checkpoint plans as before."""
        fresh = FGNN(FGConfig(config.rounds, config.hidden, config.seed, warm=False)).params
        return {**fresh, **params}

    @staticmethod
    def bp_messages(params):
        """The ablation: learned prices and readout kept, the messages plain BP's."""
        import jax.numpy as jnp
        out = dict(params)
        for k in ("damp", "soft", "gate"):
            out[k] = jnp.zeros_like(params[k])
        return out

    # ---- the forward pass ----
    def _forward(self, params, A):
        """(score per flat strategy, to_u, to_v), all in units of the cost scale, padded."""
        import jax
        import jax.numpy as jnp
        seg_min = jax.ops.segment_min
        seg_max = jax.ops.segment_max
        seg_sum = jax.ops.segment_sum
        Sp, Up, Vp = A["c"].shape[0], A["u_flat"].shape[0], A["v_flat"].shape[0]
        npad, mpad, Tp = A["lo"].shape[0], A["espr"].shape[0], A["pmin"].shape[0]
        T = params["damp"].shape[0]
        mlp = self.mlp
        c, un, smask = A["c"], A["un"], A["smask"]
        umask, vmask = A["umask"], A["vmask"]
        tbinds = A["tbinds"]
        node_of = A["node_of"]
        big = jnp.float32(3e38)

        def belief(cp, to_u, to_v):
            return cp + seg_sum(to_u * umask, A["u_flat"], Sp) + seg_sum(to_v * vmask, A["v_flat"], Sp)

        def node_price(lam):
            cum = jnp.concatenate([jnp.zeros(1), jnp.cumsum(lam * A["tmask"])])
            return A["live"] * (cum[A["hi"]] - cum[A["lo"]])

        def priced(lam):
            return c + un * node_price(lam)[node_of]

        def profile(usage_node):
            acc = jnp.zeros(Tp + 1).at[A["lo"]].add(usage_node * A["live"]).at[A["hi"]].add(-usage_node * A["live"])
            return jnp.cumsum(acc)[:-1]

        def seg_argmin_usage(b):
            m = seg_min(jnp.where(smask > 0, b, big), node_of, npad)
            first = seg_min(jnp.where((b <= m[node_of]) & (smask > 0), jnp.arange(Sp), Sp), node_of, npad)
            return seg_sum(jnp.where(jnp.arange(Sp) == first[node_of], un, 0.0), node_of, npad)

        def expected_usage(b):
            m = seg_min(jnp.where(smask > 0, b, big), node_of, npad)
            d = jnp.where(smask > 0, b - m[node_of], 50.0)     # no inf on padded slots (NaN-free gradients)
            w = jnp.where(smask > 0, jnp.exp(-jnp.clip(d, 0.0, 50.0)), 0.0)
            z = seg_sum(w, node_of, npad)
            return seg_sum(w * un, node_of, npad) / jnp.maximum(z, 1e-30)

        def msg(x, seg, nseg, seg_edge, mask, round_feats, r):
            gate, soft_w = round_feats
            hard = seg_min(x, seg, nseg)
            hard = jnp.where(jnp.isfinite(hard) & (hard < big), hard, 0.0)
            z = seg_sum(jnp.exp(-jnp.minimum((x - hard[seg]) / SOFT_TAU, 80.0)), seg, nseg)
            soft = hard - SOFT_TAU * jnp.log(jnp.maximum(z, 1.0))
            new = hard + soft_w * (soft - hard)
            new = (new - seg_min(jnp.where(mask > 0, new, big), seg_edge, mpad)[seg_edge]) * mask
            spread = seg_max(new, seg_edge, mpad)[seg_edge]
            return new, spread

        def rnd(carry, xs):
            to_u, to_v, lam = carry
            damp, soft_w, gate, pgate, r = xs
            # memory prices from the profiles
            cp = priced(lam)
            b = belief(cp, to_u, to_v)
            pa = jax.lax.stop_gradient(profile(seg_argmin_usage(b)))
            pe = profile(expected_usage(b))
            pf = jnp.stack([A["pmin"], A["pmax"], pa, pe, _symlog(lam / A["tlam0"]),
                            jnp.broadcast_to(r / T, (Tp,))], 1)
            lam = lam + tbinds * pgate * jnp.tanh(mlp.apply({"params": params["price"]}, pf)) * (lam + A["tlam0"]) \
                * A["tmask"]
            cp = priced(lam)
            b = belief(cp, to_u, to_v)
            hu = b[A["u_flat"]] - to_u
            hv = b[A["v_flat"]] - to_v
            new_u, spr_u = msg(hv[A["col_slot"]] + A["ec"], A["row_slot"], Up, A["eu_slot"], umask, (gate, soft_w), r)
            new_v, spr_v = msg(hu[A["row_slot"]] + A["ec"], A["col_slot"], Vp, A["ev_slot"], vmask, (gate, soft_w), r)
            fu = jnp.stack([_symlog(new_u), _symlog(to_u), _symlog(cp[A["u_flat"]]), un[A["u_flat"]],
                            _symlog(A["espr"][A["eu_slot"]]), jnp.broadcast_to(r / T, (Up,))], 1)
            fv = jnp.stack([_symlog(new_v), _symlog(to_v), _symlog(cp[A["v_flat"]]), un[A["v_flat"]],
                            _symlog(A["espr"][A["ev_slot"]]), jnp.broadcast_to(r / T, (Vp,))], 1)
            new_u = new_u + gate * spr_u * mlp.apply({"params": params["msg"]}, fu) * umask
            new_v = new_v + gate * spr_v * mlp.apply({"params": params["msg"]}, fv) * vmask
            a = jax.nn.sigmoid(damp)
            return (a * to_u + (1 - a) * new_u, a * to_v + (1 - a) * new_v, lam), None

        xs = (params["damp"], params["soft"], params["gate"], params["pgate"], jnp.arange(T, dtype=jnp.float32))
        init = (jnp.zeros(Up), jnp.zeros(Vp), jnp.zeros(Tp))
        (to_u, to_v, lam), _ = jax.lax.scan(rnd, init, xs)
        cp = priced(lam)
        b = belief(cp, to_u, to_v)
        m = seg_min(jnp.where(smask > 0, b, big), node_of, npad)
        d = jnp.maximum(b - m[node_of], 0.0)
        spread = seg_max(jnp.where(smask > 0, jnp.minimum(d, 1e6), 0.0), node_of, npad)[node_of]
        fr = jnp.stack([_symlog(d), _symlog(c), un, _symlog(spread), A["sbinds"]], 1)
        c_out = cp + params["gout"] * spread * mlp.apply({"params": params["read"]}, fr)
        # the warm hint: Lagrangian BP's choice gets a learned bonus wgate * spread * (1 + MLP)
        fw = jnp.concatenate([fr, A["hint"][:, None]], 1)
        bonus = params["wgate"] * (spread + 1.0) * (1.0 + mlp.apply({"params": params["warm"]}, fw))
        c_out = c_out - A["hint"] * smask * bonus
        return c_out, to_u, to_v

    def forward(self, inputs: FGInputs, params=None):
        """(unary score c', to_u, to_v) as float64 numpy, unpadded, in the problem's cost units: the
        decode's belief is c' + the incoming messages."""
        import jax
        S, U, V = inputs.sizes[:3]
        c_out, tu, tv = jax.device_get(self._fwd(self.params if params is None else params, inputs.arrays))
        s = inputs.scale
        return (np.asarray(c_out[:S], np.float64) * s, np.asarray(tu[:U], np.float64) * s,
                np.asarray(tv[:V], np.float64) * s)

    def logits(self, params, arrays):
        """Per flat strategy, the imitation logits −scale·log1p(belief − node min) (padded, jnp)."""
        import jax
        import jax.numpy as jnp
        c_out, tu, tv = self._forward(params, arrays)
        Sp = arrays["c"].shape[0]
        b = c_out + jax.ops.segment_sum(tu * arrays["umask"], arrays["u_flat"], Sp) \
            + jax.ops.segment_sum(tv * arrays["vmask"], arrays["v_flat"], Sp)
        npad = arrays["lo"].shape[0]
        m = jax.ops.segment_min(jnp.where(arrays["smask"] > 0, b, 3e38), arrays["node_of"], npad)
        d = jnp.maximum(b - m[arrays["node_of"]], 0.0)
        return -jnp.exp(params["logit_scale"]) * jnp.log1p(d / 0.01)

    # ---- planning ----
    def plan(self, problem: Problem, memory_cap_bytes=None, params=None, inputs: FGInputs | None = None) -> list[int]:
        """One forward pass and bp.py's masked decode with the learned scores and messages; the
        plan of the original problem (strategy indices). Honours ``memory_cap_bytes`` (or the
        problem's usage limit, whichever is lower) whenever the least-usage plan fits; a decode whose
        resharded copies (``Problem.edge_memory``) break the cap is repaired with them priced
        (``solvers.local.fit_with_copies``, as ``bp_solve`` does), and returned as decoded if that fails."""
        problem = Limits.of(memory_cap_bytes=memory_cap_bytes).apply(problem)   # tightens, never relaxes
        inputs = inputs or FGInputs.of(problem, warm=self.config.warm)
        c, tu, tv = self.forward(inputs, params)
        x = bp.decode(inputs.mp, c, tu, tv)
        if x is None:
            raise ValueError(f"no plan of {problem.name!r} fits the memory cap {problem.usage_limit:.4g} bytes")
        if inputs.back is not None:
            x = inputs.back(x)
        # as bp_solve's decode: a plan whose resharded copies break the cap is repaired with them priced
        fixed = fit_with_copies(problem, x) if problem.edge_memory is not None else None
        return [int(v) for v in (x if fixed is None else fixed)]
