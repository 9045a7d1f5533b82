"""The factor-graph network: learned min-sum message passing over a Problem's strategy graph.

It owns the network (``FGNN``: parameters, the rounds, the readout) and the raw plan
(``FGNN.plan``: one forward pass, then ``solvers.bp``'s masked one-node-at-a-time decode with the
learned messages in place of BP's). Its padded per-problem inputs are agent/fgnn_inputs.py's, its
array helpers agent/fgnn_ops.py's. Planning computes only the corrections that can be non-zero (``live_parts``).

One message per (edge direction, strategy), as in ``solvers.bp``. Costs are divided by one scale
per problem (the median positive node cost), so the network sees the same numbers whatever the
units. Round r (of ``rounds``), with beliefs b_i(s) = c'_i(s) + Σ incoming messages:

* **learned price correction**: λ ← λ + p_r · tanh(MLP(min, max, argmin and expected usage
  profiles over the cap, λ)) · (λ + λ0), only where the cap binds (the least-usage peak fits and the
  greatest-usage peak does not); node i pays u_i(s)/cap · Σ_{t∈live(i)} λ_t;
* **hard min**: m_{u→v}(t) = min_s [b_u(s) − m_{v→u}(s) + M_uv(s, t)] (bp.py's update, all edges at
  once as segment minima over the flat edge-cost entries);
* **soft min**: the same with −τ·log Σ exp(−x/τ), mixed in with a learned weight w_r (0: hard);
* **residual**: + g_r · tanh(MLP(message features)): bounded by |g_r| cost scales whatever the
  problem (``base="plain"`` checkpoints: g_r · spread_e · MLP, unbounded: edge spreads reach 1e6 scales);
* normalised to min 0 per edge and damped with a learned α_r = sigmoid(d_r) (d_r = 0: bp.py's 0.5);
* **Lagrangian prices** (``base="lagrangian"``, the default): ``bp_solve``'s schedule, rule and cadence
  (``bp.PriceSchedule``, solvers/bp_schedule.py) between jitted blocks of rounds in ``plan``: prices every
  ``bp.PRICE_EVERY`` rounds from the argmin plan's node usages; with copy groups, once the cap binds, the
  copy-priced phase (the copies priced on the edge entries that make them, prices every ``COPY_PRICE_EVERY``
  rounds, ``COPY_ROUNDS`` times the rounds; rounds past ``rounds`` use the last round's parameters); decodes
  where bp_solve decodes (plain and copy-aware, and plain BP's), the cheapest that fits after ``fit_with_copies``.
* **readout**: score_i(s) = b_i(s) + g_out · tanh(MLP(node-strategy features)) (plain: · spread_i),
  + table(i, s) · (spread_i + 1) when the parameters hold one problem's fine-tuned ``TABLE``.

**Zero corrections** (``zero_corrections``: every gate, mixing weight, price gate and damping parameter at
zero; an untrained network too, as every MLP's output layer starts at zero) is Lagrangian BP: its plan is
``bp_solve(rounds=config.rounds)``'s, copy-priced phase included (tests/test_fgnn.py; plain BP's for
``base="plain"`` or uncapped), computed in float64 from float64 inputs. The differentiable training forward
(``logits``) is not that run where the problem has copy groups: one jit, node-usage prices every
``bp.PRICE_EVERY`` rounds for ``rounds`` rounds, no copy-priced phase, float32, no decodes, and it never
switches the rule off once the plan fits and λ is 0 (bp.py does; λ then stays 0 unless the argmin plan goes over).

Shapes are padded to buckets (agent/fgnn_pack.py): one compiled forward serves similar sizes.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from agent.fgnn_inputs import FGInputs, raw_arrays, warm_hint
from agent.fgnn_ops import argmin_usage, belief, expected_usage, node_min, priced, profile, symlog
from agent.fgnn_pack import pack, padded_sizes
from agent.fgnn_run import scheduled_run
from costmodel.limits import Limits
from costmodel.problem import Problem
from solvers import bp

__all__ = ["FGConfig", "FGInputs", "FGNN", "raw_arrays", "warm_hint"]

SOFT_TAU = 0.1          # soft-min temperature, in units of the problem's cost scale
NOFEAT_MSG = 6
NOFEAT_PRICE = 6
NOFEAT_READ = 5
NOFEAT_WARM = 6
WARM_GATE0 = 4.0        # initial weight of the hint, in units of the node's belief spread
BASES = ("lagrangian", "plain")


@dataclass(frozen=True)
class FGConfig:
    """Architecture: ``rounds`` of message passing (60: the bp_lagrangian baseline's), MLP ``hidden``
    width; ``base``: what zero corrections are, "lagrangian" (BP with bp.py's memory prices and
    decodes, bounded corrections) or "plain" (plain BP, spread-scaled corrections: every checkpoint
    written before session 7); ``warm`` (plain only): the inputs carry Lagrangian BP's plan as a
    per-strategy hint the readout may follow."""
    rounds: int = 60
    hidden: int = 32
    seed: int = 0
    warm: bool = False
    base: str = "lagrangian"

    def __post_init__(self):
        if self.base not in BASES:
            raise ValueError(f"FGConfig.base must be one of {BASES}, got {self.base!r}")
        if self.warm and self.base != "plain":
            raise ValueError("FGConfig.warm needs base='plain' (base='lagrangian' is Lagrangian BP already)")
        if self.rounds < 1:
            raise ValueError(f"FGConfig.rounds must be >= 1, got {self.rounds}")

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "hidden": self.hidden, "seed": self.seed, "warm": self.warm,
                "base": self.base, "kind": "fgnn"}

    @classmethod
    def from_dict(cls, d: dict) -> FGConfig:
        """A checkpoint's config; one without ``base`` predates it: "plain"."""
        kw = {k: d[k] for k in ("rounds", "hidden", "seed", "warm", "base") if k in d}
        kw.setdefault("base", "plain")
        return cls(**kw)


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


PARTS = frozenset({"price", "soft", "msg", "read"})   # the learned corrections (``live_parts``)
ROUND_PARTS = frozenset({"price", "soft", "msg"})     # those inside the rounds ("read" is the readout's)
TABLE = "table"     # the parameters' optional per-(node, strategy) readout term of ONE problem (fine-tuning's)


@functools.lru_cache(maxsize=None)
def _jitted(hidden: int, base: str, parts: frozenset, name: str):
    """FGNN method ``name`` computing only ``parts``' corrections, jitted (compiled once a shape; the
    block of rounds once per ``length`` too)."""
    import jax
    shell = FGNN.__new__(FGNN)
    shell.mlp, shell.base, shell.parts = _mlp_def(hidden), base, parts
    return jax.jit(getattr(shell, name), static_argnames=("length",) if name == "_block_out" else ())


def _jit_fns(hidden: int, base: str, parts: frozenset = PARTS) -> dict:
    """The jitted block of rounds, readout and training forward, each keyed by the ``parts`` it uses."""
    return {"block": _jitted(hidden, base, frozenset(parts & ROUND_PARTS), "_block_out"),
            "readout": _jitted(hidden, base, frozenset(parts & {"read"}), "_readout"),
            "forward": _jitted(hidden, base, frozenset(parts), "_forward")}


def live_parts(params) -> frozenset:
    """The corrections of PARTS that can be non-zero: a gated MLP term is exactly 0 when its gates are
    0 or its MLP's last layer (zero-initialised) still is, the soft-min's when its weights are 0. The
    planning forward skips the others (the same numbers, 5x faster untrained: tests/test_fgnn.py)."""
    def on(gate, mlp):
        last = mlp[max(mlp, key=lambda k: int(k.rsplit("_", 1)[-1]))]
        return bool(np.any(np.asarray(gate))) and any(np.any(np.asarray(v)) for v in last.values())
    live = {"soft": bool(np.any(np.asarray(params["soft"]))), "msg": on(params["gate"], params["msg"]),
            "price": on(params["pgate"], params["price"]),
            "read": on(params["gout"], params["read"]) or any(np.any(np.asarray(params.get(k, 0))) for k in ("wgate", TABLE))}
    return frozenset(k for k, v in live.items() if v)


class FGNN:
    """The network's definition and parameters; its jitted pieces are shared per (width, base)."""

    def __init__(self, config: FGConfig | None = None, params=None):
        import jax
        import jax.numpy as jnp
        self.config = config or FGConfig()
        self.base = self.config.base
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
        self.parts = PARTS              # the training forward (``logits``) computes every correction
        self._fns = _jit_fns(self.config.hidden, self.base)

    @staticmethod
    def zero_corrections(params):
        """The same parameters with every learned correction switched off: Lagrangian BP (plain BP
        for ``base="plain"``)."""
        import jax.numpy as jnp
        out = dict(params)
        for k in ("damp", "soft", "gate", "pgate", "gout", "wgate"):
            out[k] = jnp.zeros_like(params[k])
        return out

    @staticmethod
    def complete(config: FGConfig, params: dict) -> dict:
        """``params`` (e.g. a checkpoint's) with the entries added since it was written taken from a
        fresh network without the warm hint (``wgate`` 0): an older checkpoint plans as before."""
        fresh = FGNN(FGConfig(config.rounds, config.hidden, config.seed, warm=False, base=config.base)).params
        return {**fresh, **params}

    @staticmethod
    def bp_messages(params):
        """The ablation: learned prices and readout kept, the messages plain BP's."""
        import jax.numpy as jnp
        out = dict(params)
        for k in ("damp", "soft", "gate"):
            out[k] = jnp.zeros_like(params[k])
        return out

    # ---- the rounds ----
    def _round(self, params, A, carry, r, on):
        """Round r (traced; ``on`` false: the state left as it is). Rounds past the ``rounds`` learned
        (the copy-priced phase's, ``bp.COPY_ROUNDS`` times them) use the last round's parameters."""
        import jax
        import jax.numpy as jnp
        seg_min, seg_max = jax.ops.segment_min, jax.ops.segment_max
        Up, Vp, Tp, mpad = A["u_flat"].shape[0], A["v_flat"].shape[0], A["pmin"].shape[0], A["espr"].shape[0]
        T = params["damp"].shape[0]
        i = jnp.minimum(r, T - 1)
        damp, soft_w, gate, pgate = params["damp"][i], params["soft"][i], params["gate"][i], params["pgate"][i]
        mlp, umask, vmask, big = self.mlp, A["umask"], A["vmask"], jnp.float32(3e38)
        to_u, to_v, lam = carry
        rf, lam2 = r.astype(jnp.float32) / T, lam
        if "price" in self.parts:     # learned price correction from the profiles
            b = belief(A, priced(A, lam), to_u, to_v)
            pa = jax.lax.stop_gradient(profile(A, argmin_usage(A, b)))
            pe = profile(A, expected_usage(A, b))
            pf = jnp.stack([A["pmin"], A["pmax"], pa, pe, symlog(lam / A["tlam0"]), jnp.broadcast_to(rf, (Tp,))], 1)
            lam2 = lam + A["tbinds"] * pgate * jnp.tanh(mlp.apply({"params": params["price"]}, pf)) \
                * (lam + A["tlam0"]) * A["tmask"]
        cp = priced(A, lam2)
        b = belief(A, cp, to_u, to_v)
        hu, hv = b[A["u_flat"]] - to_u, b[A["v_flat"]] - to_v

        def msg(x, seg, nseg, seg_edge, mask):
            hard = seg_min(x, seg, nseg)
            hard = jnp.where(jnp.isfinite(hard) & (hard < big), hard, 0.0)
            new = hard
            if "soft" in self.parts:
                z = jax.ops.segment_sum(jnp.exp(-jnp.minimum((x - hard[seg]) / SOFT_TAU, 80.0)), seg, nseg)
                new = hard + soft_w * (-SOFT_TAU * jnp.log(jnp.maximum(z, 1.0)))
            new = (new - seg_min(jnp.where(mask > 0, new, big), seg_edge, mpad)[seg_edge]) * mask
            return new, seg_max(new, seg_edge, mpad)[seg_edge]

        new_u, spr_u = msg(hv[A["col_slot"]] + A["ec"], A["row_slot"], Up, A["eu_slot"], umask)
        new_v, spr_v = msg(hu[A["row_slot"]] + A["ec"], A["col_slot"], Vp, A["ev_slot"], vmask)
        if "msg" in self.parts:
            fu = jnp.stack([symlog(new_u), symlog(to_u), symlog(cp[A["u_flat"]]), A["un"][A["u_flat"]],
                            symlog(A["espr"][A["eu_slot"]]), jnp.broadcast_to(rf, (Up,))], 1)
            fv = jnp.stack([symlog(new_v), symlog(to_v), symlog(cp[A["v_flat"]]), A["un"][A["v_flat"]],
                            symlog(A["espr"][A["ev_slot"]]), jnp.broadcast_to(rf, (Vp,))], 1)
            cu, cv = mlp.apply({"params": params["msg"]}, fu), mlp.apply({"params": params["msg"]}, fv)
            cu, cv = (spr_u * cu, spr_v * cv) if self.base == "plain" else (jnp.tanh(cu), jnp.tanh(cv))
            new_u, new_v = new_u + gate * cu * umask, new_v + gate * cv * vmask
        a = jax.nn.sigmoid(damp)
        new = (a * to_u + (1 - a) * new_u, a * to_v + (1 - a) * new_v, lam2)
        return tuple(jnp.where(on, x, y).astype(y.dtype) for x, y in zip(new, carry))

    def _block(self, params, A, carry, r0, n, length: int):
        """Rounds r0 ... r0 + n − 1 (n ≤ ``length``, the scan's static length; the rest left off)."""
        import jax
        import jax.numpy as jnp
        carry, _ = jax.lax.scan(lambda c, j: (self._round(params, A, c, r0 + j, j < n), None), carry,
                                jnp.arange(length, dtype=jnp.int32))
        return carry

    def _block_out(self, params, A, carry, r0, n, length: int):
        return (carry := self._block(params, A, carry, r0, n, length)), priced(A, carry[2])

    def _readout(self, params, A, carry):
        """The unary score c' per flat strategy (the decode's belief is c' + the incoming messages)."""
        import jax
        import jax.numpy as jnp
        to_u, to_v, lam = carry
        mlp, smask = self.mlp, A["smask"]
        cp = priced(A, lam)
        if "read" not in self.parts:
            return cp
        b = belief(A, cp, to_u, to_v)
        d = jnp.maximum(b - node_min(A, b)[A["node_of"]], 0.0)
        spread = jax.ops.segment_max(jnp.where(smask > 0, jnp.minimum(d, 1e6), 0.0), A["node_of"],
                                     A["lo"].shape[0])[A["node_of"]]
        fr = jnp.stack([symlog(d), symlog(A["c"]), A["un"], symlog(spread), A["sbinds"]], 1)
        out = mlp.apply({"params": params["read"]}, fr)
        if self.base != "plain":
            c_out = cp + params["gout"] * jnp.tanh(out)
        else:
            c_out = cp + params["gout"] * spread * out
            fw = jnp.concatenate([fr, A["hint"][:, None]], 1)   # the warm hint: a learned bonus at Lagrangian BP's choice
            bonus = params["wgate"] * (spread + 1.0) * (1.0 + mlp.apply({"params": params["warm"]}, fw))
            c_out = c_out - A["hint"] * smask * bonus
        if TABLE in params:       # one problem's fine-tuned table (agent/fgnn_finetune.py), in node-spread units
            c_out = c_out + params[TABLE] * (spread + 1.0) * smask
        return c_out

    def _forward(self, params, A):
        """The differentiable forward, one jit: (c', to_u, to_v), padded, in cost-scale units. Not the
        planning run where the problem has copy groups: the Lagrangian rule on node usages alone, every
        ``bp.PRICE_EVERY`` rounds for ``rounds`` rounds, no copy-priced phase (see the module docstring)."""
        import jax
        import jax.numpy as jnp
        T, P = params["damp"].shape[0], bp.PRICE_EVERY

        def outer(carry, blk):
            carry = self._block(params, A, carry, blk * P, T - blk * P, P)
            if self.base != "lagrangian":
                return carry, None
            to_u, to_v, lam = carry
            ratio = jax.lax.stop_gradient(profile(A, argmin_usage(A, belief(A, priced(A, lam), to_u, to_v))))
            on = (A["tcap"] > 0) & ((blk + 1) * P < T)
            lam = jnp.where(on, bp.price_step(lam, ratio, A["tbase"], jnp), lam) * A["tmask"]
            return (to_u, to_v, lam), None
        init = (jnp.zeros(A["u_flat"].shape[0]), jnp.zeros(A["v_flat"].shape[0]), jnp.zeros(A["pmin"].shape[0]))
        carry, _ = jax.lax.scan(outer, init, jnp.arange(-(-T // P), dtype=jnp.int32))
        return self._readout(params, A, carry), carry[0], carry[1]

    def _run(self, inputs: FGInputs, params, on_snap=None, sched=None):
        """(final, carry) of the planning run (agent/fgnn_run.py): bp_solve's schedule (``sched``, a
        ``bp.PriceSchedule``; default a fresh one) between jitted blocks of rounds, in float64 from float64 inputs
        (the training forward is float32), only the ``live_parts``."""
        import jax
        import jax.numpy as jnp
        with jax.enable_x64(True):     # float64, as bp.py: costs spanning 1e6 scales make float32 break ties
            params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), self.params if params is None else params)
            A = pack([inputs.raw], padded_sizes(inputs.arrays), np.float64)   # not the float32 arrays: bp's numbers
            sched = sched or bp.PriceSchedule(inputs.mp, self.config.rounds, self.base == "lagrangian")
            live = live_parts(params)
            try:
                return scheduled_run(inputs, params, A, _jit_fns(self.config.hidden, self.base, live), sched,
                                     "price" in live, on_snap)
            finally:
                sched.restore()        # ``inputs`` may plan again

    def forward(self, inputs: FGInputs, params=None):
        """(unary score c', to_u, to_v) after the last round, float64 numpy, unpadded, in the
        problem's cost units: the decode's belief is c' + the incoming messages (at the edge costs of
        the last round: copy-priced in bp_solve's copy-priced phase)."""
        return self._run(inputs, params)[0][:3]

    def messages(self, inputs: FGInputs, params=None) -> tuple:
        """(to_u, to_v as ``forward``'s, the padded last-round state the readout reads, the flat edge costs the
        final decode uses: copy-priced in bp_solve's copy-priced phase): none depends on the readout."""
        (_, tu, tv, ec), carry = self._run(inputs, params)
        return tu, tv, carry, ec

    def logits(self, params, arrays, carry=None, offset=None):
        """Per flat strategy, the imitation logits −scale·log1p(belief + ``offset`` − node min) (padded,
        jnp); with ``carry`` (``messages``') the readout alone runs on it, no rounds."""
        import jax.numpy as jnp
        c_out, tu, tv = self._forward(params, arrays) if carry is None else \
            (self._readout(params, arrays, carry), carry[0], carry[1])
        b = belief(arrays, c_out, tu, tv) + (0.0 if offset is None else offset)
        d = jnp.maximum(b - node_min(arrays, b)[arrays["node_of"]], 0.0)
        return -jnp.exp(params["logit_scale"]) * jnp.log1p(d / 0.01)

    # ---- planning ----
    def plan(self, problem: Problem, memory_cap_bytes=None, params=None, inputs: FGInputs | None = None,
             cadence: tuple = (bp.PRICE_EVERY, None)) -> list[int]:
        """One forward pass and bp.py's masked decode of its beliefs after the last round and at each
        price update (as ``bp_solve``); each decode that breaks the cap by its resharded copies is
        repaired with them priced (``fit_with_copies``); the cheapest that fits is returned; if none
        fits, the same on the unpruned problem (as ``bp_solve``), then the last decode as it is. Honours ``memory_cap_bytes`` (or the problem's usage
        limit, whichever is lower) whenever the least-usage plan fits; ValueError when no decode
        exists (the least-usage plan breaks the cap). No polish, no refine. ``cadence``: the schedule's
        (price_every, decode_every) at the start; the unpruned rerun starts at the one the first run ended with,
        as bp_solve's."""
        problem = Limits.of(memory_cap_bytes=memory_cap_bytes).apply(problem)   # tightens, never relaxes
        inputs = inputs or FGInputs.of(problem, warm=self.config.warm)
        cands = bp.Candidates(problem, inputs.back)
        variants = (False, True) if self.base == "lagrangian" and problem.usage_limit is not None \
            and problem.edge_memory is not None else (False,)

        queue = bp.DecodeQueue(inputs.mp, cands.add)   # the decodes, run together (the same plans, in order)

        def consider(cand):
            c, tu, tv, ec = cand
            for copies in variants:      # as bp_solve: the plain decode and the copy-aware one
                queue.add(c, tu, tv, copies, ec)
        sched = bp.PriceSchedule(inputs.mp, self.config.rounds, self.base == "lagrangian", *cadence)
        consider(self._run(inputs, params, on_snap=consider, sched=sched)[0])
        if self.base == "lagrangian" and problem.usage_limit is not None:   # as bp_solve: plain BP's decodes too
            consider((inputs.mp.cost, *inputs.mp.unpriced(self.config.rounds), inputs.mp.ec))
        queue.flush()
        best, last = cands.best()[0], cands.last
        if best is None and inputs.back is not None:     # as bp_solve: only plans through pruned strategies fit
            params = None if params is None else {k: v for k, v in params.items() if k != TABLE}  # the pruned one's
            return self.plan(problem, params=params, inputs=FGInputs.of(problem, pruned=False, warm=self.config.warm),
                             cadence=(sched.price_every, sched.decode_every))
        if best is None and last is None:
            raise ValueError(f"no plan of {problem.name!r} fits the memory cap {problem.usage_limit:.4g} bytes")
        return [int(v) for v in (last if best is None else best)]
