"""Where Lagrangian BP's raw plan loses on held-out binding-cap rows (issue 18, session 26 helper b).

    python experiments/s26b_diagnose.py [--only SUBSTRING ...]  ->  results/s26b_diagnose.json

Per row: Lagrangian BP's raw plan (``bp_solve(rounds=60, memory_prices=True)``, what the shipped
network plans) against the best-known plan of results/heldout_reference.json: cost split into node and
edge cost, peak (with the resharded copies, ``evaluate``) over the cap, the time points where each
plan's live profile is within 2 % of the cap, the nodes where the plans differ (count, node-cost and
usage difference, how long they live, role), and the schedule's final prices (``PriceSchedule.lam``
recorded from its last ``update``: total, number of time points priced, whether the copy-priced phase
started). Exact figures of the cost model; nothing approximate.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

ROWS = ("meshgraphnet-tiny@h100-2x8 cap0.5", "meshgraphnet-tiny@tpu-4x4 cap0.5",
        "fno-tiny@a100-hetero-2x4 cap0.5", "fno-tiny@h100-2x8 cap0.5")


def _profile(p, s):
    from costmodel.problem import usage_profile
    flat = p.strategy_offsets[:-1] + s
    copies = None if p.edge_memory is None else p.edge_memory.intervals(s)
    return usage_profile(p, p.node_usages[flat], extra=copies)


def diagnose(name, p, ref_plan) -> dict:
    from costmodel.problem import evaluate
    from solvers import bp_schedule
    from solvers.bp import bp_solve
    seen = {}
    orig = bp_schedule.PriceSchedule.update

    def rec(self, r, ratio, lam=None):
        orig(self, r, ratio, lam)
        seen.update(r=r, lam=self.lam.copy(), copy_phase=self.cp is not None, binding=self.binding,
                    over=int((ratio > 1.0).sum()), ratio_max=float(ratio.max()))
    bp_schedule.PriceSchedule.update = rec
    try:
        raw = np.asarray(bp_solve(p, rounds=60, memory_prices=True, bound=False).plan)
    finally:
        bp_schedule.PriceSchedule.update = orig
    ref = np.asarray(ref_plan)
    cr, cb = evaluate(p, raw), evaluate(p, ref)
    cap = float(p.usage_limit)
    out = {"ratio": cr.total / cb.total, "raw": {"node": cr.node_cost, "edge": cr.edge_cost, "peak/cap": cr.peak_memory_bytes / cap},
           "ref": {"node": cb.node_cost, "edge": cb.edge_cost, "peak/cap": cb.peak_memory_bytes / cap}}
    for lab, s in (("raw", raw), ("ref", ref)):
        t, u = _profile(p, s)
        near = np.flatnonzero(u >= 0.98 * cap)
        out[lab]["times_near_cap"] = int(len(near))
        out[lab]["near_cap_span"] = [int(t[near[0]]), int(t[near[-1]])] if len(near) else None
        out[lab]["mean_usage/cap"] = float(np.mean(u) / cap)
    diff = np.flatnonzero(raw != ref)
    off = p.strategy_offsets[:-1]
    life = p.intervals[:, 1] - p.intervals[:, 0]
    dnode = p.node_costs[off[diff] + raw[diff]] - p.node_costs[off[diff] + ref[diff]]
    dus = p.node_usages[off[diff] + raw[diff]] - p.node_usages[off[diff] + ref[diff]]
    roles = p.meta.roles if p.meta is not None and p.meta.roles else ["?"] * p.num_nodes
    by_role = {}
    for i, dn, du in zip(diff, dnode, dus):
        r = by_role.setdefault(roles[i], {"n": 0, "d_node_cost": 0.0, "d_usage/cap": 0.0})
        r["n"] += 1
        r["d_node_cost"] += float(dn)
        r["d_usage/cap"] += float(du) / cap
    span = float(p.intervals[:, 1].max() - p.intervals[:, 0].min())
    out["differ"] = {"nodes": int(len(diff)), "of": int(p.num_nodes),
                     "d_node_cost": float(dnode.sum()), "d_edge_cost": cr.edge_cost - cb.edge_cost,
                     "d_usage/cap_sum": float(dus.sum() / cap),
                     "raw_uses_more_on": int((dus > 0).sum()), "raw_uses_less_on": int((dus < 0).sum()),
                     "median_life/span_of_differing": float(np.median(life[diff]) / span) if len(diff) else None,
                     "median_life/span_all": float(np.median(life) / span), "by_role": by_role}
    lam = seen.get("lam")
    out["prices"] = None if lam is None else {
        "last_update_round": seen["r"], "copy_phase": seen["copy_phase"], "still_binding": seen["binding"],
        "points_priced": int((lam > 0).sum()), "of_points": int(len(lam)), "sum": float(lam.sum()),
        "last_ratio_max": seen["ratio_max"], "last_points_over": seen["over"]}
    return out


def main() -> None:
    from experiments.common import write_results
    from experiments.heldout_reference import load, lookup
    from experiments.raw_decode_bench import held_out_problems
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(ROWS))
    ap.add_argument("--out", default="s26b_diagnose")
    a = ap.parse_args()
    entries, res = load(), {}
    load_before = open("/proc/loadavg").read().strip()
    for name, p in held_out_problems():
        if name not in a.only:
            continue
        e = lookup(entries, name, p)
        if not e or e.get("plan") is None:
            print(name, "no reference plan")
            continue
        res[name] = d = diagnose(name, p, e["plan"])
        print(name, {k: d[k] for k in ("ratio", "raw", "ref")}, "\n  differ", d["differ"], "\n  prices", d["prices"],
              flush=True)
    write_results(a.out, {"rows": res, "load_before": load_before})


if __name__ == "__main__":
    main()
