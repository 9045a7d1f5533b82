"""Is the factor-graph network's imitation loss aligned with the cost of the plan it decodes?

On fixed problems, Adam steps on the trainer's loss (agent/fgnn_train.py: class-merged cross-entropy
against an ILP plan), and after each step the raw plan (``FGNN.plan``) is priced: cost / label cost,
over the cap = inf. Also records which parameter groups moved (L2 distance from the start).
``python -m experiments.fgnn_align --steps 30 --out-name fgnn_align`` writes results/NAME.json.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from agent.fgnn import FGConfig
from agent.fgnn_data import ilp_label
from agent.fgnn_train import Sample, Trainer
from costmodel.problem import evaluate
from env.workloads import Workload, random_problem
from experiments.common import write_results


def problems(seed: int):
    rng = np.random.default_rng(seed)
    yield "random-n120-k6 cap0.35", random_problem(rng, 120, 6, memory_cap_fraction=0.35, name="align-0")
    yield "random-n200-k5 cap0.15", random_problem(rng, 200, 5, memory_cap_fraction=0.15, name="align-1")
    yield "mlp-tiny@cpu-2x4 cap0.15", Workload("mlp", "tiny", "cpu-2x4", None, 0.15).build()


def ratio(net, p, lab_cost) -> float:
    try:
        c = evaluate(p, net.plan(p))
    except ValueError:
        return float("inf")
    return c.total / lab_cost if c.feasible else float("inf")


def moved(p0, p1) -> dict:
    import jax
    return {k: float(np.sqrt(sum(float(np.sum((np.asarray(a) - np.asarray(b)) ** 2))
                                 for a, b in zip(jax.tree.leaves(p0[k]), jax.tree.leaves(p1[k])))))
            for k in sorted(p0)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--ilp-seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-name", default="fgnn_align")
    a = ap.parse_args(argv)
    rows = []
    for name, p in problems(a.seed):
        lab = ilp_label(p, a.ilp_seconds, cache=False)
        if lab is None:
            continue
        s = Sample(name, p, lab["plan"], lab["cost"])
        tr = Trainer(FGConfig(), lr=a.lr)
        p0 = tr.net.params
        A = s.arrays()
        hist = [{"step": 0, "loss": tr.loss(A), "ratio": ratio(tr.net, p, lab["cost"])}]
        t = time.perf_counter()
        for j in range(1, a.steps + 1):
            tr.step(A)
            hist.append({"step": j, "loss": tr.loss(A), "ratio": ratio(tr.net, p, lab["cost"])})
            print(name, hist[-1], flush=True)
        rows.append({"problem": name, "nodes": p.num_nodes, "label_status": lab["status"], "history": hist,
                     "moved": moved(p0, tr.net.params), "train_s": time.perf_counter() - t})
    write_results(a.out_name, {"rows": rows}, config=vars(a), seed=a.seed)


if __name__ == "__main__":
    main()
