"""A Lagrangian lower bound for a contest-format instance whose graph is nearly a forest (the long
thin shapes of experiments/iopddl_contest_like.py), so that a 60 s plan's gap is known.

``python experiments/iopddl_forest_bound.py FILE UPPER [SECONDS]``

The problem is pruned and its permutation ties contracted (``solvers.local.prepare``: exact for plans
free of forbidden entries that fit). On the component graph a BFS spanning forest is kept; every
other edge is replaced by the minimum of its matrix (a relaxation). The memory rows are priced
(λ_t ≥ 0 per compressed time point): L(λ) = min over plans of [node costs + usage·Σλ over the
interval + forest edges] (exact tree DP) + Σ dropped-edge minima − cap·Σλ ≤ the capped optimum for
every λ. λ follows Polyak subgradient steps towards UPPER (the best cost known), the step factor
shrinking ×0.9 when L does not improve. Prints the best L and the gap to UPPER.

Measured (session 9, load 6 on the 2 shared cores): contest-41k-thin-k41 4.3007e9 after 60 s (623
dropped edges, their minima 2.47e6; the best 60 s plan, 4.3824e9, is within 1.86 %); at λ = 0 the
DP's plan peaks at 4.56x the limit. On graphs with more cycles the dropped edges weaken it:
contest-45k-k129 (51,710 edges on 42,771 components) 8.237e11 against toulbar2's 8.7871e11.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from costmodel.problem import Problem  # noqa: E402
from solvers.local import prepare  # noqa: E402
from solvers.local.moves import dfs_forest  # noqa: E402


def spanning_forest(gc):
    """(DFS order, parent, parent edge, in-forest mask per edge) of a spanning forest of ``gc``."""
    order, par, pedge = dfs_forest(gc, [True] * gc.n)
    tree = np.zeros(len(gc.eu), dtype=bool)
    tree[[e for e in pedge if e >= 0]] = True
    return order, par, pedge, tree


def forest_bound(problem: Problem, upper: float, time_limit_s: float, progress=print) -> float:
    t0 = time.perf_counter()
    pr, g, C, gc = prepare(problem)
    order, par, pedge, tree = spanning_forest(gc)
    dropped = float(sum(gc.matrix(e).min() for e in np.nonzero(~tree)[0]))
    progress(f"{gc.n} components, {len(gc.eu)} edges, {int((~tree).sum())} dropped (their minima {dropped:.6g})")
    mats = {i: (gc.matrix(pedge[i]) if gc.eu[pedge[i]] == i else gc.matrix(pedge[i]).T)
            for i in order if par[i] >= 0}

    def tree_dp(node_cost):
        U = [node_cost[gc.offs[i]:gc.offs[i + 1]].copy() for i in range(gc.n)]
        arg = {}
        for i in reversed(order):
            if par[i] >= 0:
                tot = U[i][:, None] + mats[i]
                arg[i] = tot.argmin(axis=0)
                U[par[i]] = U[par[i]] + tot.min(axis=0)
        val, s = 0.0, np.zeros(gc.n, dtype=np.int64)
        for i in order:
            if par[i] < 0:
                s[i] = int(np.argmin(U[i]))
                val += float(U[i][s[i]])
            else:
                s[i] = int(arg[i][s[par[i]]])
        return val, s

    lam = np.zeros(len(g.times))
    best, theta, it = -np.inf, 1.0, 0
    while time.perf_counter() - t0 < time_limit_s:
        val, s = tree_dp(C.penalty(g.interval_sums(lam)) if lam.any() else gc.cost)
        L = val + dropped - (g.cap * lam.sum() if g.cap is not None else 0.0)
        if L > best:
            best = L
        else:
            theta *= 0.9
        it += 1
        if g.cap is None:
            break
        sub = g.profile(C.expand(s)) - g.cap
        if it % 20 == 1:
            progress(f"round {it}: L={L:.6g} best={best:.6g} plan peak/cap={1 + sub.max() / g.cap:.3f} "
                     f"({time.perf_counter() - t0:.0f}s)")
        norm = float((sub ** 2).sum())
        if norm == 0:
            break
        lam = np.maximum(0.0, lam + theta * max(upper - L, 0.0) / norm * sub)
    return best


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    path, upper = argv[0], float(argv[1])
    b = forest_bound(Problem.from_iopddl(path), upper, float(argv[2]) if len(argv) > 2 else 60.0)
    print(f"bound {b:.10g}; upper {upper:.10g}; gap {(upper - b) / upper:.4%}")


if __name__ == "__main__":
    main()
