"""Generate the IOPDDL benchmark set of experiments/bench_iopddl.py (contest-format instances).

Three families, each deterministic from its seed:

* ``zoo``: traced zoo models (``Problem.to_iopddl``) on a cluster, with the memory limit at a
  fraction of the way from the lowest-usage plan's peak to the cheapest plan's peak (so it binds).
  Small (a few hundred nodes); the files are committed under experiments/iopddl_bench/.
* ``synth``: Alpa-like random strategy graphs in the shapes the held-back contest instances are weak
  on (``SHAPES``): many strategies per node (816 nodes, up to 178, mean 29), long thin graphs (41k
  nodes, ~1 edge per node, up to 41), 35k-65k nodes with up to 129 strategies; tight limits. Each
  strategy has a layout id and a shard degree: node cost = compute / degree + a collective cost,
  usage = bytes / degree; an edge costs 0 between equal layouts and the consumer's bytes times a
  per-pair factor otherwise; a third of layout pairs are forbidden (1e18, as the contest marks
  impossible shardings; 34-68 % of the shared instances' edge entries are) and some edges are permutation ties (the contest's "sharding must propagate").
  Integer costs, as in the contest. Large: written to experiments/iopddl_bench/generated/
  (git-ignored) by ``python experiments/iopddl_gen.py``.
* ``contest``: contest-like graphs built from tensor layouts on a mesh, with the shared instances'
  statistics (limit 1.1 x the least peak, edge-borne costs, ties, forbidden pairs, long-lived values;
  ``experiments/iopddl_contest_like.py`` says what and how): a 41k-node long thin graph (up to 41
  strategies) and a 50k-node one (up to 129). Committed, gzipped.
* ``perturbed``: the shared contest instances (../shared/iopddl) with node costs scaled by
  lognormal noise (sigma 0.2) and the limit pulled half way down towards the lowest-usage peak.

``python experiments/iopddl_gen.py [--families zoo,synth,contest,perturbed] [--only NAME,...] [--force]``
writes the instances that are missing; ``--force`` rewrites existing ones too (a rewritten committed
instance needs its entry in experiments/iopddl_bench/best_known.json removed).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from costmodel.problem import Problem, evaluate  # noqa: E402
from experiments.iopddl_contest_like import CONTEST_SHAPES, contest_like  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DIR = os.path.join(HERE, "iopddl_bench")
GEN_DIR = os.path.join(BENCH_DIR, "generated")
SHARED = os.path.join(HERE, "..", "..", "shared", "iopddl")
FORBID = 1e18


@dataclass(frozen=True)
class Shape:
    """One synthetic instance: node count, strategies per node (max, mean), producers per node,
    the window producers are drawn from, the limit fraction and the seed."""
    name: str
    nodes: int
    k_max: int
    k_mean: float
    edges_per_node: float
    window: int
    limit_frac: float
    seed: int


SHAPES = [
    Shape("synth-816-k178", 816, 178, 45.0, 1.6, 30, 0.3, 1),
    Shape("synth-816-k178-tight", 816, 178, 45.0, 1.6, 30, 0.1, 2),
    Shape("synth-2k-k64", 2000, 64, 16.0, 1.4, 40, 0.3, 3),
    Shape("synth-41k-thin-k41", 41000, 41, 8.0, 1.0, 4, 0.3, 4),
    Shape("synth-35k-k129", 35000, 129, 10.0, 1.3, 50, 0.3, 5),
    Shape("synth-65k-k129-tight", 65000, 129, 8.0, 1.2, 50, 0.15, 6),
]
COMMITTED = {"synth-816-k178"}   # the other synthetic ones are regenerated (1-8 MB each)
ZOO = [("gpt", "tiny", "cpu-2x4", 0.5), ("unet", "tiny", "h100-2x8", 0.25),
       ("meshgraphnet", "tiny", "cpu-2x4", 0.5), ("fno", "tiny", "h100-2x8", 0.75)]
PERTURBED = [("B", 11, 0.5), ("G", 12, 0.5), ("A", 13, 0.5)]


def _strategy_counts(rng, n: int, k_max: int, k_mean: float) -> np.ndarray:
    """Heavy-tailed counts in [1, k_max] with roughly the given mean (a quarter of nodes have 1-2)."""
    sigma = 1.0
    mu = np.log(max(k_mean, 1.0)) - sigma ** 2 / 2
    k = np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, k_max).astype(np.int64)
    few = rng.random(n) < 0.25
    k[few] = rng.integers(1, 3, int(few.sum()))
    k[rng.integers(0, n, max(1, n // 200))] = k_max
    return k


def synth(shape: Shape) -> Problem:
    rng = np.random.default_rng(shape.seed)
    n = shape.nodes
    k = _strategy_counts(rng, n, shape.k_max, shape.k_mean)
    layouts = 16
    lay = [rng.integers(0, layouts, int(ki)) for ki in k]
    deg = [2.0 ** rng.integers(0, 4, int(ki)) for ki in k]
    for i in range(n):           # strategy 0 is replicated (degree 1, layout 0): always a fallback;
        lay[i][0], deg[i][0] = 0, 1.0          # strategy 1 the fully sharded one (degree 8, layout 1)
        if k[i] > 1:
            lay[i][1], deg[i][1] = 1, 8.0
    flops = rng.lognormal(8.0, 1.5, n)
    nbytes = rng.lognormal(6.0, 1.2, n)
    costs, usages = [], []
    for i in range(n):
        comm = rng.lognormal(4.0, 1.0, int(k[i])) * (deg[i] > 1)
        c = np.rint(flops[i] / deg[i] + comm)
        ok = c.copy()
        c[rng.random(int(k[i])) < 0.03] = FORBID
        c[:2] = ok[:2]                         # replicated and fully sharded are always allowed
        c[0] = np.rint(flops[i])
        costs.append(c)
        usages.append(np.rint(nbytes[i] / deg[i] * rng.uniform(0.9, 1.1, int(k[i]))))
    # producers: 1-2 among the previous `window` nodes (Poisson around edges_per_node), plus rare
    # long-range uses (parameters read much later)
    edges, ecosts = [], []
    last_use = np.arange(n) + 1
    pair = rng.lognormal(0.0, 0.7, (layouts, layouts))
    banned = rng.random((layouts, layouts)) < 0.35             # incompatible layout pairs
    banned[0, :] = banned[:, 0] = False
    np.fill_diagonal(banned, False)
    for v in range(1, n):
        m = max(1, int(rng.poisson(shape.edges_per_node - 0.5) + (rng.random() < 0.5)))
        lo = max(0, v - shape.window)
        prods = set(rng.choice(np.arange(lo, v), size=min(m, v - lo), replace=False).tolist())
        if rng.random() < 0.02:
            prods.add(int(rng.integers(0, v)))
        for u in sorted(prods):
            ku, kv = int(k[u]), int(k[v])
            if ku == kv and ku > 1 and rng.random() < 0.15:     # a permutation tie
                M = np.full((ku, kv), FORBID)
                perm = np.concatenate([[0, 1], 2 + rng.permutation(kv - 2)])
                M[np.arange(ku), perm] = 0.0
            else:
                M = np.rint(nbytes[v] * pair[lay[u][:, None], lay[v][None, :]]
                            * (deg[u][:, None] != deg[v][None, :]) + nbytes[v] * 0.5 *
                            (lay[u][:, None] != lay[v][None, :]))
                M[banned[lay[u][:, None], lay[v][None, :]]] = FORBID
                M[0, 0] = min(M[0, 0], np.rint(nbytes[v]))
            edges.append((u, v))
            ecosts.append(M.ravel())
            last_use[u] = max(last_use[u], v + 1)
    intervals = np.stack([np.arange(n), last_use], 1)
    intervals[rng.random(n) < 0.1] = 0                        # some nodes hold no memory
    p = Problem.from_lists(shape.name, costs, usages, intervals, edges, ecosts)
    sharded = np.minimum(k - 1, 1)             # forbidden-free by construction: the limit keeps it feasible
    return p.with_usage_limit(_limit(p, shape.limit_frac, sharded))


def _limit(p: Problem, frac: float, floor_plan=None) -> float:
    """lo + frac * (hi - lo): lo = the peak of the lowest-usage plan over the allowed (not
    forbidden) strategies, or of ``floor_plan`` (a forbidden-free plan) if that is higher; hi = the
    cheapest-node plan's. So a forbidden-free plan always fits."""
    k = p.num_strategies
    starts = p.strategy_offsets[:-1]
    node_of = np.repeat(np.arange(p.num_nodes), k)
    local = np.arange(len(p.node_costs)) - starts[node_of]
    low = local[np.lexsort((p.node_costs, p.node_usages, p.node_costs >= FORBID, node_of))[starts]]
    cheap = local[np.lexsort((p.node_usages, p.node_costs, node_of))[starts]]
    lo = evaluate(p.with_usage_limit(None), low).peak_memory_bytes
    hi = evaluate(p.with_usage_limit(None), cheap).peak_memory_bytes
    if floor_plan is not None:
        lo = max(lo, evaluate(p.with_usage_limit(None), floor_plan).peak_memory_bytes)
    return float(np.floor(lo + frac * max(hi - lo, 0.0)))


def perturbed(letter: str, seed: int, frac: float) -> Problem:
    p = Problem.from_iopddl(os.path.join(SHARED, f"asplos-2025-iopddl-{letter}.json.gz"))
    rng = np.random.default_rng(seed)
    c = p.node_costs.copy()
    ok = c < 1e17
    c[ok] = np.rint(c[ok] * rng.lognormal(0.0, 0.2, int(ok.sum())))
    from dataclasses import replace
    q = replace(p, name=f"{letter}-perturbed-s{seed}", node_costs=c)
    k = q.num_strategies
    starts = q.strategy_offsets[:-1]
    node_of = np.repeat(np.arange(q.num_nodes), k)
    local = np.arange(len(q.node_costs)) - starts[node_of]
    low = local[np.lexsort((q.node_costs, q.node_usages, node_of))[starts]]
    lo = evaluate(q.with_usage_limit(None), low).peak_memory_bytes
    lim = float(np.floor(lo + frac * (q.usage_limit - lo)))
    return q.with_usage_limit(lim)


def zoo_instance(model: str, size: str, cluster: str, frac: float) -> Problem:
    import shardgym as sg
    import zoo
    fn, args = zoo.build(model, size, abstract=True)
    p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset(cluster))
    p = p.with_usage_limit(None)
    q = Problem(name=f"{model}-{size}@{cluster}-cap{int(frac * 100)}", strategy_offsets=p.strategy_offsets,
                node_costs=p.node_costs, node_usages=p.node_usages, intervals=p.intervals, edges=p.edges,
                edge_offsets=p.edge_offsets, edge_costs=p.edge_costs)
    return q.with_usage_limit(_limit(q, frac))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="zoo,synth,contest,perturbed")
    ap.add_argument("--only", default="", help="comma-separated instance names")
    ap.add_argument("--force", action="store_true",
                    help="rewrite instances that exist (by default they are kept: the committed ones are "
                         "scored against experiments/iopddl_bench/best_known.json, and a rebuilt zoo "
                         "instance follows today's cost model, so its best-known cost no longer applies)")
    a = ap.parse_args(argv)
    fams = set(a.families.split(","))
    only = set(filter(None, a.only.split(",")))
    os.makedirs(GEN_DIR, exist_ok=True)
    jobs = []
    if "zoo" in fams:
        for m, s, c, f in ZOO:
            jobs.append((f"{m}-{s}@{c}-cap{int(f * 100)}", BENCH_DIR, lambda m=m, s=s, c=c, f=f: zoo_instance(m, s, c, f)))
    if "synth" in fams:
        for sh in SHAPES:
            d = BENCH_DIR if sh.name in COMMITTED else GEN_DIR
            jobs.append((sh.name, d, lambda sh=sh: synth(sh)))
    if "contest" in fams:
        for cs in CONTEST_SHAPES:
            jobs.append((cs.name, BENCH_DIR, lambda cs=cs: contest_like(cs)))
    if "perturbed" in fams:
        for letter, seed, f in PERTURBED:
            jobs.append((f"{letter}-perturbed-s{seed}", GEN_DIR, lambda L=letter, sd=seed, f=f: perturbed(L, sd, f)))
    for name, d, make in jobs:
        if only and name not in only:
            continue
        path = os.path.join(d, f"{name}.json.gz")
        if os.path.exists(path) and not a.force:
            print(f"{path}: kept (exists; --force rewrites it)")
            continue
        p = make()
        p.to_iopddl(path)
        print(f"{path}: {p!r} ({os.path.getsize(path) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
