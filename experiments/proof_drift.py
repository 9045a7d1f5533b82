"""Capped cells that lost their proof: ``solve(method="ilp")``'s status per bench_capped cell across result files.

A cell is (problem, cluster, cap in bytes); its rows are every bench_capped row of that cell in the "earlier"
files and in the "later" ones (any ``--compare`` variant; ``default`` rows are those run with the configuration
of their day: no ``variant``, or the variant named "after", which every A/B of sessions 25-27 used for the
default). Listed: cells proven optimal in some earlier default row and in no later default row, with each row's
status, gap, where its MILP phase ended and the load. Reads only JSON; runs no solver.

    python experiments/proof_drift.py                     # s25* / s26* against s27* / s28*
    python experiments/proof_drift.py --earlier 's25*' --later 's27*' --out s28b_proof_drift
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cell_rows(patterns: list[str], results_dir: str) -> dict:
    """{(problem, cluster, cap bytes): [row summary, ...]} over the bench_capped rows of the matching files."""
    out: dict = {}
    for pat in patterns:
        for path in sorted(glob.glob(os.path.join(results_dir, pat + ".json"))):
            try:
                rows = json.load(open(path)).get("rows")
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                continue
            for r in rows if isinstance(rows, list) else []:
                if not isinstance(r, dict) or not {"status", "cap_bytes", "problem", "cluster"} <= set(r):
                    continue
                milp = [m for m in r.get("log") or [] if "milp: status=" in m]
                out.setdefault((r["problem"], r["cluster"], round(float(r["cap_bytes"]))), []).append({
                    "file": os.path.basename(path), "variant": r.get("variant"), "overrides": r.get("overrides"),
                    "default": r.get("variant") in (None, "after") and not (r.get("variant") is None and r.get("overrides")),
                    "cap_fraction": r.get("cap_fraction"), "status": r["status"], "gap": r.get("gap"),
                    "ilp_cost": r.get("ilp_cost"), "git_rev": str(r.get("git_rev", ""))[:7],
                    "milp": re.sub(r"^\S+ ", "", milp[-1]) if milp else None,
                    "milp_end_s": float(milp[-1].split("s ")[0]) if milp else None,
                    "load": (r.get("load_avg_before") or [None])[0]})
    return out


def drift(earlier: dict, later: dict) -> list[dict]:
    """The cells proven in an earlier default row and in no later default row (that has any)."""
    lost = []
    for key, rows in sorted(earlier.items()):
        now = [r for r in later.get(key, []) if r["default"]]
        if any(r["default"] and r["status"] == "optimal" for r in rows) and now \
                and not any(r["status"] == "optimal" for r in now):
            lost.append({"problem": key[0], "cluster": key[1], "cap_bytes": key[2], "earlier": rows,
                         "later": later[key]})
    return lost


def main(argv=None) -> None:
    from experiments.common import RESULTS_DIR, write_results
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--earlier", default="s25*,s26*")
    ap.add_argument("--later", default="s27*,s28*")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    earlier = cell_rows(a.earlier.split(","), str(RESULTS_DIR))
    later = cell_rows(a.later.split(","), str(RESULTS_DIR))
    lost = drift(earlier, later)
    both = sum(1 for k in earlier if k in later)
    unseen = sorted(f"{k[0]} {k[1]} {k[2]:,} B" for k, rows in earlier.items() if k not in later
                    and any(r["default"] and r["status"] == "optimal" for r in rows))
    print(f"{len(earlier)} earlier cells, {len(later)} later, {both} in both; proven before, not after: {len(lost)}; "
          f"proven before and not run after: {len(unseen)}")
    for c in lost:
        print(f"- {c['problem']} {c['cluster']} cap {c['cap_bytes']:,} B")
        for tag in ("earlier", "later"):
            for r in c[tag]:
                gap = "-" if r["gap"] is None else f"{100 * r['gap']:.1f} %"
                print(f"    {tag:7s} {r['file']} {r['variant'] or ''} {r['git_rev']} {r['status']} gap {gap} "
                      f"milp [{r['milp']}] at {r['milp_end_s']} s, load {r['load']}")
    if a.out:
        write_results(a.out, {"earlier": a.earlier, "later": a.later, "cells_earlier": len(earlier),
                              "cells_later": len(later), "cells_both": both, "lost": lost,
                              "proven_not_rerun": unseen}, config=vars(a))


if __name__ == "__main__":
    main()
