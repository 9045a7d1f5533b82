"""The raw decode (``shardgym.solve(method="policy", search=False)``: one BP pass and its masked decode,
no search) on the 18 held-out problems against the best-known costs (results/heldout_reference.json).

    python experiments/raw_decode_bench.py [--only SUBSTRING] [--json OUT] [--checkpoint PATH]

Prints cost / best-known, feasibility and seconds per problem, then the median and max over the
capped rows, the binding-cap rows (capped problems whose best-known cost is above their uncapped
twin's: the uncapped optimum does not fit, as eval_policy counts them; 7 of the 9), the uncapped
rows and all 18, with /proc/loadavg before and after (``--json``: the rows by name,
and ``_load``). The built problems are pickled
in ``--cache`` (default /tmp/heldout_problems.pkl; building them takes a while); delete it after a
cost-model change (``lookup`` then finds no entry: the ratio prints as nan).

Session 17 (results/raw_decode_s17b_before.json, raw_decode_s17b.json, raw_decode_s17b_rounds.json,
raw_decode_s17b_ablation.json): gentler price steps (``solvers.bp.PRICE_UP``/``PRICE_DECAY`` 1.5/0.8,
were 2.5/0.9) took the binding-cap median 1.179 -> 1.125 and max 1.472 -> 1.409 (meshgraphnet tiny
1.47/1.40/1.47 -> 1.26/1.31/1.13), the copy-priced phase at 3x the rounds (``COPY_ROUNDS``, was 2x)
the median to 1.094 (meshgraphnet tiny 1.26/1.28/1.09). The network ships no learned correction, so
its raw plan is Lagrangian BP's on every row; plain BP (no prices): median 1.181, 2 of 9 over the cap.
The two fno tiny caps did not move (1.409 h100, 1.179 a100); why, measured:
the node usages of BP's argmin plan fit (the copies break the cap), so the prices stay 0 and the
raw plan is the copy-aware decode of plain BP's beliefs. The best-known plans shard the weights and
their gradient/optimizer nodes (live over the whole step, strategy 0 -> 1 on 28 nodes at a100),
where the copy-aware decode, meeting the cap at the peak in index order, shards the activations
there (7 nodes, 145-160). No memory price fixes it: a scan of λ = s on the plain decode's 4
over-cap points (s = 1e-15..1e-8, 30 BP rounds each, with and without copy prices) gives 0.762x
over the cap up to s = 1.3e-11, then 2.03x at 0.99 of the cap, 2.5-7x above (never under 1.179x).
Also tried on these rows, none better: copy prices once only the copies break the cap (1.409 /
1.179, mgn unchanged), the price rule reading the plain decode's profile with copies (mgn up to
6.7x with a plan-cost price unit), geometric bracketing of λ between over and under (mgn 1.5-2.1x),
a bisection of the final λ's scale (5 steps), decode-level prices without re-running messages,
decodes in reverse / long-lived-last order, the cap scaled 0.5-0.9 in the decode, forcing the
longest-lived nodes over the cap to their least usage (1.0-12x or over the cap), and decodes every 4
rounds instead of 10 (mgn unchanged); fno tiny stayed at 1.409 / 1.179 throughout.

Session 19 (s19-a), the first long run of agent/fgnn_es.py, a negative result, not shipped:
``python -m agent.fgnn_es --minutes 68 --out runs/s19a-es --leaves price_out,damp --sigma 0.1
--lr 0.03 --pairs 3 --batch 4 --problems 24 --val-iters 4`` (card: results/s19a_es_card.json;
load 3-6, three other sessions' jobs beside it). The training split held only 16 binding-cap
problems of <= 1,000 nodes (12 train, 4 validation); 437 iterations in 68.5 min, 252 of them with
a zero gradient (no ± perturbation changed any plan of the batch). Best validation 0.687 at
iteration 116, all of it one problem (mlp-tiny @ fg-random-3 cap 0.7: 0.223x Lagrangian BP's
cost), the other 3 unchanged. On the held-out split (``--checkpoint runs/s19a-es/best.msgpack``,
results/s19a_raw_es_best.json, against results/s19a_raw_before.json, the shipped untrained
network) it is worse: meshgraphnet tiny cap 0.5 1.255/1.317/1.094 -> 2.112/2.044/1.974 (h100,
tpu, a100), binding median 1.179 -> 1.409, max 1.409 -> 2.112; fno rows and all 9 uncapped rows
unchanged (the uncapped first calls slower, 0.3-1.2 s -> up to 13 s: the jitted forward compiles
per shape bucket); every plan feasible. raw_decode_ablation.py on it (results/s19a_ablation_es_best.json), binding
median / max: network 1.409 / 2.112, its learned messages swapped for BP's (learned prices kept)
1.409 / 2.126 (mgn tpu 2.044 -> 2.126, the rest equal), Lagrangian BP 1.179 / 1.409, plain BP
1.559 / over the cap on 2 of 7. So the learned damping barely matters. The harm is the learned
price correction, fitted to a training split where the validation gain was one problem of four.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402


def held_out_cli(only: str = "") -> tuple[argparse.Namespace, list]:
    """``--only``, ``--cache``, ``--json`` and ``--checkpoint`` (the planner ``solve(method="policy")``
    loads: default "fgnn", agent/pretrained/fgnn.msgpack, or a checkpoint path) parsed, and the 18 built held-out problems (name,
    Problem), from the pickle in ``--cache`` or built and pickled there."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=only)
    ap.add_argument("--cache", default="/tmp/heldout_problems.pkl")
    ap.add_argument("--json", default="")
    ap.add_argument("--checkpoint", default="fgnn")
    args = ap.parse_args()
    return args, held_out_problems(args.cache)


def held_out_problems(cache: str = "/tmp/heldout_problems.pkl") -> list:
    """The 18 built held-out problems [(name, Problem)], from the pickle ``cache`` or built and pickled there."""
    from experiments.heldout_reference import heldout_problems
    if os.path.exists(cache):
        with open(cache, "rb") as f:
            return pickle.load(f)
    probs = [(n, w.build()) for n, w in heldout_problems()]
    with open(cache, "wb") as f:
        pickle.dump(probs, f)
    return probs


def binding(name: str, best: dict) -> bool:
    """Whether the cap binds on held-out problem ``name``: its best-known cost (``best``: name -> cost,
    nan where unknown) is above its uncapped twin's (as eval_policy: the uncapped optimum does not
    fit); the issue's binding-cap figures are over these."""
    twin = best.get(name.split(" cap")[0], float("nan"))
    return " cap" in name and not best.get(name, float("nan")) <= twin * (1 + 1e-9)


def main() -> None:
    args, probs = held_out_cli()
    import shardgym as sg
    from costmodel.problem import evaluate
    from experiments.heldout_reference import load, lookup
    entries, out, best = load(), {}, {}
    load_before = open("/proc/loadavg").read().strip()
    print("load", load_before)
    for name, p in probs:
        if args.only not in name:
            continue
        e = lookup(entries, name, p)
        t = time.perf_counter()
        try:
            c = evaluate(p, sg.solve(p, method="policy", search=False, checkpoint=args.checkpoint).strategies)
            cost, feasible = c.total, bool(c.feasible)
        except ValueError:
            cost, feasible = float("inf"), False
        dt = time.perf_counter() - t
        ratio = cost / e["cost"] if e and e.get("cost") else float("nan")
        best[name] = e["cost"] if e and e.get("cost") else float("nan")
        out[name] = {"ratio": ratio, "feasible": feasible, "seconds": dt}
        print(f"{name:42s} {ratio:7.3f} {'ok' if feasible else 'INFEASIBLE':10s} {dt:6.2f} s", flush=True)
    for n, v in out.items():
        v["binding"] = binding(n, best)
    groups = (("capped", lambda n, v: " cap" in n), ("binding", lambda n, v: v["binding"]),
              ("uncapped", lambda n, v: " cap" not in n), ("all", lambda n, v: True))
    for label, keep in groups:
        rows = [v for n, v in out.items() if keep(n, v)]
        if rows:
            rs = [v["ratio"] for v in rows]
            print(f"{label}: median {np.median(rs):.3f} max {max(rs):.3f} all feasible "
                  f"{all(v['feasible'] for v in rows)} seconds max {max(v['seconds'] for v in rows):.2f} (n={len(rows)})")
    load_after = open("/proc/loadavg").read().strip()
    print("load", load_after)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**out, "_load": {"before": load_before, "after": load_after},
                       "_checkpoint": args.checkpoint}, f, indent=1)


if __name__ == "__main__":
    main()
