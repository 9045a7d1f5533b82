"""Research ablations of the sharding agent: what each design choice buys, against the ILP optimum.

    python experiments/ablate.py --all                                  # every ablation, small budgets
    python experiments/ablate.py --ablation depth --values 2,4,6 --updates 30 --seeds 0
    python experiments/ablate.py --ablation beam --values 1,8,64        # no-RL baseline, no training
    wandb sweep experiments/sweep.yaml && wandb agent ID                # the same knobs as a wandb sweep

Ablations (``--ablation NAME --values a,b,c``; every other knob at its default, see ``AblationConfig``):
* ``depth``: GNN message-passing rounds (``PPOConfig.rounds``).
* ``action_features``: ``on`` (all), ``static`` (the dynamic action features -- resharding to decided
  neighbours, incremental cost, peak rise, best-incremental flag, chosen flag -- zeroed), ``off``
  (every action feature but "valid" zeroed). Done by a gymnasium wrapper that masks the columns of
  ``obs["action_features"]`` before the policy sees them, in training and in decoding. With ``off``
  the policy head gets the same input for every strategy of a node, so its logits tie: greedy
  decoding takes the first valid strategy and sampling is uniform (that is the point of the row).
* ``reward``: env objective weights, ``time`` or ``+``-joined terms with optional weights, e.g.
  ``time+memory`` (time 1, memory 1) or ``time+redundancy=0.5`` (see env/sharding_env.py).
  Evaluated like every row on time cost / ILP(time); the ``peak/ILP`` column shows what the
  memory term buys (peak memory relative to the time-optimal ILP plan's).
* ``decoding``: ``greedy`` (argmax), ``sample`` (best of ``samples`` draws), ``sample+polish``
  (the same, each polished by agent/planner.py's local search), ``greedy+polish``.
* ``imitation``: ``off`` / ``on``: behaviour cloning (agent/imitation.py) on teacher plans of the
  training problems for ``bc_seconds`` before PPO. Teacher: ``agent.ppo.heuristic_for`` (the cheapest
  feasible polished baseline; also PPO's reward scale, so it is computed once) or, with
  ``teacher="ilp"``, the better of it and the ILP plan (``ilp_seconds`` per problem). BC time is
  extra training compute, recorded in ``train_time_s``.
* ``beam``: the no-RL baseline ``agent.beam.beam_search`` at the given widths (no training).

Each run: train a small policy with agent.ppo (``updates`` PPO updates, or ``minutes``) on a fixed
list of TRAIN-split problems (``env.workloads.train_workloads()``, each uncapped and under the
memory-cap fractions ``train_caps``), then plan every held-out problem (``heldout_workloads()`` x
``eval_caps``) and compare with the ILP optimum (``shardgym.solve(method="ilp")``, ``ilp_seconds``;
a "time_limit" status means the incumbent, not a proven optimum; cached per problem in the
results file). Metrics: cost / ILP cost (median, max over problems), feasibility rate of the
final plans (after memory repair) and of the raw decodes, peak memory / ILP plan's peak, planning
time (median; the first call of a new network shape includes jit compilation). Runs with the same
training knobs share one trained policy within a process (e.g. every ``decoding`` value).

Results: ``results/ablate.json`` (every run's config, seed, git revision, metrics, per-problem rows,
training curve; written after each run, atomically), ``results/ablate.png`` (bar chart), a printed
table and its markdown version. Resumable: a run whose key (ablation=value@seed) is already in the
file with the same config is skipped unless ``--force``. Ctrl-C stops after writing what is done.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from agent.planner import Planner  # noqa: E402

ABLATIONS = {
    "depth": ("rounds", ["2", "4", "6"]),
    "action_features": ("action_features", ["on", "static", "off"]),
    "reward": ("reward", ["time", "time+memory", "time+redundancy"]),
    "decoding": ("decoding", ["greedy", "sample", "sample+polish"]),
    "imitation": ("imitation", ["off", "on"]),
    "beam": ("beam_width", ["1", "8", "64"]),
}
"""ablation name -> (the AblationConfig field it varies, its default values for --all)."""

DECODINGS = ("greedy", "greedy+polish", "sample", "sample+polish")
FEATURE_MODES = ("on", "static", "off")
DYNAMIC_ACTION_FEATURES = ("reshard_decided", "incremental", "peak_rise", "best_incremental", "chosen")
RESULTS_NAME = "ablate"


@dataclass(frozen=True)
class AblationConfig:
    """One ablation run. Fields not named by the ablation keep these defaults."""

    ablation: str = "baseline"
    """Name of the ablation (a key of ABLATIONS, "baseline" or "sweep")."""
    value: str = "default"
    """The value of the varied knob, as given on the command line."""
    seed: int = 0
    """Seeds PPO (init, sampling, env resets), BC and sampled decoding."""
    method: str = "ppo"
    """"ppo" (train and decode a policy) or "beam" (agent.beam.beam_search, no training)."""
    updates: int = 20
    """PPO updates per training run."""
    minutes: float | None = None
    """Optional wall-time cap on PPO (stops at whichever of updates / minutes comes first)."""
    hidden: int = 32
    """GNN width (PPOConfig.hidden)."""
    rounds: int = 4
    """GNN message-passing rounds (PPOConfig.rounds): the depth ablation."""
    num_envs: int = 4
    """Environments per rollout (PPOConfig.num_envs)."""
    num_steps: int = 16
    """Steps per environment per update (PPOConfig.num_steps)."""
    epochs: int = 2
    """PPO epochs per rollout."""
    minibatches: int = 2
    """PPO minibatches per epoch."""
    learning_rate: float = 3e-4
    """AdamW learning rate for PPO."""
    random_start: float = 0.75
    """PPOConfig.random_start: share of episodes started mid-way after a heuristic prefix."""
    action_features: str = "on"
    """"on" | "static" | "off": which action-feature columns the policy sees (module docstring)."""
    reward: str = "time"
    """Env objective weights: "+"-joined terms, each "name" (weight 1) or "name=w" (module docstring)."""
    imitation: bool = False
    """Behaviour-clone teacher plans before PPO."""
    teacher: str = "heuristic"
    """"heuristic" or "ilp": the imitation teacher."""
    bc_seconds: float = 45.0
    """Wall-time budget of behaviour cloning."""
    bc_epochs: int = 20
    """Maximum BC epochs (whichever of bc_epochs / bc_seconds ends first)."""
    demo_steps: int = 32
    """Demonstration steps kept per training problem."""
    decoding: str = "greedy"
    """"greedy" | "greedy+polish" | "sample" | "sample+polish"."""
    samples: int = 8
    """K for sampled decoding (the cheapest feasible of K draws)."""
    polish_time_s: float = 0.5
    """Local-search budget per plan for the +polish decodings."""
    beam_width: int = 8
    """Beam width for method "beam"."""
    train_caps: tuple = (None, 0.5)
    """Memory-cap fractions (None = uncapped) applied to each TRAIN workload."""
    train_limit: int = 0
    """Use only the first N training problems (0 = all); tests use 1."""
    eval_caps: tuple = (None, 0.5)
    """Memory-cap fractions applied to each held-out workload."""
    eval_limit: int = 0
    """Evaluate only the first N held-out problems (0 = all)."""
    ilp_seconds: float = 30.0
    """Time limit of each ILP reference solve."""

    def key(self) -> str:
        return f"{self.ablation}={self.value}@seed{self.seed}"

    def weights(self) -> dict:
        return parse_reward(self.reward)

    def training_key(self) -> tuple:
        """The fields that determine the trained policy (runs sharing it share one training)."""
        names = ("seed", "updates", "minutes", "hidden", "rounds", "num_envs", "num_steps", "epochs", "minibatches",
                 "learning_rate", "random_start", "action_features", "reward", "imitation", "teacher", "bc_seconds",
                 "bc_epochs", "demo_steps", "train_caps", "train_limit")
        return tuple((n, getattr(self, n)) for n in names) + (("weights", tuple(sorted(self.weights().items()))),)

    def validate(self) -> AblationConfig:
        if self.method not in ("ppo", "beam"):
            raise ValueError(f"method must be 'ppo' or 'beam', got {self.method!r}")
        if self.action_features not in FEATURE_MODES:
            raise ValueError(f"action_features must be one of {FEATURE_MODES}, got {self.action_features!r}")
        if self.decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {self.decoding!r}")
        if self.teacher not in ("heuristic", "ilp"):
            raise ValueError(f"teacher must be 'heuristic' or 'ilp', got {self.teacher!r}")
        for name in ("updates", "rounds", "hidden", "num_envs", "num_steps", "epochs", "minibatches", "samples",
                     "beam_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("train_caps", "eval_caps"):
            for c in getattr(self, name):
                if c is not None and not (0.0 <= c <= 1.0):
                    raise ValueError(f"{name} entries must be None or a fraction in [0, 1], got {c!r}")
        self.weights()
        return self


def parse_reward(spec: str) -> dict:
    """"time+memory=0.5" -> {"time": 1.0, "memory": 0.5, "redundancy": 0.0, "balance": 0.0}."""
    from env.sharding_env import DEFAULT_WEIGHTS
    w = {k: 0.0 for k in DEFAULT_WEIGHTS}
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward must be a string like 'time+memory=0.5', got {spec!r}")
    for tok in spec.split("+"):
        name, _, val = tok.strip().partition("=")
        if name not in w:
            raise ValueError(f"unknown reward term {name!r} in {spec!r}; terms are {', '.join(w)}")
        try:
            x = float(val) if val else 1.0
        except ValueError:
            raise ValueError(f"reward term {tok!r} in {spec!r}: weight must be a number") from None
        if not (x >= 0 and math.isfinite(x)):
            raise ValueError(f"reward term {tok!r} in {spec!r}: weight must be finite and >= 0")
        w[name] = x
    if sum(w.values()) <= 0:
        raise ValueError(f"reward {spec!r} has no positive weight")
    return w


def config_for(ablation: str, value: str, base: AblationConfig) -> AblationConfig:
    """``base`` with the knob of ``ablation`` set from its string ``value``."""
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")
    value = str(value).strip()
    cfg = dataclasses.replace(base, ablation=ablation, value=value)
    try:
        if ablation == "depth":
            cfg = dataclasses.replace(cfg, rounds=int(value))
        elif ablation == "action_features":
            cfg = dataclasses.replace(cfg, action_features=value)
        elif ablation == "reward":
            cfg = dataclasses.replace(cfg, reward=value)
        elif ablation == "decoding":
            cfg = dataclasses.replace(cfg, decoding=value)
        elif ablation == "imitation":
            if value not in ("on", "off"):
                raise ValueError("use 'on' or 'off'")
            cfg = dataclasses.replace(cfg, imitation=value == "on")
        elif ablation == "beam":
            cfg = dataclasses.replace(cfg, method="beam", beam_width=int(value))
    except ValueError as exc:
        raise ValueError(f"bad value {value!r} for ablation {ablation!r}: {exc}") from None
    return cfg.validate()


# ---- observation masking (the action-features ablation) ----------------------------------------------
def feature_keep_mask(mode: str) -> np.ndarray | None:
    """Per action-feature column, 1 to keep and 0 to zero; None for "on" (keep all)."""
    from env.features import ACTION_FEATURES
    if mode == "on":
        return None
    if mode == "static":
        return np.array([0.0 if f in DYNAMIC_ACTION_FEATURES else 1.0 for f in ACTION_FEATURES], np.float32)
    if mode == "off":
        return np.array([1.0 if f == "valid" else 0.0 for f in ACTION_FEATURES], np.float32)
    raise ValueError(f"action_features must be one of {FEATURE_MODES}, got {mode!r}")


def make_env(problems, cfg: AblationConfig):
    """A ShardingEnv over ``problems`` with the run's reward weights, its action features masked
    per ``cfg.action_features`` (a gymnasium ObservationWrapper that multiplies a fresh copy of
    ``action_features``; the env's own arrays are never touched)."""
    import gymnasium as gym

    from env.sharding_env import ShardingEnv
    env = ShardingEnv(workloads=problems, weights=cfg.weights(), copy_obs=False)
    keep = feature_keep_mask(cfg.action_features)
    if keep is None:
        return env

    class MaskActionFeatures(gym.ObservationWrapper):
        def observation(self, obs):
            out = dict(obs)
            out["action_features"] = obs["action_features"] * keep
            return out

    return MaskActionFeatures(env)


# ---- problems and the ILP reference ------------------------------------------------------------------
def _cap_label(frac) -> str:
    return "uncapped" if frac is None else f"cap{frac:g}"


def train_problems(cfg: AblationConfig) -> list:
    from env.workloads import Workload, train_workloads
    out = []
    for w in train_workloads():
        for c in cfg.train_caps:
            out.append(Workload(w.model, w.size, w.cluster, None, c).build())
    return out[:cfg.train_limit] if cfg.train_limit else out


def eval_problems(cfg: AblationConfig) -> list[tuple[str, object]]:
    """[(key, Problem)] of the held-out set; key = problem name + cap label."""
    from env.workloads import Workload, heldout_workloads
    out = []
    for w in heldout_workloads():
        for c in cfg.eval_caps:
            p = Workload(w.model, w.size, w.cluster, None, c).build()
            out.append((f"{p.name}/{_cap_label(c)}", p))
    return out[:cfg.eval_limit] if cfg.eval_limit else out


def ilp_reference(key: str, problem, seconds: float, cache: dict) -> dict:
    """The ILP optimum of ``problem`` (time objective), cached in ``cache[key]`` (results JSON)."""
    hit = cache.get(key)
    if hit is not None and hit.get("time_limit_s", 0) >= seconds - 1e-9 and hit.get("total") is not None:
        return hit
    import shardgym
    from costmodel.problem import evaluate
    t0 = time.perf_counter()
    try:
        plan = shardgym.solve(problem, method="ilp", objective="time", time_limit_s=seconds)
        c = evaluate(problem, plan.strategies)
        info = plan.info if isinstance(getattr(plan, "info", None), dict) else {}
        rec = {"total": c.total, "feasible": c.feasible, "peak_memory_bytes": c.peak_memory_bytes,
               "redundant_memory_bytes": c.redundant_memory_bytes, "status": str(info.get("status", "")),
               "solve_time_s": time.perf_counter() - t0, "time_limit_s": seconds, "num_nodes": problem.num_nodes}
    except ValueError as exc:   # infeasible under the cap
        rec = {"total": None, "error": f"{type(exc).__name__}: {exc}"[:300], "time_limit_s": seconds,
               "solve_time_s": time.perf_counter() - t0}
    cache[key] = rec
    return rec


# ---- training ----------------------------------------------------------------------------------------
def ppo_config(cfg: AblationConfig):
    from agent.ppo import PPOConfig
    return PPOConfig(seed=cfg.seed, hidden=cfg.hidden, rounds=cfg.rounds, num_envs=cfg.num_envs,
                     num_steps=cfg.num_steps, epochs=cfg.epochs, minibatches=cfg.minibatches,
                     learning_rate=cfg.learning_rate, random_start=cfg.random_start, wandb=False)


def init_params_jit(pcfg, env):
    """Initial parameters from the key and first observation ``PPOTrainer`` uses, but with
    ``model.init`` under jax.jit (the trainer's un-jitted init compiles op by op: ~30 s on 2 busy
    cores). Same distribution; values may differ from the eager init in the last float bits."""
    import jax
    import jax.numpy as jnp

    from agent.gnn import model_input
    from agent.ppo import make_model, pad_inputs
    _, init_key = jax.random.split(jax.random.PRNGKey(pcfg.seed))
    obs, _ = env.reset(seed=pcfg.seed)
    x = {k: jnp.asarray(v[0]) for k, v in pad_inputs([model_input(obs)]).items()}
    return jax.jit(make_model(pcfg).init)(init_key, x)


def _teacher(problem, cfg: AblationConfig):
    from agent.ppo import heuristic_for
    from costmodel.problem import evaluate
    plan = heuristic_for(problem)
    if cfg.teacher == "ilp":
        try:
            from solvers.ilp import solve_ilp
            s, _ = solve_ilp(problem, objective="time", time_limit_s=cfg.ilp_seconds)
            if evaluate(problem, s).feasible and (plan is None or evaluate(problem, s).total <= evaluate(problem, plan).total):
                plan = np.asarray(s)
        except ValueError:
            pass
    return plan


def train_policy(cfg: AblationConfig, log=None, progress=None) -> tuple[object, dict]:
    """Train a policy for ``cfg``; returns (PPOTrainer, info). ``log(stats, step)`` gets every update's
    stats; ``progress(done, total, msg)`` is called after each update. KeyboardInterrupt propagates."""
    from agent.imitation import behaviour_cloning, demonstrations
    from agent.ppo import PPOTrainer
    t0 = time.perf_counter()
    problems = train_problems(cfg)
    pcfg = ppo_config(cfg)
    env_fn = lambda: make_env(problems, cfg)  # noqa: E731
    trainer = PPOTrainer(pcfg, env_fn=env_fn, params=init_params_jit(pcfg, env_fn()))
    info: dict = {"train_problems": len(problems)}
    if cfg.imitation:
        demos = []
        for j, p in enumerate(problems):
            plan = _teacher(p, cfg)
            if plan is None:
                continue
            try:
                demos += demonstrations(make_env(p, cfg), plan, seed=cfg.seed + j, keep=cfg.demo_steps)
            except ValueError:   # the teacher picks a strategy the env's mask forbids: skip it
                continue
        hist = behaviour_cloning(trainer, demos, epochs=cfg.bc_epochs, batch_size=32, time_limit_s=cfg.bc_seconds,
                                 seed=cfg.seed, log=(lambda r: log(r, None)) if log else None)
        info.update(bc_steps=len(demos), bc_epochs=len(hist), bc_accuracy=hist[-1]["bc/accuracy"] if hist else None)
    curve = []
    t_ppo = time.perf_counter()
    for u in range(cfg.updates):
        if cfg.minutes is not None and time.perf_counter() - t_ppo > 60 * cfg.minutes:
            break
        st = trainer.update()
        curve.append({k: st[k] for k in ("update", "charts/episodic_return", "charts/cost_ratio", "losses/entropy",
                                         "charts/update_s") if k in st})
        if log:
            log(st, u + 1)
        if progress:
            progress(u + 1, cfg.updates, f"ret {st.get('charts/episodic_return', float('nan')):.3f}")
    info.update(updates_done=trainer.update_count, train_time_s=time.perf_counter() - t0, curve=curve)
    return trainer, info


class AblationPlanner(Planner):
    """``agent.planner.Planner`` over a trainer's params whose env applies the run's reward weights
    and action-feature mask (only the ``_env`` hook is overridden)."""

    def __init__(self, trainer, cfg: AblationConfig):
        super().__init__(trainer.params, trainer.config, source=f"ablate:{cfg.key()}", update=trainer.update_count)
        self.ablation_config = cfg

    def _env(self, problem):
        return make_env(problem, self.ablation_config)


# ---- one run -----------------------------------------------------------------------------------------
def plan_problem(cfg: AblationConfig, problem, planner=None) -> tuple[list[int], dict]:
    """(plan, info) for one problem under the run's method/decoding; info has plan_time_s, raw_feasible."""
    from costmodel.problem import evaluate
    if cfg.method == "beam":
        from agent.beam import beam_search
        t0 = time.perf_counter()
        plan = beam_search(problem, width=cfg.beam_width)
        return plan, {"plan_time_s": time.perf_counter() - t0, "raw_feasible": evaluate(problem, plan).feasible}
    sampled = cfg.decoding.startswith("sample")
    plan, info = planner.plan(problem, mode="sample" if sampled else "greedy", samples=cfg.samples if sampled else 1,
                              polish=cfg.decoding.endswith("+polish"), seed=cfg.seed, polish_time_limit_s=cfg.polish_time_s,
                              return_info=True)
    raw = any(c["raw_feasible"] for c in info["candidates"])
    return plan, {"plan_time_s": info["plan_time_s"], "raw_feasible": bool(raw)}


def evaluate_run(cfg: AblationConfig, problems, ilp_cache: dict, planner=None, progress=None) -> tuple[dict, list]:
    from costmodel.problem import evaluate
    rows = []
    for j, (key, p) in enumerate(problems):
        ref = ilp_reference(key, p, cfg.ilp_seconds, ilp_cache)
        try:
            plan, info = plan_problem(cfg, p, planner)
            c = evaluate(p, plan)
            row = {"problem": key, "nodes": p.num_nodes, "cost": c.total, "feasible": c.feasible,
                   "raw_feasible": info["raw_feasible"], "plan_time_s": info["plan_time_s"],
                   "peak_memory_bytes": c.peak_memory_bytes, "ilp_cost": ref.get("total"),
                   "ilp_status": ref.get("status", ref.get("error", ""))}
        except ValueError as exc:   # no plan fits the cap
            row = {"problem": key, "nodes": p.num_nodes, "cost": None, "feasible": False, "raw_feasible": False,
                   "plan_time_s": None, "error": str(exc)[:300], "ilp_cost": ref.get("total")}
        if row.get("cost") is not None and ref.get("total"):
            row["ratio"] = row["cost"] / ref["total"]
            if ref.get("peak_memory_bytes"):
                row["peak_ratio"] = row["peak_memory_bytes"] / ref["peak_memory_bytes"]
        rows.append(row)
        if progress:
            progress(j + 1, len(problems), key)
    return summarise(rows), rows


def summarise(rows: list[dict]) -> dict:
    """Metrics over per-problem rows: ratios over feasible plans with an ILP reference."""
    ratios = [r["ratio"] for r in rows if r.get("ratio") is not None and r["feasible"]]
    peaks = [r["peak_ratio"] for r in rows if r.get("peak_ratio") is not None and r["feasible"]]
    times = [r["plan_time_s"] for r in rows if r.get("plan_time_s") is not None]
    n = max(len(rows), 1)
    return {"problems": len(rows),
            "median_cost_ratio": float(np.median(ratios)) if ratios else None,
            "max_cost_ratio": float(np.max(ratios)) if ratios else None,
            "mean_cost_ratio": float(np.mean(ratios)) if ratios else None,
            "feasible_rate": sum(bool(r["feasible"]) for r in rows) / n,
            "raw_feasible_rate": sum(bool(r["raw_feasible"]) for r in rows) / n,
            "median_peak_ratio": float(np.median(peaks)) if peaks else None,
            "median_plan_time_s": float(np.median(times)) if times else None,
            "max_plan_time_s": float(np.max(times)) if times else None}


_TRAINED: dict = {}


def run_one(cfg: AblationConfig, ilp_cache: dict, wandb_mode: str = "offline", progress=None,
            problems=None) -> dict:
    """Train (or reuse a policy trained in this process for the same training knobs), evaluate,
    log to wandb; returns the result record."""
    from experiments.common import git_rev
    cfg.validate()
    problems = eval_problems(cfg) if problems is None else problems
    run = _wandb_init(cfg, wandb_mode)
    log = (lambda st, step: run.log({k: v for k, v in st.items() if isinstance(v, (int, float))})) if run else None
    t0 = time.perf_counter()
    train_info: dict = {}
    planner = None
    if cfg.method == "ppo":
        tk = cfg.training_key()
        if tk in _TRAINED:
            trainer, train_info = _TRAINED[tk]
            train_info = {**train_info, "reused_training": True}
        else:
            trainer, train_info = train_policy(cfg, log=log, progress=(lambda d, t, m: progress("train", d, t, m))
                                               if progress else None)
            _TRAINED[tk] = (trainer, train_info)
        planner = AblationPlanner(trainer, cfg)
    metrics, rows = evaluate_run(cfg, problems, ilp_cache, planner,
                                 progress=(lambda d, t, m: progress("eval", d, t, m)) if progress else None)
    rec = {"key": cfg.key(), "config": dataclasses.asdict(cfg), "seed": cfg.seed, "git_rev": git_rev(),
           "metrics": metrics, "train": {k: v for k, v in train_info.items() if k != "curve"},
           "curve": train_info.get("curve", []), "rows": rows, "wall_s": time.perf_counter() - t0,
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if run:
        run.summary.update({f"eval/{k}": v for k, v in metrics.items() if v is not None})
        run.finish()
    return rec


def _wandb_init(cfg: AblationConfig, mode: str, run=None):
    if mode == "disabled":
        return None
    try:
        import wandb
    except ImportError:  # pragma: no cover
        return None
    from experiments.common import git_rev
    return wandb.init(project="shardgym-ablate", mode=mode, group=cfg.ablation, name=cfg.key(), reinit=True,
                      config={**dataclasses.asdict(cfg), "git_rev": git_rev()})


# ---- results file, table, chart ------------------------------------------------------------------------
def load_results(path) -> dict:
    if not os.path.exists(path):
        return {"runs": {}, "ilp": {}}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"results file {path} is unreadable ({exc}); move it away or pass --force") from exc
    data.setdefault("runs", {})
    data.setdefault("ilp", {})
    return data


def save_results(data: dict, path, cli_config: dict | None = None) -> None:
    """Write the results JSON atomically (temp file + os.replace), with git revision and environment."""
    import tempfile

    from experiments.common import write_results
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        payload = {k: v for k, v in data.items() if k not in ("git_rev", "timestamp", "env")}
        tmp_path = write_results(stem, payload, config=cli_config if cli_config is not None else data.get("config"),
                                 seed=data.get("seed"), results_dir=tmp)
        os.replace(tmp_path, path)


def table_rows(records: list[dict]) -> list[dict]:
    def f(x, pct=False):
        return None if x is None else (100 * x if pct else x)
    out = []
    for r in records:
        m, c = r["metrics"], r["config"]
        out.append({"ablation": c["ablation"], "value": c["value"], "seed": c["seed"],
                    "median cost/ILP": f(m["median_cost_ratio"]), "max cost/ILP": f(m["max_cost_ratio"]),
                    "feasible %": f(m["feasible_rate"], True), "raw feasible %": f(m["raw_feasible_rate"], True),
                    "peak/ILP": f(m["median_peak_ratio"]), "plan time s": f(m["median_plan_time_s"]),
                    "train s": r.get("train", {}).get("train_time_s")})
    return out


COLUMNS = ["ablation", "value", "seed", "median cost/ILP", "max cost/ILP", "feasible %", "raw feasible %",
           "peak/ILP", "plan time s", "train s"]


def _md_cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def markdown_table(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_md_cell(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def plot(records: list[dict], path) -> None:
    """Grouped bar chart: median cost/ILP per (ablation, value), max as an error whisker, log y."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    recs = [r for r in records if r["metrics"]["median_cost_ratio"] is not None]
    if not recs:
        return
    groups: dict[str, list] = {}
    for r in recs:
        groups.setdefault(r["config"]["ablation"], []).append(r)
    labels, med, mx, colors, xs = [], [], [], [], []
    cmap = plt.get_cmap("tab10")
    x = 0.0
    for gi, (g, rs) in enumerate(groups.items()):
        for r in rs:
            m = r["metrics"]
            labels.append(f"{g}: {r['config']['value']}" + (f" (seed {r['seed']})" if r["seed"] else ""))
            med.append(m["median_cost_ratio"])
            mx.append(m["max_cost_ratio"])
            colors.append(cmap(gi % 10))
            xs.append(x)
            x += 1
        x += 0.8
    fig, ax = plt.subplots(figsize=(max(9, 0.6 * len(xs) + 4), 5.5))
    med, mx = np.array(med), np.array(mx)
    ax.bar(xs, med, color=colors, width=0.8)
    ax.errorbar(xs, med, yerr=[np.zeros_like(med), mx - med], fmt="none", ecolor="black", capsize=3, lw=1,
                label="max over problems")
    ax.axhline(1.0, color="grey", ls="--", lw=1, label="ILP optimum")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylim(bottom=min(0.9, 0.9 * float(med.min())), top=max(2.0, 3.0 * float(mx.max())))
    for xi, m in zip(xs, med):
        ax.annotate(f"{m:,.0f}" if m >= 100 else f"{m:.3g}", (xi, m), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=7)
    ax.set_ylabel("plan cost / ILP cost (median; whisker = max)")
    ax.set_xlabel("ablation value (bars grouped and coloured by ablation)")
    from matplotlib.patches import Patch
    handles = [Patch(color=cmap(i % 10), label=g) for i, g in enumerate(groups)]
    handles += ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    n_problems = recs[0]["metrics"]["problems"]
    ax.set_title(f"shardgym ablations: held-out cost vs ILP optimum ({n_problems} problems)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- CLI -------------------------------------------------------------------------------------------------
def _parse_caps(s: str) -> tuple:
    out = []
    for tok in s.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if tok == "none":
            out.append(None)
        else:
            try:
                out.append(float(tok))
            except ValueError:
                raise argparse.ArgumentTypeError(f"cap {tok!r}: use 'none' or a fraction in [0, 1]") from None
    if not out:
        raise argparse.ArgumentTypeError("give at least one cap ('none' or a fraction)")
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ablation", choices=sorted(ABLATIONS), help="one ablation to run")
    g.add_argument("--all", action="store_true", help="every ablation with its default values")
    g.add_argument("--sweep-agent", action="store_true", help="one run configured by wandb.config (sweep.yaml)")
    g.add_argument("--report", action="store_true", help="only print the table and redraw the chart")
    ap.add_argument("--values", help="comma-separated values for --ablation (default: its defaults)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--updates", type=int, default=AblationConfig.updates, help="PPO updates per training run")
    ap.add_argument("--minutes", type=float, default=None, help="wall-time cap per PPO training run")
    ap.add_argument("--bc-seconds", type=float, default=AblationConfig.bc_seconds)
    ap.add_argument("--samples", type=int, default=AblationConfig.samples)
    ap.add_argument("--ilp-seconds", type=float, default=AblationConfig.ilp_seconds)
    ap.add_argument("--train-caps", type=_parse_caps, default=AblationConfig.train_caps,
                    help="memory-cap fractions for training problems, e.g. none,0.5")
    ap.add_argument("--eval-caps", type=_parse_caps, default=AblationConfig.eval_caps,
                    help="memory-cap fractions for held-out problems, e.g. none,0.5")
    ap.add_argument("--eval-limit", type=int, default=0, help="evaluate only the first N held-out problems")
    ap.add_argument("--results", default=None, help="results JSON (default results/ablate.json)")
    ap.add_argument("--force", action="store_true", help="rerun runs already in the results file")
    ap.add_argument("--wandb", choices=("offline", "online", "disabled"), default=None,
                    help="wandb mode (default $WANDB_MODE or offline)")
    ap.add_argument("--markdown", action="store_true", help="also print the table as markdown (always at --all)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _base_config(args) -> AblationConfig:
    return AblationConfig(updates=args.updates, minutes=args.minutes, bc_seconds=args.bc_seconds,
                          samples=args.samples, ilp_seconds=args.ilp_seconds, train_caps=tuple(args.train_caps),
                          eval_caps=tuple(args.eval_caps), eval_limit=args.eval_limit)


def planned_configs(args) -> list[AblationConfig]:
    base = _base_config(args)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    names = list(ABLATIONS) if args.all else [args.ablation]
    out = []
    for name in names:
        values = ABLATIONS[name][1] if (args.all or not args.values) else [v for v in args.values.split(",") if v.strip()]
        for seed in seeds:
            for v in values:
                out.append(config_for(name, v, dataclasses.replace(base, seed=seed)))
    return out


def config_from_wandb(wcfg: dict, base: AblationConfig) -> AblationConfig:
    """An AblationConfig from a sweep's wandb.config (keys = AblationConfig field names)."""
    names = {f.name: f for f in dataclasses.fields(AblationConfig)}
    kw = {}
    for k, v in dict(wcfg).items():
        if k not in names:
            raise ValueError(f"sweep parameter {k!r} is not an AblationConfig field; fields: {', '.join(names)}")
        if k == "action_features" and isinstance(v, bool):   # YAML reads bare on/off as booleans
            v = "on" if v else "off"
        if k in ("train_caps", "eval_caps"):
            v = tuple(None if x in (None, "none") else float(x) for x in v)
        kw[k] = v
    swept = ",".join(f"{k}={kw[k]}" for k in sorted(kw) if k not in ("seed",))
    return dataclasses.replace(base, ablation="sweep", value=swept or "default", **kw).validate()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not (args.ablation or args.all or args.sweep_agent or args.report):
        build_parser().error("give --ablation NAME, --all, --sweep-agent or --report")
    wandb_mode = args.wandb or os.environ.get("WANDB_MODE", "offline")
    os.environ["WANDB_MODE"] = wandb_mode
    os.environ.setdefault("WANDB_SILENT", "true")
    from experiments.common import RESULTS_DIR, print_table
    path = args.results or str(RESULTS_DIR / f"{RESULTS_NAME}.json")
    data = load_results(path)
    cli = {k: v for k, v in vars(args).items()}
    sweep_run = None
    if args.report:
        configs = []
    elif args.sweep_agent:
        import wandb
        sweep_run = wandb.init(project="shardgym-ablate")
        configs = [config_from_wandb(dict(wandb.config), _base_config(args))]
    else:
        configs = planned_configs(args)

    done_keys, interrupted = [], False
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[msg]}"), TimeElapsedColumn(),
                  disable=args.no_progress or not configs) as bar:
        overall = bar.add_task("runs", total=len(configs), msg="")
        step = bar.add_task("", total=1, msg="", visible=False)

        def progress(phase, done, total, msg):
            bar.update(step, description=f"  {phase}", completed=done, total=total, msg=msg, visible=True)

        try:
            for cfg in configs:
                old = data["runs"].get(cfg.key())
                if old is not None and not args.force and old.get("config") == json.loads(
                        json.dumps(dataclasses.asdict(cfg))):
                    done_keys.append(cfg.key())
                    bar.update(overall, advance=1, msg=f"{cfg.key()} (cached)")
                    continue
                bar.update(overall, msg=cfg.key())
                if sweep_run is not None:
                    rec = _run_in_sweep(cfg, data["ilp"], sweep_run, progress)
                else:
                    rec = run_one(cfg, data["ilp"], wandb_mode=wandb_mode, progress=progress)
                data["runs"][cfg.key()] = rec
                save_results(data, path, cli)
                done_keys.append(cfg.key())
                bar.update(overall, advance=1)
        except KeyboardInterrupt:
            interrupted = True
            if data["ilp"] or data["runs"]:   # keep the finished runs and the ILP references solved so far
                save_results(data, path, cli)
    if interrupted:
        print(f"interrupted: {len(done_keys)} of {len(configs)} runs done and saved to {path}; "
              "rerun the same command to resume")
    records = [data["runs"][k] for k in (done_keys if configs else data["runs"])]
    rows = table_rows(records)
    if rows:
        print_table(rows, COLUMNS, title="ablations on held-out problems (cost relative to the ILP optimum)")
        png = os.path.splitext(path)[0] + ".png"
        plot(records, png)
        print(f"wrote {png}" if args.report else f"wrote {path} and {png}")
        if args.markdown or args.all or args.report:
            print()
            print(markdown_table(rows))
    return 130 if interrupted else 0


def _run_in_sweep(cfg: AblationConfig, ilp_cache: dict, run, progress) -> dict:
    """run_one inside the sweep agent's own wandb run (no nested init)."""
    rec = run_one(cfg, ilp_cache, wandb_mode="disabled", progress=progress)
    run.summary.update({f"eval/{k}": v for k, v in rec["metrics"].items() if v is not None})
    for c in rec["curve"]:
        run.log({k: v for k, v in c.items() if k != "update"}, step=int(c.get("update", 0)))
    return rec


if __name__ == "__main__":
    sys.exit(main())
