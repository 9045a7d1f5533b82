"""Workloads for the sharding env: zoo models x sizes x clusters x memory caps, and random problems.

* ``Workload(model, size, cluster, memory_cap_bytes=None, memory_cap_fraction=None).build()``
  traces ``zoo.build(model, size, abstract=True)`` and builds its Problem on ``cluster`` (a preset
  name or a Cluster). Built problems are cached in-process and on disk under
  ``$SHARDGYM_CACHE_DIR`` (default ``~/.cache/shardgym/problems``; ``SHARDGYM_CACHE=0`` turns the
  disk cache off), keyed by model, size, the cluster's fields and a hash of the costmodel/ and zoo/
  sources (so a code change invalidates it; files from older code are deleted on the next write).
* Memory caps: ``memory_cap_bytes`` sets the cap; ``memory_cap_fraction`` f sets it to
  ``min_peak + f * (max_peak - min_peak)`` where min_peak/max_peak are the peaks of the live-usage
  profile when every node takes its least/greatest-usage strategy (max_peak is the replicated
  plan's peak when replication is the largest layout; min_peak is a lower bound of any plan's).
* The fixed split: ``train_workloads()`` = {gpt, mlp, vit, unet} tiny x {cpu-2x4, a100-1x8, 4
  seeded random 8-device clusters}; ``heldout_workloads()`` = {fno tiny, fno large,
  meshgraphnet tiny} x {h100-2x8, tpu-4x4, a100-hetero-2x4}: models, sizes and clusters never
  used in training (16-device meshes and a heterogeneous one included). fno large (543 nodes) is
  there because the tiny models on these fast clusters are degenerate without a cap (replicating
  everything is optimal); meshgraphnet large (4,095 nodes) is left out because the ILP finds no
  plan for it under a cap within a minute, so it could not be scored. ``sample_workload(rng, split)``
  draws from a split with a random memory cap; ``WorkloadSampler(split)`` wraps it for the env.
* ``random_problem(rng, num_nodes, max_strategies, ...)``: a synthetic layered DAG with random
  costs, usages, liveness intervals and resharding matrices, for tests and training diversity.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

import zoo
from costmodel.builder import build_problem
from costmodel.cluster import Cluster
from costmodel.problem import Problem, usage_profile
from costmodel.trace import trace

TRAIN_MODELS = (("gpt", "tiny"), ("mlp", "tiny"), ("vit", "tiny"), ("unet", "tiny"))
TRAIN_PRESETS = ("cpu-2x4", "a100-1x8")
TRAIN_RANDOM_CLUSTER_SEEDS = (0, 1, 2, 3)
HELDOUT_MODELS = (("fno", "tiny"), ("fno", "large"), ("meshgraphnet", "tiny"))
HELDOUT_PRESETS = ("h100-2x8", "tpu-4x4", "a100-hetero-2x4")
MESH_SHAPES = ((2, 4), (1, 8), (4, 2), (2, 2, 2))
GiB = 1024 ** 3

_PROBLEMS: dict[str, Problem] = {}
_GRAPHS: dict[tuple, object] = {}
_CODE_VERSION: str | None = None


# ---- clusters ---------------------------------------------------------------------------------------
def random_cluster(rng: np.random.Generator, name: str | None = None):
    """A random 8-device cluster: mesh shape from MESH_SHAPES; the last axis the fastest, each slower
    axis 1-16x slower (log-uniform) with more latency; a 30% chance that one or two devices run at
    half speed; 16-80 GiB per device; efficiency 0.3-0.7."""
    mesh = tuple(MESH_SHAPES[int(rng.integers(len(MESH_SHAPES)))])
    nd = len(mesh)
    fast_bw = float(np.exp(rng.uniform(np.log(20e9), np.log(450e9))))
    bw, lat = [], []
    for a in range(nd):
        ratio = 1.0 if a == nd - 1 else float(np.exp(rng.uniform(0.0, np.log(16.0))))
        bw.append(fast_bw / ratio)
        lat.append(float(rng.uniform(2e-6, 5e-6) * (1.0 if a == nd - 1 else rng.uniform(1.0, 5.0))))
    flops = float(np.exp(rng.uniform(np.log(50e12), np.log(500e12))))
    dev_flops = np.full(8, flops)
    if rng.random() < 0.3:
        slow = rng.choice(8, size=int(rng.integers(1, 3)), replace=False)
        dev_flops[slow] *= 0.5
    mem = float(rng.choice([16, 24, 32, 40, 80])) * GiB
    eff = float(rng.uniform(0.3, 0.7))
    names = ("x", "y", "z")[:nd] if nd <= 3 else tuple(f"a{i}" for i in range(nd))
    desc = "x".join(map(str, mesh))
    name = name or f"random-{desc}-{int(rng.integers(1 << 30)):08x}"
    return Cluster(name, mesh, names, tuple(bw), tuple(lat), (mem,) * 8, tuple(float(f) for f in dev_flops), eff)


def _cluster(c):
    return Cluster.preset(c) if isinstance(c, str) else c


def _cluster_name(c) -> str:
    return c if isinstance(c, str) else c.name


# ---- workloads --------------------------------------------------------------------------------------
def _code_version() -> str:
    global _CODE_VERSION
    if _CODE_VERSION is None:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha1()
        for sub in ("costmodel", "zoo"):   # subpackages too (costmodel/trace/)
            for f in sorted((root / sub).rglob("*.py")):
                h.update(f.relative_to(root / sub).as_posix().encode())
                h.update(f.read_bytes())
        _CODE_VERSION = h.hexdigest()[:12]
    return _CODE_VERSION


def _cache_dir() -> Path | None:
    if os.environ.get("SHARDGYM_CACHE", "1") == "0":
        return None
    return Path(os.environ.get("SHARDGYM_CACHE_DIR", Path.home() / ".cache" / "shardgym" / "problems"))


def peak_bounds(problem: Problem) -> tuple[float, float]:
    """(min_peak, max_peak): live-usage peaks with every node at its least / greatest usage."""
    u = problem.node_usages
    offs = problem.strategy_offsets[:-1]
    lo = np.minimum.reduceat(u, offs) if problem.num_nodes else np.zeros(0)
    hi = np.maximum.reduceat(u, offs) if problem.num_nodes else np.zeros(0)
    return float(max(usage_profile(problem, lo)[1].max(), 0.0)), float(max(usage_profile(problem, hi)[1].max(), 0.0))


@dataclass(frozen=True)
class Workload:
    """A zoo model at a size on a cluster (preset name or Cluster) under an optional memory cap."""

    model: str
    size: str
    cluster: object = "cpu-2x4"
    memory_cap_bytes: float | None = None
    memory_cap_fraction: float | None = None

    def __post_init__(self):
        if self.memory_cap_fraction is not None and not (0.0 <= self.memory_cap_fraction <= 1.0):
            raise ValueError(f"memory_cap_fraction must be in [0, 1], got {self.memory_cap_fraction}")
        if self.memory_cap_bytes is not None and not (self.memory_cap_bytes > 0):
            raise ValueError(f"memory_cap_bytes must be > 0, got {self.memory_cap_bytes}")

    @property
    def name(self) -> str:
        return f"{self.model}-{self.size}@{_cluster_name(self.cluster)}"

    def key(self) -> str:
        c = _cluster(self.cluster)
        blob = json.dumps([self.model, self.size, c.to_dict(), _code_version()], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:20]

    def build_uncapped(self) -> Problem:
        """The Problem as the builder makes it (cached in-process and on disk)."""
        key = self.key()
        if key in _PROBLEMS:
            return _PROBLEMS[key]
        d = _cache_dir()
        path = d / f"{self.model}-{self.size}-{_code_version()}-{key}.pkl" if d else None
        problem = None
        if path is not None and path.exists():
            try:
                with open(path, "rb") as f:
                    problem = pickle.load(f)
            except Exception:  # a stale or truncated cache file: rebuild it
                problem = None
        if problem is None:
            gk = (self.model, self.size)
            if gk not in _GRAPHS:
                fn, args = zoo.build(self.model, self.size, abstract=True)
                _GRAPHS[gk] = trace(fn, *args)
            problem = build_problem(_GRAPHS[gk], _cluster(self.cluster))
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(f".tmp{os.getpid()}")
                    with open(tmp, "wb") as f:
                        pickle.dump(problem, f, protocol=pickle.HIGHEST_PROTOCOL)
                    os.replace(tmp, path)
                    for stale in path.parent.glob("*.pkl"):   # built by older code: never read again
                        if _code_version() not in stale.name:
                            stale.unlink(missing_ok=True)
                except OSError:
                    pass
        if problem.name != self.name:
            problem = replace(problem, name=self.name)
        _PROBLEMS[key] = problem
        return problem

    def build(self) -> Problem:
        """The Problem with this workload's memory cap applied."""
        p = self.build_uncapped()
        if self.memory_cap_bytes is not None:
            return p.with_usage_limit(float(self.memory_cap_bytes))
        if self.memory_cap_fraction is not None:
            lo, hi = peak_bounds(p)
            return p.with_usage_limit(lo + self.memory_cap_fraction * (hi - lo))
        return p


def _train_clusters() -> list:
    return list(TRAIN_PRESETS) + [random_cluster(np.random.default_rng(1000 + s), name=f"random-train-{s}")
                                  for s in TRAIN_RANDOM_CLUSTER_SEEDS]


def train_workloads() -> list[Workload]:
    """The fixed training set: TRAIN_MODELS x (TRAIN_PRESETS + 4 seeded random clusters), no cap."""
    return [Workload(m, s, c) for m, s in TRAIN_MODELS for c in _train_clusters()]


def heldout_workloads() -> list[Workload]:
    """The fixed held-out set: HELDOUT_MODELS x HELDOUT_PRESETS, no cap."""
    return [Workload(m, s, c) for m, s in HELDOUT_MODELS for c in HELDOUT_PRESETS]


def sample_workload(rng: np.random.Generator, split: str = "train", cap_probability: float = 0.5) -> Workload:
    """A workload from ``split`` ("train" or "heldout"); with probability ``cap_probability`` a memory
    cap at a uniform fraction in [0.2, 1] between the min and max peaks, else the cluster's memory."""
    pool = train_workloads() if split == "train" else heldout_workloads() if split == "heldout" else None
    if pool is None:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'heldout'")
    w = pool[int(rng.integers(len(pool)))]
    frac = float(rng.uniform(0.2, 1.0)) if rng.random() < cap_probability else None
    return Workload(w.model, w.size, w.cluster, None, frac)


class WorkloadSampler:
    """A picklable sampler ``rng -> Problem`` over a split, for ``ShardingEnv(workloads=...)``.
    ``max_sizes`` (nodes, edges, strategies) is the max over the split's problems (nodes and edges
    rounded up to 64); the env reads it at construction, which builds every workload of the split
    once (~30 s for "train" from cold, then from the disk cache in ~1 s)."""

    def __init__(self, split: str = "train", cap_probability: float = 0.5):
        self.split, self.cap_probability = split, cap_probability
        self._max_sizes: dict | None = None

    def __call__(self, rng: np.random.Generator) -> Problem:
        return sample_workload(rng, self.split, self.cap_probability).build()

    @property
    def max_sizes(self) -> dict:
        if self._max_sizes is None:
            ps = [w.build_uncapped() for w in (train_workloads() if self.split == "train" else heldout_workloads())]
            up = lambda x, to: int(-(-x // to) * to)
            self._max_sizes = {"nodes": up(max(p.num_nodes for p in ps), 64), "edges": up(max(p.num_edges for p in ps), 64),
                               "strategies": max(int(p.num_strategies.max()) for p in ps)}
        return self._max_sizes


# ---- synthetic problems -----------------------------------------------------------------------------
def random_problem(rng: np.random.Generator, num_nodes: int = 50, max_strategies: int = 8,
                   min_strategies: int = 2, trivial_fraction: float = 0.1, max_preds: int = 3,
                   window: int = 8, param_fraction: float = 0.1, memory_cap_fraction: float | None = None,
                   name: str | None = None) -> Problem:
    """A random layered DAG shaped like a traced program.

    Node i (in topological order 0..n-1) takes 1..max_preds producers among the ``window`` nodes
    before it; it has k_i strategies, uniform in [min_strategies, max_strategies] (1 with
    probability ``trivial_fraction``). Per strategy: cost = node scale (lognormal) x U(0.2, 2);
    usage = tensor bytes (lognormal, ~20 KB) / a sharding factor from {1, 2, 4, 8}; redundant bytes
    = usage x (8/factor - 1) (an 8-device mesh); comm bytes U(0, 1) x tensor bytes when sharded;
    imbalance U(0, 0.1) x node scale. ``param_fraction`` of nodes live
    over the whole program [0, n) like parameters; others from i to their last consumer + 1.
    Resharding matrices: edge scale x U(0, 1), with a free diagonal (same strategy index) on 70% of
    the edges. ``memory_cap_fraction`` f sets usage_limit = min_peak + f (max_peak - min_peak).
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    if not (1 <= min_strategies <= max_strategies):
        raise ValueError(f"need 1 <= min_strategies <= max_strategies, got {min_strategies}, {max_strategies}")
    n = int(num_nodes)
    k = rng.integers(min_strategies, max_strategies + 1, size=n)
    k[rng.random(n) < trivial_fraction] = 1
    edges = []
    for i in range(1, n):
        lo = max(0, i - window)
        npred = int(rng.integers(1, min(max_preds, i - lo) + 1))
        for j in rng.choice(np.arange(lo, i), size=npred, replace=False):
            edges.append((int(j), i))
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    last_use = np.arange(n) + 1
    if len(edges):
        np.maximum.at(last_use, edges[:, 0], edges[:, 1] + 1)
    param = rng.random(n) < param_fraction
    intervals = np.stack([np.where(param, 0, np.arange(n)), np.where(param, n, last_use)], axis=1)
    scale = rng.lognormal(0.0, 1.0, n)
    tensor_bytes = rng.lognormal(np.log(2e4), 1.0, n)
    costs, usages, red, comm, imb = [], [], [], [], []
    for i in range(n):
        ki = int(k[i])
        factor = rng.choice([1, 2, 4, 8], size=ki)
        costs.append(scale[i] * rng.uniform(0.2, 2.0, ki))
        usages.append(np.round(tensor_bytes[i] / factor))
        red.append(np.round(tensor_bytes[i] / factor * (8 / factor - 1)))
        comm.append(np.where(factor > 1, rng.uniform(0, 1, ki) * tensor_bytes[i], 0.0))
        imb.append(rng.uniform(0, 0.1, ki) * scale[i])
    ecosts, ecomm = [], []
    for u, v in edges:
        m = rng.uniform(0, 1, (int(k[u]), int(k[v]))) * rng.lognormal(0.0, 1.0)
        if rng.random() < 0.7:
            d = min(int(k[u]), int(k[v]))
            m[np.arange(d), np.arange(d)] = 0.0
        ecosts.append(m.ravel())
        ecomm.append((m * 1e4).ravel())
    p = Problem.from_lists(
        name or f"random-{n}", costs, usages, intervals, edges, ecosts,
        node_redundant=np.concatenate(red), node_comm_bytes=np.concatenate(comm),
        node_imbalance_s=np.concatenate(imb), edge_comm_bytes=np.concatenate(ecomm) if ecomm else np.zeros(0))
    if memory_cap_fraction is not None:
        lo, hi = peak_bounds(p)
        p = p.with_usage_limit(lo + memory_cap_fraction * (hi - lo))
    return p


class RandomProblemSampler:
    """A picklable sampler ``rng -> random_problem(rng, ...)`` with sizes drawn from ranges."""

    def __init__(self, nodes=(20, 200), max_strategies: int = 8, memory_cap_probability: float = 0.5):
        self.nodes, self.max_strategies, self.cap_p = tuple(nodes), int(max_strategies), memory_cap_probability
        # edges <= max_preds per node
        self.max_sizes = {"nodes": int(self.nodes[1]), "edges": 3 * int(self.nodes[1]), "strategies": self.max_strategies}

    def __call__(self, rng: np.random.Generator) -> Problem:
        n = int(rng.integers(self.nodes[0], self.nodes[1] + 1))
        frac = float(rng.uniform(0.2, 1.0)) if rng.random() < self.cap_p else None
        return random_problem(rng, n, self.max_strategies, memory_cap_fraction=frac)
