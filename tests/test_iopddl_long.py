"""experiments/iopddl_long.py's contest evaluator and solvers/tied_milp.py's exact tied MILP on
small contest-format instances, against costmodel.problem.evaluate and brute force."""
import itertools
import json

import numpy as np

from costmodel.problem import Problem, evaluate
from experiments.iopddl_long import contest_evaluate
from solvers.tied_milp import TiedGraph

EXAMPLE = {"problem": {"name": "example",
                       "nodes": {"intervals": [[30, 70], [40, 70], [50, 120], [110, 140], [110, 150]],
                                 "costs": [[15], [55, 65], [25, 45, 35], [85, 75], [95]],
                                 "usages": [[10], [25, 25], [15, 20, 15], [10, 10], [15]]},
                       "edges": {"nodes": [[0, 1], [0, 2], [1, 3], [2, 4], [3, 4]],
                                 "costs": [[30, 40], [50, 10, 40], [90, 10, 20, 80], [60, 20, 30], [70, 60]]},
                       "usage_limit": 50}}


def random_instance(rng, n=7, limit_share=0.8):
    k = rng.integers(1, 4, n)
    st = rng.integers(0, 20, n)
    iv = [[int(s), int(s + rng.integers(0, 15))] for s in st]
    us = [rng.integers(1, 30, kk).tolist() for kk in k]
    edges = [[i, j] for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
    p = {"name": "r", "nodes": {"intervals": iv, "costs": [rng.integers(0, 100, kk).tolist() for kk in k], "usages": us},
         "edges": {"nodes": edges, "costs": [rng.integers(0, 100, int(k[u] * k[v])).tolist() for u, v in edges]}}
    p["usage_limit"] = int(limit_share * sum(max(u) for u in us))
    return {"problem": p}, k


def brute(path, k, capped=True):
    best = None
    for plan in itertools.product(*[range(int(x)) for x in k]):
        ev = contest_evaluate(path, plan)
        if (ev["feasible"] or not capped) and (best is None or ev["cost"] < best):
            best = ev["cost"]
    return best


def test_example_costs(tmp_path):
    path = str(tmp_path / "example.json")
    json.dump(EXAMPLE, open(path, "w"))
    assert contest_evaluate(path, [0, 0, 2, 0, 0])["cost"] == 545
    assert contest_evaluate(path, [0, 0, 2, 1, 0])["cost"] == 445
    assert not contest_evaluate(path, [0, 0, 1, 0, 0])["feasible"]   # 10+25+20 = 55 > 50 at t in [50, 70)


def test_evaluators_agree_and_exact_tied_milp_is_optimal(tmp_path):
    rng = np.random.default_rng(3)
    binding = 0
    for trial in range(8):
        inst, k = random_instance(rng, limit_share=0.8 if trial % 2 else 0.4)
        path = str(tmp_path / f"r{trial}.json")
        json.dump(inst, open(path, "w"))
        problem = Problem.from_iopddl(path)
        for _ in range(5):
            plan = [int(rng.integers(0, kk)) for kk in k]
            ev, c = contest_evaluate(path, plan), evaluate(problem, plan)
            assert ev["cost"] == round(c.total) and ev["feasible"] == c.feasible and ev["peak"] == round(c.peak_memory_bytes)
        opt = brute(path, k)
        least = [int(np.argmin(u)) for u in inst["problem"]["nodes"]["usages"]]
        if opt is None or not evaluate(problem, least).feasible:
            continue
        T = TiedGraph(problem)
        sc = T.comp_plan(least)
        if sc is None:
            continue
        sub = T.model(T.choice_nodes, sc)
        for _ in range(20):
            got, obj, bound, status = sub.solve(10.0)
            over = T.violated(got)
            if not len(over) or not sub.add_rows(over):
                break
        assert status == "Optimal" and not len(over)
        assert round(T.total(got)) == opt and abs(bound - opt) < 1
        binding += brute(path, k, capped=False) < opt
    assert binding >= 1      # the memory rows mattered somewhere
