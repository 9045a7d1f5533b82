"""Output for people: 80-column tables with the solver status and gap, natural order of parameter
paths, a sharding map of every parameter, phases on the memory timeline, XLA's fd-2 log captured
and summarised in one line."""
from __future__ import annotations

import os

from costmodel.problem import Cost, Plan
from runtime import xla_log
from shardgym import plots, workflow


def _cost(**kw):
    base = dict(total=0.0136, feasible=True, step_time_s=0.0136, peak_memory_bytes=123.4 * 2**20,
                redundant_memory_bytes=1.5 * 2**30, comm_bytes=57.5 * 2**20, imbalance_s=2.1e-5,
                node_cost=0.01, edge_cost=0.0036)
    return Cost(**{**base, **kw})


def _plan(method, status, gap=None, n_params=3):
    specs = [(i, f"[0]['params']['block_{i}']['kernel']", ("x", None) if i % 2 else None) for i in range(n_params)]
    return Plan(strategies=[0] * n_params, method=method, objective="time", info={"status": status, "gap": gap},
                mesh_shape=(2, 4), axis_names=("x", "y"), input_specs=specs, solve_time_s=12.34)


def _render(renderable, width=80) -> list[str]:
    from rich.console import Console
    c = Console(width=width, record=True, file=open(os.devnull, "w"))
    c.print(renderable)
    return c.export_text().splitlines()


def test_cost_table_fits_80_columns_with_status_and_gap():
    rows = [("ilp", "memory", _plan("ilp", "time_limit", 0.19), _cost()),
            ("ilp", "time", _plan("ilp", "optimal", 0.0), _cost()),
            ("replicated", "time", _plan("replicated", "rule"), _cost(feasible=False)),
            ("policy", "time", _plan("policy", "heuristic"), _cost()),
            ("fsdp", "time", None, None)]
    lines = _render(workflow.cost_table(rows, title="gpt 125m on h100-2x8"))
    assert max(len(ln) for ln in lines) <= 80
    text = "\n".join(lines)
    header = next(ln for ln in lines if "method" in ln)
    for col in ("method", "step", "peak", "redund", "comm", "imbal", "fits", "status", "solve"):
        assert col in header.split(), header
    assert "limit 19%" in text and "optimal" in text and "failed" in text
    row = next(ln for ln in lines if ln.lstrip().startswith("replicated"))
    assert " NO " in row and "rule" in row
    assert "ilp:memory" in text and "13.6ms" in text and "123M" in text


def test_parameter_paths_sort_naturally_and_the_map_shows_all():
    plan = _plan("dp", "rule", n_params=60)
    names = [n for n, _ in workflow.param_rows(plan)]
    assert names.index("block_2/kernel") < names.index("block_10/kernel") < names.index("block_59/kernel")
    table = _render(workflow.module_sharding_table(plan))
    assert sum("block_" in ln for ln in table) == 60 and max(len(ln) for ln in table) <= 80
    import tempfile

    import matplotlib.image as mpimg
    with tempfile.TemporaryDirectory() as d:
        small = plots.sharding_map([_plan("dp", "rule", n_params=10)], os.path.join(d, "s.png"))
        big = plots.sharding_map([plan, plan], os.path.join(d, "b.png"))
        h_small, h_big = mpimg.imread(small).shape[0], mpimg.imread(big).shape[0]
    assert h_big > 4 * h_small    # 60 rows drawn, not 48: 0.26 in a row at 130 dpi


def test_memory_timeline_marks_forward_backward_update(tmp_path):
    import shardgym as sg
    _, _, _, problem = workflow.model_problem("mlp", "tiny", sg.Cluster.preset("cpu-2x4"))
    (f0, f1), (b0, b1), (u0, u1) = plots.phases(problem)
    roles = problem.meta.roles
    start = problem.intervals[:, 0]
    assert f0 < f1 == b0 < b1 == u0 < u1
    assert all(b0 <= start[i] < b1 for i, r in enumerate(roles) if r == "gradient")
    plan = sg.solve(problem, method="dp")
    assert os.path.exists(plots.memory_timeline(problem, [plan], str(tmp_path / "m.png")))


def test_fd2_capture_summarises_cxx_warnings():
    lines = ["W0000 00:00:1.0 123 spmd_partitioner.cc:652] Involuntary full rematerialization. The compiler was "
             "not able to go from sharding {devices=[2,4]} to {replicated} without doing a full rematerialization "
             "of the tensor for HLO operation: %dot = f32[64,256]{1,0} dot(...)",
             "W0000 00:00:1.0 123 spmd_partitioner.cc:652] Involuntary full rematerialization ... "
             "%fusion = f32[8,32,512]{2,1,0} fusion(...)"]
    with xla_log.capture_fd2() as cap:
        for ln in lines:
            os.write(2, (ln + "\n").encode())     # as C++ writes: straight to the file descriptor
    assert cap.lines == lines
    s = xla_log.summarize(cap.lines)
    assert "\n" not in s and "2 involuntary full rematerialization" in s and "f32[8,32,512]" in s and "0.50 MiB" in s
    assert xla_log.summarize([]) == ""
