"""solvers/tied_milp.py's phase of the capped core: on small copy-free contest-format instances with a
binding usage limit its plan is the brute-force optimum, proven, and its bound is at most that optimum;
``solve_capped`` returns that proof."""
import json

import numpy as np
from test_iopddl_long import brute, random_instance

from costmodel.problem import Problem, evaluate
from solvers.capped import CappedConfig, solve_capped
from solvers.tied_milp import tied_phase


def test_tied_phase_is_the_brute_force_optimum_and_bounds_it(tmp_path):
    rng = np.random.default_rng(10)
    binding = checked = 0
    for trial in range(10):
        inst, k = random_instance(rng, n=8, limit_share=0.5 if trial % 2 else 0.35)
        path = str(tmp_path / f"r{trial}.json")
        json.dump(inst, open(path, "w"))
        problem = Problem.from_iopddl(path)
        opt = brute(path, k)
        least = [int(np.argmin(u)) for u in inst["problem"]["nodes"]["usages"]]
        if opt is None or not evaluate(problem, least).feasible:
            continue
        best = [least, float(evaluate(problem, least).total)]

        def consider(plan, tag):
            c = evaluate(problem, plan)
            assert c.feasible, tag                  # the phase offers only plans that fit
            if c.total < best[1]:
                best[:] = [list(plan), float(c.total)]

        r = tied_phase(problem, 30.0, best, consider, lambda m: None)   # returns at the proof
        assert r.proven and round(best[1]) == opt
        assert opt - 1 < r.bound <= opt
        free = brute(path, k, capped=False)
        if free < opt:          # the limit binds (twice: the same optimum through the capped core's call site,
            binding += 1        # which runs the phase on graphs too big for the whole MILP: milp_nodes=0 here)
            if binding <= 2:
                res = solve_capped(problem, 40.0, config=CappedConfig(milp_nodes=0))   # returns at the proof
                assert res.status == "optimal" and round(res.cost) == opt and res.bound <= opt
        checked += 1
    assert checked >= 6 and binding >= 4
