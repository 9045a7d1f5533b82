"""Capped solving on a traced problem whose resharded copies are edge memory
(``Problem.edge_memory``): the capped core and the policy planner price node memory only, so
``shardgym.solve`` fits the copies by lowering their cap (``solvers.dispatch.fit_copies``). Before that,
gpt tiny on cpu-2x4 under a binding cap got "no feasible plan" from method='ilp' and "no plan
fits" from the raw policy decode, though plans fitting the cap exist."""
import pytest

import shardgym as sg
import zoo


@pytest.fixture(scope="module")
def gpt_capped():
    fn, args = zoo.build("gpt", "tiny", abstract=True)
    p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset("cpu-2x4")).with_usage_limit(None)
    assert p.edge_memory is not None
    fast = sg.solve(p, method="ilp", time_limit_s=20)
    cap = 0.84 * sg.evaluate(p, fast).peak_memory_bytes
    assert not sg.evaluate(p.with_usage_limit(cap), fast).feasible   # the cap binds
    return p, cap


@pytest.mark.parametrize("kw", [dict(method="ilp", time_limit_s=20), dict(method="policy", search=False)],
                         ids=["ilp", "policy-raw"])
def test_binding_cap_with_copies_gives_a_plan_that_fits(gpt_capped, kw):
    p, cap = gpt_capped
    plan = sg.solve(p, memory_cap_bytes=cap, **kw)
    cost = sg.evaluate(p.with_usage_limit(cap), plan)
    assert cost.feasible, (cost.peak_memory_bytes, cap)
    assert plan.info.get("gap") is None or kw["method"] != "ilp"   # no proof for the copies
