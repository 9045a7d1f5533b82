"""``shardgym.solve(method="ilp")`` under binding memory caps against ``method="policy"``.

Per problem (zoo tiny models and train steps written here, outside the zoo) on a cluster: lo = the
least peak found (the lower of the memory objective's plan alone, ``solvers.ilp.min_peak_memory``,
and seeded with the baselines, ``solve(objective="memory")``, ``--least-seconds`` each; with copies
it is a time-limited MIP, so lo is an upper bound of the least peak), hi = the peak of the
uncapped time-optimal plan (ILP, ``--uncapped-seconds``), lo >= hi: skipped; per cap at 25 / 50 /
75 % of the way from lo to hi: the ILP's plan at ``--seconds`` (cost, status, bound, gap, wall)
and the policy's (cost, wall), ratio = ILP cost / policy cost (<= 1: never worse). Records the
load average, and the capped core's phase log (``log``: which phase found which plan when, the bounds).

The outside-the-zoo steps: ``outside:moe``, ``outside:rnn``, ``outside:convae``
(tests/data/outside_steps.py), and two written here (plain JAX, no Flax): ``autoencoder`` (four
convolutions, two of them residual, and a transposed convolution, MSE, SGD with momentum) and
``moe_adam`` (a six-expert soft mixture of MLPs with a softmax gate, Adam written out).

``--full`` is every zoo tiny model and the outside steps (tests/data/outside_steps.py and two here) on cpu-2x4, h100-2x8 and tpu-4x4
(99 cells, hours on 2 shared cores); the default is a subset (``SUBSET``: the four zoo models whose
caps session 12 found hardest, and two outside steps, on cpu-2x4 and h100-2x8; 36 cells). It is
resumable per cell: every finished cell is written to ``results/<--out>.json`` at once (with the git
revision and the load average of that cell), and a rerun skips the cells already there (``--fresh``
starts over). The caps are derived at the current revision: a setup (lo, hi) stored by another
revision is solved again (a stale cap can sit below today's least peak: vit tiny cpu-2x4's 731,651 B
of session 11 against 723,700 B in session 12), and each setup records its revision. Cells run
cluster by cluster, so a partial run covers whole clusters first. ``previous_rows`` (kept across
reruns) holds an earlier revision's cells of the same grid; ``--table`` shows them beside the new ones.
``--caps-file results/X.json`` takes X's least / time-optimal peaks (its ``setups``) instead of
solving for them: the same caps in bytes as X's cells, and no setup solves; problems X lacks are skipped.
``--compare FIELD=VALUE,...`` runs every cell twice in one run, interleaved (which goes first
alternates): "before" with the capped core's configuration (``solvers.dispatch.TRACED``) overridden
by those fields, "after" as it is (or with ``--after``'s overrides), so that a change is measured under the same load; rows carry
``variant``, and the policy runs once per cell. ``policy_beside=0``, ``policy_skips_bp=0``, ``policy_seed_share=X``, ``policy_search=1`` and
``policy_search_after=1`` (``_DISPATCH``) set ``solvers.dispatch.POLICY_SEED_BESIDE`` / ``POLICY_SKIPS_BP`` /
``POLICY_SEED_SHARE`` / ``POLICY_SEED_SEARCH`` / ``POLICY_SEARCH_AFTER_RAW``. ``--table --ab`` prints such a run one line per cell, the two variants side by side
(ILP cost, gap, ILP / policy, how the policy seed reached the core, load) with the cheaper / equal / dearer counts.

    nice -n 10 python experiments/bench_capped.py --full              # the full grid, resumable
    python experiments/bench_capped.py --problems gpt:tiny --clusters cpu-2x4 --out bench_capped_gpt
    python experiments/bench_capped.py --clusters cpu-2x4 --caps-file results/bench_capped.json --out bench_capped_s8
    python experiments/bench_capped.py --compare cfn_copies_max_s=inf,lagrange_share=0.45 --out bench_capped_ab
    python experiments/bench_capped.py --table --ab --out s25_bench_capped_tpu_seedsearch_ab
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")


def autoencoder_step():
    import jax
    import jax.numpy as jnp

    def conv(x, w, stride=1):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(p, x):
        h = jax.nn.relu(conv(x, p["enc1"]))
        h = jax.nn.relu(conv(h, p["enc2"], 2))
        h = jax.nn.relu(conv(h, p["mid1"])) + h
        h = jax.nn.relu(conv(h, p["mid2"])) + h
        y = jax.lax.conv_transpose(h, p["dec"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean((y - x) ** 2)

    def step(p, mom, x):
        g = jax.grad(loss)(p, x)
        mom = jax.tree.map(lambda m, gi: 0.9 * m + gi, mom, g)
        return jax.tree.map(lambda w, m: w - 1e-2 * m, p, mom), mom

    k = jax.random.split(jax.random.PRNGKey(0), 6)
    p = {"enc1": jax.random.normal(k[0], (3, 3, 8, 32)) * 0.1, "enc2": jax.random.normal(k[1], (3, 3, 32, 64)) * 0.1,
         "mid1": jax.random.normal(k[4], (3, 3, 64, 64)) * 0.1, "mid2": jax.random.normal(k[5], (3, 3, 64, 64)) * 0.1,
         "dec": jax.random.normal(k[2], (3, 3, 64, 8)) * 0.1}
    mom = jax.tree.map(jnp.zeros_like, p)
    return step, (p, mom, jax.random.normal(k[3], (16, 32, 32, 8)))


def moe_adam_step():
    import jax
    import jax.numpy as jnp

    def loss(p, x, t):
        gate = jax.nn.softmax(x @ p["gate"], axis=-1)
        y = 0.0
        for e in range(E):
            y = y + gate[:, e:e + 1] * (jax.nn.relu(x @ p[f"w1_{e}"]) @ p[f"w2_{e}"])
        return jnp.mean((y - t) ** 2)

    def step(p, m, v, x, t):
        g = jax.grad(loss)(p, x, t)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        p = jax.tree.map(lambda w, a, b: w - 1e-3 * a / (jnp.sqrt(b) + 1e-8), p, m, v)
        return p, m, v

    E = 6
    k = jax.random.split(jax.random.PRNGKey(1), 3 + 2 * E)
    d, h = 64, 256
    p = {"gate": jax.random.normal(k[0], (d, E)) * 0.1}
    for e in range(E):
        p[f"w1_{e}"] = jax.random.normal(k[1 + 2 * e], (d, h)) * 0.1
        p[f"w2_{e}"] = jax.random.normal(k[2 + 2 * e], (h, d)) * 0.1
    z = jax.tree.map(jnp.zeros_like, p)
    return step, (p, z, z, jax.random.normal(k[-2], (64, d)), jax.random.normal(k[-1], (64, d)))


OUTSIDE = {"autoencoder": autoencoder_step, "moe_adam": moe_adam_step}
#: progress lines left out of a cell's ``log`` (per round / per step noise): the phases' new best plans and bounds stay
_QUIET = ("cfn round", "tied dp", "given start", "continuing the tied run", "anchor (lowest usage)", "cfn start")


def _step(spec: str):
    """(step, args) of a problem spec: "model:size" (zoo), "outside:name" or a step written here."""
    if spec in OUTSIDE:
        return OUTSIDE[spec]()
    kind, name = spec.split(":")
    if kind == "outside":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data"))
        import outside_steps
        return outside_steps.STEPS[name]()
    import zoo
    return zoo.build(kind, name, abstract=True)


#: ``--compare`` names that set a ``solvers.dispatch`` setting rather than a CappedConfig field (its type: the setting's)
_DISPATCH = {"policy_beside": "POLICY_SEED_BESIDE", "policy_skips_bp": "POLICY_SKIPS_BP",
             "policy_seed_share": "POLICY_SEED_SHARE", "policy_search": "POLICY_SEED_SEARCH",
             "policy_search_after": "POLICY_SEARCH_AFTER_RAW"}
#: the default grid (``--full``: every zoo tiny model and outside step on FULL_CLUSTERS)
SUBSET = ("gpt:tiny,vit:tiny,unet:tiny,meshgraphnet:tiny,outside:moe,autoencoder", "cpu-2x4,h100-2x8")
FULL_CLUSTERS = "cpu-2x4,h100-2x8,tpu-4x4"


def _full_problems() -> str:
    import zoo
    from experiments.fidelity import outside_steps
    return ",".join([f"{m}:{zoo.sizes(m)[0]}" for m in zoo.names()]
                    + [f"outside:{n}" for n in outside_steps()] + list(OUTSIDE))


def _overrides(text: str | None) -> dict:
    """``--compare``'s "field=value,..." as CappedConfig field values (the field's own type)."""
    import solvers.dispatch as dispatch
    from solvers.capped import CappedConfig
    fields = {**CappedConfig.__dataclass_fields__, **_DISPATCH}
    out = {}
    for item in filter(None, (text or "").split(",")):
        k, _, v = item.partition("=")
        if k not in fields or not v:
            raise SystemExit(f"--compare: {item!r} is not FIELD=VALUE with a CappedConfig field "
                             f"({', '.join(fields)})")
        kind = type(getattr(dispatch, _DISPATCH[k])) if k in _DISPATCH else type(getattr(CappedConfig(), k))
        out[k] = bool(int(v)) if kind is bool else kind(v)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=None, help=f"comma list (default: {SUBSET[0]}; --full: every zoo tiny "
                                                     "model + the outside steps)")
    ap.add_argument("--clusters", default=None, help=f"comma list (default: {SUBSET[1]}; --full: {FULL_CLUSTERS})")
    ap.add_argument("--full", action="store_true", help="the full grid (the module docstring)")
    ap.add_argument("--compare", default=None, help="FIELD=VALUE,...: each cell also run with the capped core's "
                                                    "configuration so overridden (variant 'before')")
    ap.add_argument("--fractions", default="0.25,0.5,0.75")
    ap.add_argument("--after", default=None, help="FIELD=VALUE,...: with --compare, the 'after' variant's overrides "
                                                  "(default: none, the configuration as it is)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--uncapped-seconds", type=float, default=30.0)
    ap.add_argument("--least-seconds", type=float, default=30.0,
                    help="the memory objective's limit for the least peak (with copies it is a MIP)")
    ap.add_argument("--no-policy", action="store_true")
    ap.add_argument("--caps-file", default=None,
                    help="a results JSON of this script: take its setups' lo/hi bytes (so its caps) instead of "
                         "solving for them, so that two runs compare like for like")
    ap.add_argument("--out", default="bench_capped")
    ap.add_argument("--fresh", action="store_true", help="ignore the cells already in results/<out>.json")
    ap.add_argument("--table", action="store_true", help="print results/<out>.json as README's markdown table; run nothing")
    ap.add_argument("--ab", action="store_true", help="with --table: one line per cell, the --compare run's two "
                                                      "variants side by side (``ab_markdown``)")
    a = ap.parse_args(argv)
    if a.table:
        from experiments.common import RESULTS_DIR
        res = json.loads((RESULTS_DIR / f"{a.out}.json").read_text())
        print(ab_markdown(res) if a.ab else markdown(res))
        return
    import shardgym as sg
    from experiments.common import RESULTS_DIR, git_rev, print_table, write_results
    from solvers.ilp import min_peak_memory
    problems = (a.problems or (_full_problems() if a.full else SUBSET[0])).split(",")
    a.clusters = a.clusters or (FULL_CLUSTERS if a.full else SUBSET[1])
    variants = [("before", _overrides(a.compare)), ("after", _overrides(a.after))] if a.compare else [(None, {})]
    path = RESULTS_DIR / f"{a.out}.json"
    old = {} if a.fresh or not path.exists() else json.loads(path.read_text())
    rows, setups = list(old.get("rows", [])), dict(old.get("setups", {}))
    done = {(r["problem"], r["cluster"], r["cap_fraction"], r.get("variant")) for r in rows}
    rev = git_rev()
    fractions = [float(x) for x in a.fractions.split(",")]
    graphs = {}
    fixed = json.loads(open(a.caps_file).read())["setups"] if a.caps_file else {}

    def save():
        write_results(a.out, {"rows": rows, "setups": setups, "previous_rows": old.get("previous_rows", []),
                              "complete": all((q, c, f, v) in done for c in a.clusters.split(",")
                                              for q in problems for f in fractions for v, _ in variants)},
                      config=vars(a))

    for cl in a.clusters.split(","):
        for spec in problems:
            if all((spec, cl, f, v) in done for f in fractions for v, _ in variants):
                continue
            if spec not in graphs:
                graphs[spec] = sg.trace(*_pair(_step(spec)))
            p = sg.build_problem(graphs[spec], sg.Cluster.preset(cl)).with_usage_limit(None)
            key = f"{spec}|{cl}"
            if key in setups and not a.caps_file and setups[key].get("git_rev") != rev:
                print(f"{key}: setup of revision {setups[key].get('git_rev')}: solved again at {rev}", flush=True)
                del setups[key]
            if key not in setups and key in fixed:
                setups[key] = {**fixed[key], "from": a.caps_file}
            elif key not in setups and a.caps_file:
                print(f"{key}: not in {a.caps_file}: skipped", flush=True)
                continue
            if key not in setups:
                t = time.perf_counter()
                fast = sg.solve(p, method="ilp", time_limit_s=a.uncapped_seconds)   # seeded with replicated
                hi = sg.evaluate(p, fast).peak_memory_bytes
                # the least peak found: the memory objective alone and seeded with the baselines
                # (with copies it is a MIP; alone it returned unet tiny's least-usage plan, over hi)
                lo_ilp = min_peak_memory(p, time_limit_s=a.least_seconds)
                lo_seeded = sg.evaluate(p, sg.solve(p, method="ilp", objective="memory",
                                                    time_limit_s=a.least_seconds)).peak_memory_bytes
                lo = min(lo_ilp, lo_seeded)
                setups[key] = {"lo_bytes": lo, "hi_bytes": hi, "lo_ilp_bytes": lo_ilp, "lo_seeded_bytes": lo_seeded,
                               "nodes": p.num_nodes,
                               "copy_groups": 0 if p.edge_memory is None else p.edge_memory.num_groups,
                               "setup_s": round(time.perf_counter() - t, 1), "git_rev": rev,
                               "load_avg": [round(x, 2) for x in os.getloadavg()]}
            lo, hi = setups[key]["lo_bytes"], setups[key]["hi_bytes"]
            if lo >= hi:   # no cap between them binds
                print(f"{key}: least peak found {lo:.6g} >= the time optimum's {hi:.6g}: skipped", flush=True)
                continue
            for i, f in enumerate(fractions):
                todo = [(v, o) for v, o in variants if (spec, cl, f, v) not in done]
                cap = lo + f * (hi - lo)
                pol = None
                for v, o in (todo if (i + len(done)) % 2 == 0 else todo[::-1]):   # which goes first alternates
                    row = {"problem": spec, "cluster": cl, "nodes": p.num_nodes, "cap_fraction": f, "cap_bytes": cap,
                           "lo_bytes": lo, "hi_bytes": hi, "git_rev": rev, **({"variant": v, "overrides": o} if v else {}),
                           "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
                    with _traced_config(o):
                        row.update(_ilp_cell(sg, p, cap, a.seconds))
                    if not a.no_policy:
                        pol = pol or _policy_cell(sg, p, cap, a.seconds)
                        row.update(pol)
                        if row.get("ilp_cost") is not None and (row.get("policy_cost") or 0) > 0:
                            row["ilp_over_policy"] = round(row["ilp_cost"] / row["policy_cost"], 4)
                    row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
                    rows.append(row)
                    done.add((spec, cl, f, v))
                    print({k: x for k, x in row.items() if k != "log"}, flush=True)
                    save()
    print_table(rows, ["problem", "cluster", "nodes", "cap_fraction", "ilp_cost", "status", "gap", "ilp_s",
                       "policy_cost", "ilp_over_policy", "policy_s", "load_avg_before"],
                title=f"solve(method='ilp') under binding caps at {a.seconds:g} s vs method='policy'")
    save()


class _traced_config:
    """Within: ``solvers.dispatch.TRACED`` (the capped core's configuration for ``shardgym.solve``)
    with ``overrides``; restored on exit (``--compare``'s "before" variant)."""

    def __init__(self, overrides: dict):
        self.overrides = overrides

    def __enter__(self):
        from dataclasses import replace

        import solvers.dispatch as dispatch
        self.saved = dispatch.TRACED, {n: getattr(dispatch, n) for n in _DISPATCH.values()}
        dispatch.TRACED = replace(dispatch.TRACED, **{k: v for k, v in self.overrides.items() if k not in _DISPATCH})
        for k, v in self.overrides.items():
            if k in _DISPATCH:
                setattr(dispatch, _DISPATCH[k], v)

    def __exit__(self, *exc):
        import solvers.dispatch as dispatch
        dispatch.TRACED = self.saved[0]
        for n, v in self.saved[1].items():
            setattr(dispatch, n, v)


def _ilp_cell(sg, p, cap: float, seconds: float) -> dict:
    """``solve(method="ilp")`` under ``cap``: cost, fit, status, bound, gap, source, wall, phase log."""
    pc = p.with_usage_limit(cap)
    t = time.perf_counter()
    row, log = {}, []
    try:
        plan = sg.solve(p, method="ilp", memory_cap_bytes=cap, time_limit_s=seconds,
                        progress=lambda m: log.append(f"{time.perf_counter() - t:.1f}s {m}"))
        c = sg.evaluate(pc, plan)
        row.update(ilp_cost=c.total, ilp_feasible=c.feasible, status=plan.info.get("status"),
                   bound=plan.info.get("bound"), gap=plan.info.get("gap"), source=plan.info.get("source"))
    except (RuntimeError, ValueError) as exc:
        row.update(ilp_cost=None, ilp_feasible=False, status="error", error=str(exc)[:200])
    row["ilp_s"] = round(time.perf_counter() - t, 1)
    row["log"] = [m for m in log if not any(k in m for k in _QUIET)][:80]
    return row


def _policy_cell(sg, p, cap: float, seconds: float | None = None) -> dict:
    """``solve(method="policy", time_limit_s=seconds)`` under ``cap``: cost, fit, wall. Before session 27 the
    policy ignored its limit (these rows' ``policy_s`` went to 201 s); now it gets the ILP's ``--seconds``."""
    t = time.perf_counter()
    try:
        c = sg.evaluate(p.with_usage_limit(cap), sg.solve(p, method="policy", memory_cap_bytes=cap, time_limit_s=seconds))
        row = {"policy_cost": c.total, "policy_feasible": c.feasible}
    except (RuntimeError, ValueError) as exc:
        row = {"policy_cost": None, "policy_feasible": False, "policy_error": str(exc)[:200]}
    return {**row, "policy_s": round(time.perf_counter() - t, 1)}


def _fmt(x, f: str = "{:.4g}") -> str:
    return "—" if x is None else f.format(x)


def _gap_met(r: dict) -> bool:
    """The ILP's plan fits and its gap is <= 2 % (issue 16's target)."""
    return bool(r.get("ilp_feasible")) and r.get("gap") is not None and r["gap"] <= 0.02


def _worse_than_policy(r: dict) -> bool:
    """The policy's plan fits and the ILP's is dearer (strictly; no ILP plan counts as dearer)."""
    return bool(r.get("policy_feasible")) and (r.get("ilp_over_policy") is None or r["ilp_over_policy"] > 1 + 1e-9)


def markdown(res: dict) -> str:
    """README's table of a results file, with the counts against the targets."""
    fmt = _fmt
    prev = {(r["problem"], r["cluster"], r["cap_fraction"]): r for r in res.get("previous_rows", [])}
    out = ["| problem | cluster | nodes | cap | ILP cost | status | gap | source | ILP wall | policy cost | "
           "ILP / policy | policy wall | load | before: ILP cost, / policy, load |", "|---" * 14 + "|"]
    rows = res.get("rows", [])
    for r in rows:
        b = prev.get((r["problem"], r["cluster"], r["cap_fraction"]))
        before = "—" if b is None else (f"{fmt(b.get('ilp_cost'))}, {fmt(b.get('ilp_over_policy'), '{:.3f}')}, "
                                        f"{b['load_avg_before'][0]:.1f}")
        out.append(f"| {r['problem']}{' (' + r['variant'] + ')' if r.get('variant') else ''} | {r['cluster']} | {r['nodes']} | {r['cap_fraction']:.0%} | {fmt(r.get('ilp_cost'))} | "
                   f"{r.get('status')} | {fmt(r.get('gap'), '{:.1%}')} | {r.get('source') or '—'} | {r.get('ilp_s')} s | "
                   f"{fmt(r.get('policy_cost'))} | {fmt(r.get('ilp_over_policy'), '{:.3f}')} | {r.get('policy_s')} s | "
                   f"{r['load_avg_before'][0]:.1f} | {before} |")
    out.append("")
    for v in sorted({r.get("variant") for r in rows}, key=str):
        vr = [r for r in rows if r.get("variant") == v]
        fits = [r for r in vr if r.get("ilp_feasible")]
        small = [r for r in fits if _gap_met(r)]
        pol = [r for r in vr if r.get("policy_feasible")]
        worse = [r for r in pol if _worse_than_policy(r)]
        gaps = sorted(r["gap"] for r in fits if r.get("gap") is not None)
        out.append(f"{'' if v is None else v + ': '}{len(vr)} cells; the ILP's plan fits in {len(fits)}; gap <= 2 % in "
                   f"{len(small)}{f' (median gap {gaps[len(gaps) // 2]:.1%})' if gaps else ''}; the ILP is worse than "
                   f"the policy in {len(worse)} of the {len(pol)} cells where the policy's plan fits"
                   f"{'' if res.get('complete') else ' (partial run)'}.")
    if prev:
        out.append(f"Before ('previous_rows', the revisions named there): {len(prev)} cells; the ILP worse than the "
                   f"policy in {sum(1 for b in prev.values() if (b.get('ilp_over_policy') or 0) > 1 + 1e-9)}; gap <= 2 % in "
                   f"{sum(1 for b in prev.values() if b.get('gap') is not None and b['gap'] <= 0.02)}.")
    return "\n".join(out)


def seed_path(row: dict) -> str:
    """How the cell's policy seed reached the capped core, from its phase log: "inline N s" (the core
    waited for it and had it after N s; ", search at M s": the planner's search beside the core after it, its plan
    M s into the solve, or ", search late": not within the limit), "late" (still running at ``POLICY_SEED_SHARE`` of the limit,
    then beside the core), "beside" (an idle core: beside from the start), "none" (no plan), "—" (no log)."""
    for m in row.get("log", []):
        text = m.split(" ", 1)[-1]
        if text.startswith("policy seed: still running"):
            return "late"
        if text.startswith("policy seed: none"):
            return "none"
        if text.startswith("policy seed: "):    # "...: the planner's search goes on": ``POLICY_SEARCH_AFTER_RAW``
            head, _, going = text.partition("): ")
            out = f"inline {head.rsplit('(', 1)[-1].rstrip('s)')} s"
            at = next((x.split(" ", 1)[0].rstrip("s") for x in row["log"] if " late seed: " in x and " after " in x), None)
            return out if not going else out + (f", search at {at} s" if at else ", search late")
        if text.startswith("late seed"):
            return "beside"
    return "—"


def ab_markdown(res: dict, tol: float = 1e-4, labels: tuple = ("before", "after")) -> str:
    """A ``--compare`` run's cells, one line each: the ILP's cost, gap and ILP / policy with the
    overrides ("before") and without ("after"), how the policy seed reached the core (``seed_path``)
    and the 1-min load at the start of each; then the counts: cells where "before"'s plan is cheaper,
    equal (within ``tol`` relative: two runs' plans differ by 6e-7 to 7e-6 where they are the same
    but for a tie, s25/s26a) or dearer, and per variant the cells with gap <= 2 % and with the ILP
    worse than the policy (strictly, as ``markdown``). ``labels``: the variants' names in the text."""
    fmt = _fmt
    cells: dict = {}
    for r in res.get("rows", []):
        cells.setdefault((r["problem"], r["cluster"], r["cap_fraction"]), {})[r.get("variant")] = r
    ba = " / ".join(labels)
    out = [f"| problem | cluster | cap | ILP cost {ba} | gap {ba} | ILP / policy {ba} | policy cost | seed {ba} | "
           f"load {ba} |", "|---" * 9 + "|"]
    tally = {"cheaper": 0, "equal": 0, "dearer": 0}
    small, worse = {"before": 0, "after": 0}, {"before": 0, "after": 0}
    for (prob, cl, f), v in cells.items():
        b, a = v.get("before"), v.get("after")
        if b is None or a is None:
            continue
        for name, r in (("before", b), ("after", a)):
            small[name] += _gap_met(r)
            worse[name] += _worse_than_policy(r)
        cb = b.get("ilp_cost") if b.get("ilp_feasible") else None
        ca = a.get("ilp_cost") if a.get("ilp_feasible") else None
        if cb is not None or ca is not None:
            tally["cheaper" if ca is None or (cb is not None and cb < ca * (1 - tol)) else
                  "dearer" if cb is None or cb > ca * (1 + tol) else "equal"] += 1
        two = (lambda key, f="{:.4g}": f"{fmt(b.get(key), f)} / {fmt(a.get(key), f)}")
        out.append(f"| {prob} | {cl} | {f:.0%} | {two('ilp_cost')} | {two('gap', '{:.1%}')} | "
                   f"{two('ilp_over_policy', '{:.3f}')} | {fmt(a.get('policy_cost'))} | {seed_path(b)} / {seed_path(a)} | "
                   f"{b['load_avg_before'][0]:.1f} / {a['load_avg_before'][0]:.1f} |")
    n = sum(tally.values())
    b, a = labels
    out += ["", f"{n} cells: the ILP's plan is cheaper {b} in {tally['cheaper']}, equal in {tally['equal']}, dearer in "
                f"{tally['dearer']}; gap <= 2 %: {b} {small['before']}, {a} {small['after']}; the ILP worse than "
                f"the policy: {b} {worse['before']}, {a} {worse['after']}"
                f"{'' if res.get('complete') else ' (partial run)'}."]
    return "\n".join(out)


def _pair(step_args):
    fn, args = step_args
    return (fn, *args)


if __name__ == "__main__":
    main()
