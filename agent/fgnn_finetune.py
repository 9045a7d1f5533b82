"""Fine-tuning the factor-graph network on one new problem within a wall-time budget
(``FGPlanner.finetune`` calls ``finetune``): the training steps of agent/fgnn_train.py on that
problem alone.

1. **Label**: the ILP plan of the problem (``fgnn_data.ilp_label``, cached; at most
   ``LABEL_SHARE`` of the budget; ``solve_guarded`` under a cap).
2. **Imitation** (``tune="readout"``, the default): the rounds' messages are computed once (they do
   not depend on the readout's parameters), then blocks of ``READOUT_STEPS`` Adam steps (one jitted
   scan, float64 as the planning forward) of the class-merged cross-entropy on the readout alone: the
   shared readout parameters (``READOUT``) and a per-(node, strategy) table of this problem (the
   parameters' ``agent.fgnn.TABLE`` term, in units of the node's belief spread; an instance-specific
   layer as in efficient active search, Hottung et al. 2022). The logits are teacher-forced on the
   decode's own scores: the belief plus, for every earlier node decided as the label, its true edge
   costs in place of its message (``solvers.bp_decode.forced_offsets``), which is what the masked
   decode ranks along the label. So a loss near 0 means the decode of the final beliefs follows the
   label, and the raw plan (the cheapest decode that fits) costs at most the label's.
   ``tune="all"``: Adam steps on every parameter through the rounds (the step of agent/fgnn_train.py),
   then steps 3 and 4.
3. **DAgger** (``tune="all"``): after each block of steps the network's raw plan is cut at ``cuts``
   fractions of the nodes; the prefix is fixed (``fgnn_data.restrict``) and the rest labelled by an
   ILP completion (``COMPLETION_S`` each); those conditioned problems join the steps.
4. **POMO-style REINFORCE** (``tune="all"``, ``reinforce=True``, after the label has been imitated):
   ``rollouts`` plans sampled per step from the network's per-node softmax over the (unforbidden)
   strategies; reward = −cost / the label's cost (a plan over the cap scores ``OVER_CAP_RATIO``);
   advantage = reward − the mean of the problem's rollouts (the shared per-problem baseline); loss =
   −Σ advantage · Σ_nodes log p(strategy).

Why the readout (session 24, experiments/finetune_bench.py, held-out problems where zero-shot is
over 1.02x, 60 s each, load 3-6, results/s24b_finetune_before.json): ``tune="all"`` ran one block in
60 s on all 8 (the label 11-34 s, the compiles of the training step and the live forward most of
the rest) and changed no raw plan. Readout-only steps without the table plateaued (fno tiny @ h100
cap 0.5: loss 1.08 after 2 blocks, then flat for 47 blocks, raw plan unchanged: the readout's
features cannot tell the nodes apart); with the table but scored on the final beliefs the loss
reached 0 and the raw plan still did not move (the decode replaces decided neighbours' messages
by their true edge costs); teacher-forced, it reached the label in 2 blocks on fno tiny, but not
on fno large (1.09x) until ``fgnn_data.same_class`` stopped merging strategies of equal usage and
different edges. Then all 8 reach their label within 17-35 s (results/s24b_finetune_after.json,
README "Fine-tuning, session 24"). So the raw decode after fine-tuning is the in-budget ILP label's
cost: no better than the label, and nothing gained where the label is no better than zero-shot.
The table is not part of a checkpoint: ``FGPlanner`` holds it per problem fingerprint.

Every block ends with the raw decode of the problem (``raw_cost``: the planner's, ``FGPlanner.plan(...,
polish=False)``, one forward pass + the masked decodes; default ``FGNN.plan``); the parameters kept
are those of the cheapest feasible raw plan seen, the zero-shot ones included, so fine-tuning never
makes the raw plan worse. Costs outside the steps count against the budget and can overrun it: the
label, and the first block's compiles (the rounds' block once, for ``FGNN.messages``, which the live
decode then reuses; the readout step and the live readout once each: 8-12 s of the first block at load 3-4).
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agent.fgnn import FGNN, TABLE, FGConfig, FGInputs
from agent.fgnn_data import ilp_label, restrict, same_class
from agent.fgnn_pack import bucket_sizes, pack
from agent.fgnn_train import Sample, Trainer, imitation_nll
from costmodel.problem import Problem, evaluate
from solvers.bp_decode import forced_offsets
from solvers.local import LocalCosts, Pruning

LABEL_SHARE = 0.4        # most of the budget for the problem's own ILP label
COMPLETION_S = 3.0       # each DAgger completion's ILP limit
STEPS_PER_BLOCK = 10
OVER_CAP_RATIO = 3.0     # REINFORCE's cost ratio of a sampled plan over the cap


READOUT = ("read", "gout", "logit_scale")   # the readout's parameters: what ``tune="readout"`` moves
READOUT_STEPS = 25      # Adam steps on the readout between two raw decodes (one jitted scan)
READOUT_LR = 3e-2


def _cost(problem: Problem, x) -> float:
    c = evaluate(problem, x)
    return c.total if c.feasible else float("inf")


def _pomo_loss(net: FGNN):
    def loss_fn(params, A, onehot, adv):
        """−Σ_k adv_k Σ_i w_i log p_i(x_ik): ``onehot`` (K, S) marks each rollout's strategies."""
        lg = net.logits(params, A)
        npad = A["lo"].shape[0]
        valid = (A["smask"] > 0) & (A["c"] < 1e12)
        lg = jnp.where(valid, lg, -1e30)
        m = jax.ops.segment_max(lg, A["node_of"], npad)
        m = jnp.where(m > -1e29, m, 0.0)
        lse = jnp.log(jax.ops.segment_sum(jnp.where(valid, jnp.exp(lg - m[A["node_of"]]), 0.0),
                                          A["node_of"], npad) + 1e-30) + m
        logp = jnp.where(valid, lg - lse[A["node_of"]], 0.0)
        per = onehot @ logp                                   # (K,) log-probability of each rollout
        return -(adv * per).sum() / onehot.shape[0] / jnp.maximum(A["w"].sum(), 1.0)
    return loss_fn


class _Pomo:
    """Jitted REINFORCE step on one padded problem, sharing the Trainer's optimizer state."""

    def __init__(self, tr: Trainer):
        self.tr = tr
        loss = _pomo_loss(tr.net)
        opt = tr.opt

        def step(params, opt_state, A, onehot, adv):
            val, grads = jax.value_and_grad(loss)(params, A, onehot, adv)
            upd, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, upd), opt_state, val
        self._step = jax.jit(step)
        self._logits = jax.jit(tr.net.logits)

    def step(self, s: Sample, A: dict, rollouts: int, rng) -> float:
        """One REINFORCE step with ``rollouts`` sampled plans of ``s``; returns their mean cost ratio."""
        lg = np.asarray(self._logits(self.tr.net.params, A), np.float64)
        S = len(s.raw["c"])
        node_of, c = s.raw["node_of"], s.raw["c"]
        lg = np.where(c[:S] < 1e12, lg[:S], -np.inf)
        offs = np.asarray(s.pruned.strategy_offsets, np.int64)
        g = -np.log(-np.log(rng.uniform(size=(rollouts, S))))        # Gumbel-max: a softmax sample per node
        xs = np.stack([np.lexsort((-(lg + gk), node_of))[offs[:-1]] - offs[:-1] for gk in g])
        pruned = s.pruned
        ratios = np.array([min(_cost(pruned, x) / s.label_cost, OVER_CAP_RATIO) for x in xs])
        adv = -(ratios - ratios.mean())
        onehot = np.zeros((rollouts, A["c"].shape[0]), np.float32)
        for k, x in enumerate(xs):
            onehot[k, offs[:-1] + x] = 1.0
        self.tr.net.params, self.tr.opt_state, _ = self._step(self.tr.net.params, self.tr.opt_state, A,
                                                             jnp.asarray(onehot), jnp.asarray(adv, jnp.float32))
        return float(ratios.mean())


def readout_targets(inputs: FGInputs, problem: Problem, plan) -> tuple:
    """(``inputs``' padded arrays with the imitation targets of ``plan`` (``cls``, ``w``: as
    ``fgnn_train.Sample``'s), ``plan`` on ``inputs``' problem: ``problem`` pruned as ``FGInputs.of``
    prunes it), or (None, None) if ``plan`` uses a pruned strategy."""
    x2 = Pruning(LocalCosts(problem)).from_orig(plan)
    if x2 is None:
        return None, None
    g = inputs.mp.g
    cls = same_class(inputs.problem, x2)
    choice = np.bincount(g.node_of, weights=cls, minlength=g.n) < g.k   # some strategy is another class
    raw = {**inputs.raw, "cls": cls.astype(np.float64), "w": choice.astype(np.float64)}
    return pack([raw], bucket_sizes(inputs.raw["_sizes"])), x2


@functools.lru_cache(maxsize=None)
def _readout_steps(hidden: int, base: str, lr: float, steps: int):
    """(optimizer, jitted ``steps`` Adam steps of the imitation loss on the readout's parameters alone,
    the rounds' final state ``carry`` given: (tuned, opt_state, frozen, A, carry) -> (tuned, opt_state, losses))."""
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))
    net = FGNN(FGConfig(rounds=1, hidden=hidden, base=base))

    def loss(tuned, frozen, A, carry):
        return imitation_nll(net.logits({**frozen, **tuned}, A, carry, A["forced"]), A)

    def run(tuned, opt_state, frozen, A, carry):
        def one(state, _):
            tuned, opt_state = state
            val, grads = jax.value_and_grad(loss)(tuned, frozen, A, carry)
            upd, opt_state = opt.update(grads, opt_state, tuned)
            return (optax.apply_updates(tuned, upd), opt_state), val
        (tuned, opt_state), vals = jax.lax.scan(one, (tuned, opt_state), None, length=steps)
        return tuned, opt_state, vals
    return opt, jax.jit(run)


def finetune(net: FGNN, problem: Problem, time_limit_s: float, seed: int = 0, lr: float | None = None,
             cuts=(0.25, 0.5, 0.75), reinforce: bool = False, rollouts: int = 8,
             max_blocks: int | None = None, tune: str = "readout", raw_cost=None) -> tuple[dict, list[dict]]:
    """(the best parameters by raw-decode cost, per-block stats) after ``time_limit_s`` (or
    ``max_blocks`` blocks of steps) of fine-tuning ``net`` on ``problem`` (see the module docstring);
    ``net`` itself is not changed."""
    t0 = time.perf_counter()
    deadline = t0 + float(time_limit_s)
    rng = np.random.default_rng(seed)
    inputs = FGInputs.of(problem, warm=net.config.warm)      # the decode's inputs: built once
    if raw_cost is None:
        def raw_cost(params):
            return _cost(problem, net.plan(problem, params=params, inputs=inputs))
    zero = raw_cost(net.params)
    best_params, best = net.params, zero
    stats = [{"block": 0, "raw_cost": zero, "elapsed_s": time.perf_counter() - t0}]
    lab = ilp_label(problem, max(1.0, min(LABEL_SHARE * time_limit_s, deadline - time.perf_counter())))
    if lab is None or not lab["cost"] > 0:
        return best_params, stats
    try:
        main = Sample(problem.name, problem, lab["plan"], lab["cost"], net.config.warm)
    except ValueError:
        return best_params, stats
    stats[0].update(label_cost=lab["cost"], label_s=time.perf_counter() - t0)
    if best <= lab["cost"] * 1.0005:
        return best_params, stats           # zero-shot is already the label's cost
    if tune == "readout":
        return _tune_readout(net, problem, inputs, lab, deadline, max_blocks, READOUT_LR if lr is None else lr,
                             stats, best, best_params, t0, raw_cost)
    tr = Trainer(net.config, lr=1e-2 if lr is None else lr, params=net.params)
    batches = [main.arrays()]
    pomo = _Pomo(tr) if reinforce else None
    A_main = batches[0]
    block = 0
    while time.perf_counter() < deadline and (max_blocks is None or block < max_blocks):
        block += 1
        losses = [tr.step(batches[j % len(batches)]) for j in range(STEPS_PER_BLOCK)
                  if time.perf_counter() < deadline]
        rec = {"block": block, "loss": float(np.mean(losses)) if losses else float("nan"),
               "samples": len(batches)}
        if pomo is not None and block > 1 and time.perf_counter() < deadline:
            rec["pomo_ratio"] = pomo.step(main, A_main, rollouts, rng)
        x = tr.net.plan(problem, inputs=inputs)    # DAgger's rollout: the network's own decode
        cost = raw_cost(tr.net.params)
        rec.update(raw_cost=cost, elapsed_s=time.perf_counter() - t0)
        stats.append(rec)
        if cost < best:
            best, best_params = cost, tr.net.params
        if cost <= lab["cost"] * 1.0005:
            break
        for f in cuts:                      # DAgger: the rest of the network's own plan, ILP-completed
            if time.perf_counter() + COMPLETION_S > deadline:
                break
            p2, _, _ = restrict(problem, np.arange(int(f * problem.num_nodes)), x)
            lab2 = ilp_label(p2, COMPLETION_S)
            if lab2 is None:
                continue
            try:
                s2 = Sample(f"{problem.name}|dagger{f:g}@{block}", p2, lab2["plan"], lab2["cost"], net.config.warm)
                batches.append(pack([s2.raw], main.bucket))
            except ValueError:              # a label through a pruned strategy, or larger than the shape
                continue
    stats[-1]["best_raw_cost"] = best
    return best_params, stats


def _tune_readout(net: FGNN, problem: Problem, inputs: FGInputs, lab: dict, deadline: float, max_blocks,
                  lr: float, stats: list, best: float, best_params, t0: float, raw_cost) -> tuple[dict, list[dict]]:
    """``finetune``'s imitation on the readout's parameters alone: the rounds' final state is computed
    once, then blocks of ``READOUT_STEPS`` Adam steps (one jitted scan), each followed by the real raw
    decode (``FGNN.plan``: the whole forward and the masked decodes) with the parameters so far."""
    A, x2 = readout_targets(inputs, problem, lab["plan"])
    if A is None:
        return best_params, stats
    tu, tv, carry, ec = net.messages(inputs)     # the rounds: fixed while the readout learns
    forced = np.zeros(A["c"].shape[0])                # the final decode's scores along the label (teacher forcing)
    forced[:len(inputs.mp.cost)] = forced_offsets(inputs.mp, tu, tv, x2, ec=ec) / inputs.scale
    opt, run = _readout_steps(net.config.hidden, net.config.base, float(lr), READOUT_STEPS)

    def f64(a):
        a = np.asarray(a)
        return jnp.asarray(a, jnp.float64) if np.issubdtype(a.dtype, np.floating) else jnp.asarray(a)
    with jax.enable_x64(True):   # float64, as the planning forward: on fno the beliefs span 1e6 cost scales
        A = {**{k: f64(v) for k, v in A.items()}, "forced": f64(forced)}
        carry = tuple(f64(c) for c in carry)
        tuned = jax.tree.map(f64, {**{k: net.params[k] for k in READOUT}, TABLE: np.zeros(len(forced))})
        frozen = jax.tree.map(f64, {k: v for k, v in net.params.items() if k not in tuned})
        opt_state = opt.init(tuned)
    block = 0
    while time.perf_counter() < deadline and (max_blocks is None or block < max_blocks):
        block += 1
        with jax.enable_x64(True):
            tuned, opt_state, losses = run(tuned, opt_state, frozen, A, carry)
            shared = jax.tree.map(lambda a: np.asarray(a, np.float32), {k: tuned[k] for k in READOUT})
            params = {**net.params, **shared, TABLE: np.asarray(tuned[TABLE], np.float64)}   # the table in float64
            loss, gout = float(losses[-1]), float(tuned["gout"])
        cost = raw_cost(params)
        stats.append({"block": block, "loss": loss, "raw_cost": cost, "gout": gout,
                      "elapsed_s": time.perf_counter() - t0})
        if cost < best:
            best, best_params = cost, params
        if cost <= lab["cost"] * 1.0005:
            break
    stats[-1]["best_raw_cost"] = best
    return best_params, stats
