"""Long searches on the shared IOPDDL instances (A, M, S): the exact MILP of the *tied* graph with
memory rows added lazily, resumable, verified by an independent contest-rules evaluator.

Why: ``shardgym iopddl`` at 60 s stays 0.0024 % above the best-known cost on A and 0.003 % on M;
with a larger timeout its phase mix hands ~75 % of the time to toulbar2 rounds at Lagrangian
memory prices, whose bound stalls at the Lagrangian dual (A: 6,511,578,112, 0.57 % below). But the
exact reductions (``solvers.local.prepare``: pruning, permutation ties) shrink A to 285
components with a choice (2,434 strategies, 458 edges between two of them, 49,321 entries), a
MILP HiGHS can hold whole. Here:

* **Model** (``TiedMilp``): x_{c,a} (binary, one per choice component c and strategy a, Σ_a x = 1),
  y_e (continuous ≥ 0, one per entry of an edge between two choice components, marginals equal to
  x); edges to fixed components fold into the unary costs, the rest is a constant. The memory
  limit is one row per compressed time point t: Σ (u_i(a) − min u_i) x_{c(i),a} over the member
  nodes i live at t ≤ limit − Σ min u_i. Rows are added lazily: first those where the start plan's
  profile is within ``--near`` of the limit, then every row a MILP answer breaks (``--add`` at most
  per round, the most violated first), and the MILP is solved again. With fewer rows the MILP is a
  relaxation, so each HiGHS dual bound is a lower bound of the forbidden-free optimum (the pruning's
  premise, as for ``solvers.cfn``'s bound); a MILP answer that fits every row is feasible, and if
  HiGHS proved it optimal it is the optimum.
* **Resumable**: the best plan, the bound and the rows added are written atomically to
  ``runs/s19b_long_<X>.json`` after every round; a rerun starts from there.
* **Verification** (``contest_evaluate``): an evaluator written from the contest rules on the raw
  file (not ``costmodel.problem.evaluate``): cost = Σ chosen node costs + Σ edge entries
  (row-major, producer's strategy first); usage of a node counts on its half-open interval
  [start, end); feasible iff the summed usage never exceeds ``usage_limit``. Integer arithmetic.

Usage: ``PYTHONPATH=. python experiments/iopddl_long.py A --start plan.json --round-s 300 --total-s 3000``.
Time per round is HiGHS's time limit (approximate by one LP solve / one node); ``--total-s`` bounds
the run (a round started before it may run its full ``--round-s`` past it).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import highspy
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from costmodel.problem import Problem, evaluate  # noqa: E402
from experiments.common import git_rev  # noqa: E402
from solvers.local import prepare  # noqa: E402
from solvers.search import solve_large  # noqa: E402

SHARED = "/work/shared/iopddl"
RUNS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs")


def contest_evaluate(path: str, plan) -> dict:
    """The contest rules on the raw instance file: {cost, peak, limit, feasible} (ints)."""
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        p = json.load(f)["problem"]
    nodes, edges = p["nodes"], p["edges"]
    n = len(nodes["costs"])
    if len(plan) != n:
        return {"cost": None, "feasible": False, "why": f"plan has {len(plan)} entries for {n} nodes"}
    cost, events = 0, {}
    for i, s in enumerate(plan):
        s = int(s)
        if not 0 <= s < len(nodes["costs"][i]):
            return {"cost": None, "feasible": False, "why": f"node {i}: strategy {s} out of range"}
        cost += int(nodes["costs"][i][s])
        a, b = nodes["intervals"][i]
        u = int(nodes["usages"][i][s])
        if b > a and u:
            events[a] = events.get(a, 0) + u     # half-open [a, b): on at a, off at b
            events[b] = events.get(b, 0) - u
    for (u, v), table in zip(edges["nodes"], edges["costs"]):
        cost += int(table[int(plan[u]) * len(nodes["costs"][v]) + int(plan[v])])
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    limit = p.get("usage_limit")
    return {"cost": cost, "peak": peak, "limit": limit, "feasible": limit is None or peak <= limit}


class TiedMilp:
    """The tied graph's MILP (module docstring) with a growing set of memory rows."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.pr, g, C, _ = prepare(problem)
        self.g, self.C = g, C
        cp = C.problem
        k = cp.num_strategies.astype(np.int64)
        offs = cp.strategy_offsets.astype(np.int64)
        choice = k > 1
        self.col = np.full(len(cp.node_costs), -1, dtype=np.int64)     # comp flat -> x column
        flat_choice = np.nonzero(choice[np.repeat(np.arange(cp.num_nodes), k)])[0]
        self.col[flat_choice] = np.arange(len(flat_choice))
        self.nx = nx = len(flat_choice)
        self.choice_nodes = np.nonzero(choice)[0]
        unary = cp.node_costs.astype(np.float64).copy()
        const = float(unary[offs[:-1][~choice]].sum())
        ycost, rows = [], []          # rows: (y columns, x column) marginal equalities
        ny = 0
        self.pairs = []               # (comp u, comp v, first y column) of edges between choice comps
        for e, (u, v) in enumerate(cp.edges.tolist()):
            M = cp.edge_costs[cp.edge_offsets[e]:cp.edge_offsets[e + 1]].reshape(int(k[u]), int(k[v]))
            if choice[u] and choice[v]:
                base = nx + ny
                ycost.append(M.ravel())
                idx = base + np.arange(M.size).reshape(M.shape)
                rows += [(idx[a], self.col[offs[u] + a]) for a in range(M.shape[0])]
                rows += [(idx[:, b], self.col[offs[v] + b]) for b in range(M.shape[1])]
                self.pairs.append((u, v, base))
                ny += M.size
            elif choice[u]:
                unary[offs[u]:offs[u + 1]] += M[:, 0]
            elif choice[v]:
                unary[offs[v]:offs[v + 1]] += M[0, :]
            else:
                const += float(M[0, 0])
        self.const = const
        self.cost = np.concatenate([unary[flat_choice]] + ycost)
        self.ny = ny
        # memory: per pruned-graph node its least live usage; the excess per strategy row
        mn = np.minimum.reduceat(g.live_usage, g.offs[:-1])
        mx = np.maximum.reduceat(g.live_usage, g.offs[:-1])
        self.rhs = float(g.cap) - g.profile_of(mn) if g.cap is not None else None
        var = np.nonzero((mx > mn) & g.live_mask)[0]
        self.var_nodes = var
        r = np.nonzero(np.isin(g.node_of, var))[0]       # flat rows of the varying nodes
        self.r_node = g.node_of[r]
        self.r_col = self.col[C.cflat[r]]
        self.r_val = g.live_usage[C.oflat[r]] - mn[self.r_node]
        assert (self.r_col >= 0).all(), "a node with varying usage in a fixed component"
        self.rows_t: list[int] = []
        self.h = self._build(rows)

    def _build(self, rows):
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        n = self.nx + self.ny
        inf = highspy.kHighsInf
        h.addVars(n, np.zeros(n), np.concatenate([np.ones(self.nx), np.full(self.ny, inf)]))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), self.cost)
        h.changeColsIntegrality(self.nx, np.arange(self.nx, dtype=np.int32),
                                np.array([highspy.HighsVarType.kInteger] * self.nx))
        starts_, idx, val = [], [], []
        C = self.C
        offs = C.problem.strategy_offsets
        for c in self.choice_nodes.tolist():      # one strategy per choice component
            starts_.append(len(idx))
            cols = self.col[offs[c]:offs[c + 1]]
            idx += cols.tolist()
            val += [1.0] * len(cols)
        nr1 = len(starts_)
        for ys, xc in rows:
            starts_.append(len(idx))
            idx += list(map(int, ys)) + [int(xc)]
            val += [1.0] * len(ys) + [-1.0]
        nr = len(starts_)
        lo = np.concatenate([np.ones(nr1), np.zeros(nr - nr1)])
        h.addRows(nr, lo, lo.copy(), len(idx), np.array(starts_, dtype=np.int32), np.array(idx, dtype=np.int32),
                  np.array(val))
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 0.99)     # integer costs: a gap below 1 proves the optimum
        h.setOptionValue("threads", 1)
        return h

    def memory_row(self, t: int):
        """(columns, values, rhs) of the memory row at compressed time point t."""
        g = self.g
        live = (g.lo[self.r_node] <= t) & (g.hi[self.r_node] > t) & (self.r_val > 0)
        vals = np.bincount(self.r_col[live], weights=self.r_val[live], minlength=self.nx)
        cols = np.nonzero(vals)[0]
        return cols, vals[cols], float(self.rhs[t])

    def add_rows(self, ts) -> int:
        """Add the memory rows of time points ``ts`` not added yet (identical rows once: the least rhs)."""
        have = set(self.rows_t)
        seen: dict = {}
        for t in ts:
            t = int(t)
            if t in have:
                continue
            cols, vals, rhs = self.memory_row(t)
            if not len(cols):
                continue
            key = (cols.tobytes(), vals.tobytes())
            if key not in seen or rhs < seen[key][2]:
                seen[key] = (cols, vals, rhs, t)
        for cols, vals, rhs, t in seen.values():
            self.h.addRow(-highspy.kHighsInf, rhs, len(cols), cols.astype(np.int32), vals)
            self.rows_t.append(t)
        return len(seen)

    # ---- plans -------------------------------------------------------------------------------
    def comp_plan(self, plan):
        """The component plan of an original plan (None: it breaks a tie or uses a pruned strategy)."""
        s2 = self.pr.from_orig(np.asarray(plan, dtype=np.int64))
        return None if s2 is None else self.C.contract(s2)

    def orig_plan(self, sc) -> np.ndarray:
        return self.pr.to_orig(self.C.expand(np.asarray(sc, dtype=np.int64)))

    def vector(self, sc) -> np.ndarray:
        """The MILP column vector of a component plan."""
        offs = self.C.problem.strategy_offsets
        x = np.zeros(self.nx + self.ny)
        x[self.col[offs[self.choice_nodes] + sc[self.choice_nodes]]] = 1.0
        k = self.C.problem.num_strategies
        for u, v, base in self.pairs:
            x[base + sc[u] * int(k[v]) + sc[v]] = 1.0
        return x

    def decode(self, x) -> np.ndarray:
        """Component plan of a MILP solution (the largest x per component)."""
        cp = self.C.problem
        sc = np.zeros(cp.num_nodes, dtype=np.int64)
        offs = cp.strategy_offsets
        for c in self.choice_nodes.tolist():
            sc[c] = int(np.argmax(x[self.col[offs[c]:offs[c + 1]]]))
        return sc

    def violated(self, sc) -> np.ndarray:
        """Compressed time points where the component plan's profile is over the limit, worst first."""
        live = self.g.profile(self.C.expand(np.asarray(sc, dtype=np.int64)))
        over = np.nonzero(live > self.g.cap)[0]
        return over[np.argsort(-(live[over] - self.g.cap))]

    def near(self, sc, frac: float) -> np.ndarray:
        live = self.g.profile(self.C.expand(np.asarray(sc, dtype=np.int64)))
        return np.nonzero(live >= (1.0 - frac) * self.g.cap)[0]

    def solve(self, time_limit_s: float, start_sc=None):
        """One HiGHS run: (component plan or None, objective incl. constant, dual bound incl. constant, status)."""
        h = self.h
        h.setOptionValue("time_limit", float(time_limit_s))
        if start_sc is not None:
            sol = highspy.HighsSolution()
            sol.col_value = list(self.vector(start_sc))
            sol.value_valid = True
            h.setSolution(sol)
        h.run()
        info = h.getInfo()
        status = h.modelStatusToString(h.getModelStatus())
        bound = float(info.mip_dual_bound) + self.const
        if info.primal_solution_status == 0:
            return None, float("inf"), bound, status
        x = np.asarray(h.getSolution().col_value)
        return self.decode(x), float(info.objective_function_value) + self.const, bound, status


def save_atomic(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("instance", help="letter of a shared instance (A, M, S) or a path")
    ap.add_argument("--start", help="JSON file whose last line (or 'plan' key) is a plan to start from")
    ap.add_argument("--start-search-s", type=float, default=60.0, help="no start: solve_large this long")
    ap.add_argument("--round-s", type=float, default=300.0, help="HiGHS time limit per round")
    ap.add_argument("--total-s", type=float, default=3000.0)
    ap.add_argument("--near", type=float, default=0.01, help="first rows: profile within this share of the limit")
    ap.add_argument("--add", type=int, default=400, help="at most this many violated rows added per round")
    ap.add_argument("--tag", default="s19b_long")
    a = ap.parse_args(argv)
    path = a.instance if os.path.exists(a.instance) else os.path.join(SHARED, f"asplos-2025-iopddl-{a.instance}.json.gz")
    name = os.path.basename(path).split(".")[0].rsplit("-", 1)[-1]
    os.makedirs(RUNS, exist_ok=True)
    ck = os.path.join(RUNS, f"{a.tag}_{name}.json")
    t0 = time.perf_counter()
    say = (lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] {m}", flush=True))
    problem = Problem.from_iopddl(path)
    m = TiedMilp(problem)
    say(f"tied MILP: {m.nx} x columns, {m.ny} y columns, {len(m.var_nodes)} nodes with varying usage, "
        f"{len(m.g.times)} time points, const {m.const:.0f}")
    state = json.load(open(ck)) if os.path.exists(ck) else {}
    plans = []
    if state.get("plan"):
        plans.append(state["plan"])
    if a.start:
        txt = open(a.start).read().strip()
        try:
            obj = json.loads(txt)
        except json.JSONDecodeError:
            obj = json.loads(txt.splitlines()[-1])
        plans.append(obj["plan"] if isinstance(obj, dict) else obj)
    if not plans:
        plans.append(solve_large(problem, a.start_search_s))
    best, best_cost, best_sc = None, float("inf"), None
    for p in plans:
        c = evaluate(problem, p)
        sc = m.comp_plan(p)
        if c.feasible and c.total < best_cost and sc is not None:
            best, best_cost, best_sc = [int(x) for x in p], float(c.total), sc
    assert best is not None, "no feasible start plan that follows the ties"
    start = state.get("start_plan") or best
    # the MILP objective of the start must equal its cost (the constant and the folding are right)
    x0 = m.vector(best_sc)
    say(f"start {best_cost:.0f}; MILP objective of it {float(x0 @ m.cost) + m.const:.0f}")
    bound = float(state.get("bound", -np.inf))
    m.add_rows(state.get("rows_t", []))
    say(f"rows from the checkpoint: {len(m.rows_t)}; near rows added: {m.add_rows(m.near(best_sc, a.near))}")
    history = state.get("history", [])
    rnd, proven = 0, False
    while time.perf_counter() - t0 < a.total_s:
        rnd += 1
        limit = min(a.round_s, max(10.0, a.total_s - (time.perf_counter() - t0)))
        sc, obj, b, status = m.solve(limit, best_sc)
        bound = max(bound, b)
        row = {"round": rnd, "status": status, "obj": obj, "dual_bound": b, "rows": len(m.rows_t),
               "wall_s": round(time.perf_counter() - t0, 1), "load": open("/proc/loadavg").read().split()[:3]}
        if sc is not None:
            over = m.violated(sc)
            row["violated_points"] = len(over)
            if len(over):
                row["rows_added"] = m.add_rows(over[:a.add])
            else:
                p = m.orig_plan(sc)
                c = evaluate(problem, p)
                if c.feasible and c.total < best_cost:
                    best, best_cost, best_sc = [int(x) for x in p], float(c.total), sc
                    row["new_best"] = best_cost
        history.append(row)
        say(json.dumps(row))
        save_atomic(ck, {"instance": name, "plan": best, "cost": best_cost, "bound": bound, "rows_t": m.rows_t,
                         "history": history, "start_plan": start, "git_rev": git_rev()})
        if sc is not None and not row.get("violated_points") and status == "Optimal":
            say(f"proven optimal under every row: {obj:.0f}")
            proven = True
            break
        if sc is not None and row.get("violated_points"):
            continue
        if status != "Optimal":
            a.round_s *= 1.5
    ev = contest_evaluate(path, best)
    say(f"best {best_cost:.0f} bound {bound:.0f}; contest evaluator: {ev}")
    report(a, path, name, problem, best, best_cost, bound, start, history, proven, argv)
    return 0


def report(a, path, name, problem, best, best_cost, bound, start, history, proven, argv) -> None:
    """results/<tag>_best_<X>.json: the plan, both evaluators on it and on the start plan (the
    cross-check), the bound, the best-known cost, the command and the load."""
    with open(os.path.join(SHARED, "best_known.json")) as f:
        known = json.load(f)["best_known_cost"].get(name)
    checks = {}
    for key, plan in (("best", best), ("start", start)):
        c = evaluate(problem, plan)
        checks[key] = {"contest_evaluator": contest_evaluate(path, plan),
                       "project_evaluate": {"total": c.total, "peak": c.peak_memory_bytes, "feasible": c.feasible}}
        assert checks[key]["contest_evaluator"]["cost"] == round(c.total), checks[key]
    out = {"instance": name, "file": path, "cost": best_cost, "best_known": known,
           "below_best_known": None if known is None else known - best_cost,
           "lower_bound": bound, "proven_optimal": proven,
           "bound_premise": "forbidden-free plans (cost < FORBIDDEN_COST), as solvers.local.Pruning / Contraction assume",
           "checks": checks, "plan": best, "start_plan": start, "history": history,
           "command": "PYTHONPATH=. python experiments/iopddl_long.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "config": vars(a), "git_rev": git_rev(), "loadavg": open("/proc/loadavg").read().split()[:3],
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    dest = os.path.join(os.path.dirname(RUNS), "results", f"{a.tag.replace('_long', '')}_best_{name}.json")
    save_atomic(dest, out)
    print(f"wrote {dest}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
