"""Every bad input the CLI may meet ends with one ``shardgym: error:`` line, exit 2, no traceback,
and no partial file. Most cases call ``shardgym.cli.main(argv)`` in-process (JAX imported once); a
representative handful run ``python -m shardgym.cli`` as a subprocess to hold the real process to
the contract (exit status, stderr, stdout's last line for ``iopddl``)."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

import shardgym as sg
from costmodel.cluster import Cluster
from shardgym import cli, workflow

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "shared", "iopddl", "example.json")


def _assert_one_error(rc, err, what):
    lines = [ln for ln in err.splitlines() if ln.startswith("shardgym: error:")]
    assert rc == 2, f"{what}: exit {rc}, stderr:\n{err}"
    assert len(lines) == 1, f"{what}: want one error line, got:\n{err}"
    assert "Traceback" not in err, f"{what}: traceback:\n{err}"
    return lines[0]


def _run(capsys, argv):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _no_tmp(path):
    return [f for f in os.listdir(path) if f.endswith(".tmp")]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """A dp plan of mlp tiny on cpu-2x4, made once through the CLI."""
    d = tmp_path_factory.mktemp("plans")
    path = str(d / "mlp.json")
    assert cli.main(["plan", "--model", "mlp", "--size", "tiny", "--method", "dp", "--out", path, "--no-plots"]) == 0
    with open(path) as f:
        return d, json.load(f)


def _iopddl_cases(tmp_path):
    with open(EXAMPLE) as f:
        base = json.load(f)
    edits = {
        "negative usage": lambda p: p["nodes"]["usages"][0].__setitem__(0, -5),
        "NaN cost": lambda p: p["nodes"]["costs"][1].__setitem__(0, float("nan")),
        "infinite edge cost": lambda p: p["edges"]["costs"][0].__setitem__(0, float("inf")),
        "reversed interval": lambda p: p["nodes"]["intervals"].__setitem__(2, [30, 10]),
        "usages longer than costs": lambda p: p["nodes"]["usages"][1].append(3),
        "fewer usages than nodes": lambda p: p["nodes"]["usages"].pop(),
        "usage_limit 0": lambda p: p.__setitem__("usage_limit", 0),
        "negative usage_limit": lambda p: p.__setitem__("usage_limit", -1),
        "edge to a missing node": lambda p: p["edges"]["nodes"].__setitem__(0, [0, 99]),
        "edge cost matrix too short": lambda p: p["edges"]["costs"][0].pop(),
        "missing nodes": lambda p: p.pop("nodes"),
    }
    out = {}
    for name, edit in edits.items():
        doc = copy.deepcopy(base)
        edit(doc["problem"])
        path = tmp_path / (name.replace(" ", "_") + ".json")
        path.write_text(json.dumps(doc))
        out[name] = str(path)
    bad = tmp_path / "garbage.json"
    bad.write_text("{not json")
    out["not JSON"] = str(bad)
    return out


def test_iopddl_bad_instances(tmp_path, capsys):
    for name, path in _iopddl_cases(tmp_path).items():
        rc, out, err = _run(capsys, ["iopddl", path, "1"])
        line = _assert_one_error(rc, err, name)
        assert path in line, (name, line)
        assert out.strip().splitlines()[-1] == "[]", (name, out)   # the contest's last line, still
    for argv, want in ((["iopddl", EXAMPLE, "0"], "TIMEOUT_S"), (["iopddl", EXAMPLE, "abc"], "TIMEOUT_S"),
                       (["iopddl", str(tmp_path / "missing.json"), "1"], "missing.json")):
        rc, out, err = _run(capsys, argv)
        assert want in _assert_one_error(rc, err, argv)


def test_iopddl_zero_limit_names_the_limit(tmp_path, capsys):
    rc, out, err = _run(capsys, ["iopddl", _iopddl_cases(tmp_path)["usage_limit 0"], "1"])
    assert "usage_limit 0 fits no plan" in _assert_one_error(rc, err, "limit 0")


@pytest.mark.parametrize("argv,want", [
    (["plan", "--model", "nope"], "nope"),
    (["plan", "--model", "gpt", "--size", "huge"], "huge"),
    (["plan", "--cluster", "nope"], "nope"),
    (["plan", "--cluster-file", "/nonexistent/c.toml"], "/nonexistent/c.toml"),
    (["plan", "--method", "foo"], "--method"),
    (["plan", "--memory-cap", "12XB"], "--memory-cap"),
    (["plan", "--memory-cap", "0"], "--memory-cap"),
    (["plan", "--time-limit", "-1"], "--time-limit"),
    (["plan", "--max-step-time", "nan"], "--max-step-time"),
    (["plan", "--method", "dp", "--objective", "memory"], "--objective memory"),
    (["plan", "--method", "policy", "--objective", "redundancy"], "--objective redundancy"),
    (["plan", "--fn", "no_colon"], "--fn"),
    (["plan", "--fn", "/nonexistent/model.py:make_step"], "/nonexistent/model.py"),
    (["plan", "--fn", "json:no_such_function"], "no_such_function"),
    (["plan", "--fn", "no_such_module_xyz:make"], "no_such_module_xyz"),
    (["compare", "--methods", "dp,foo"], "foo"),
    (["compare", "--methods", "dp:memory"], "dp:memory"),
    (["compare", "--methods", "ilp:speed"], "ilp:speed"),
    (["compare", "--methods", "dp,dp"], "twice"),
    (["run", "/nonexistent/plan.json"], "/nonexistent/plan.json"),
    (["run", "x.json", "--rtol", "-1"], "--rtol"),
    (["nosuchcommand"], "nosuchcommand"),
    (["list", "extra"], "extra"),
    (["train", "--minutes", "0"], "--minutes"),
    (["train", "--no-such-flag"], "--no-such-flag"),
    (["train", "--resume", "/nonexistent/run"], "/nonexistent/run"),
    (["train", "--no-workloads", "--random-problems", "0"], "--random-problems"),
])
def test_flags_and_names(argv, want, capsys):
    rc, _, err = _run(capsys, argv)
    assert want in _assert_one_error(rc, err, argv)


def test_plan_out_existing_dir_leaves_nothing(tmp_path, capsys):
    rc, _, err = _run(capsys, ["plan", "--model", "mlp", "--size", "tiny", "--out", str(tmp_path)])
    assert "is a directory" in _assert_one_error(rc, err, "--out dir")
    assert os.listdir(tmp_path) == []


def test_user_fn_errors(tmp_path, capsys):
    bad = tmp_path / "m.py"
    bad.write_text("def make_step():\n    return 42\n\ndef boom():\n    raise RuntimeError('kaput')\n")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_abc\n")
    for spec, want in ((f"{bad}:make_step", "(train_step, args)"), (f"{bad}:boom", "kaput"),
                       (f"{broken}:f", "no_such_module_abc")):
        rc, _, err = _run(capsys, ["plan", "--fn", spec, "--no-plots"])
        assert want in _assert_one_error(rc, err, spec)


def test_caps_and_bounds_a_method_cannot_meet(capsys):
    for m in ("dp", "megatron", "replicated"):
        rc, out, err = _run(capsys, ["plan", "--model", "mlp", "--size", "tiny", "--method", m, "--memory-cap", "1KiB"])
        assert "memory cap" in _assert_one_error(rc, err, m)
        assert "feasible" not in out
    rc, _, err = _run(capsys, ["plan", "--model", "mlp", "--size", "tiny", "--method", "fsdp", "--max-step-time", "1e-12"])
    assert "max_step_time_s" in _assert_one_error(rc, err, "step bound")
    rc, out, err = _run(capsys, ["compare", "--model", "mlp", "--size", "tiny", "--methods", "dp,megatron",
                                 "--memory-cap", "1KiB"])
    assert "no method" in _assert_one_error(rc, err, "compare over cap")


def _mutated(plan_file, name, edit):
    d, doc = plan_file
    doc = copy.deepcopy(doc)
    edit(doc)
    path = d / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_run_rejects_mismatched_plans(plan_file, capsys):
    def h100(doc):
        doc["meta"].pop("cluster_spec")
        doc["meta"]["cluster"] = "h100-2x8"
        doc["mesh_shape"] = [2, 8]
        doc["axis_names"] = ["node", "gpu"]

    cases = {
        "too few strategies": (lambda doc: doc["strategies"].pop(), "strategies"),
        "index out of range": (lambda doc: doc["strategies"].__setitem__(0, 999), "strategy 999"),
        "swapped cluster name": (lambda doc: doc["meta"].__setitem__("cluster", "tpu-4x4"), "tpu-4x4"),
        "unknown cluster, no spec": (lambda doc: (doc["meta"].pop("cluster_spec"),
                                                  doc["meta"].__setitem__("cluster", "mine")), "mine"),
        "16 devices on 8": (h100, "device_count=16"),
        "no model": (lambda doc: doc["meta"].pop("model"), "meta.model"),
        "unknown model": (lambda doc: doc["meta"].__setitem__("model", "resnet"), "resnet"),
        "edited spec": (lambda doc: doc["input_specs"][0].__setitem__(2, ["x", "y"]), "PartitionSpecs"),
        "not a plan": (lambda doc: doc.pop("format"), "not a shardgym plan"),
        "strategies not ints": (lambda doc: doc.__setitem__("strategies", "abc"), "malformed"),
    }
    for name, (edit, want) in cases.items():
        rc, _, err = _run(capsys, ["run", _mutated(plan_file, name.replace(" ", "_"), edit)])
        assert want in _assert_one_error(rc, err, name), name
    notjson = plan_file[0] / "garbage.json"
    notjson.write_text("{")
    rc, _, err = _run(capsys, ["run", str(notjson)])
    assert "not JSON" in _assert_one_error(rc, err, "garbage")


def test_train_refuses_to_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "policy.msgpack").write_bytes(b"precious")
    rc, _, err = _run(capsys, ["train", "--out", str(run), "--no-progress"])
    assert "--force" in _assert_one_error(rc, err, "overwrite")
    assert (run / "policy.msgpack").read_bytes() == b"precious"


def test_damaged_checkpoint_is_refused(tmp_path):
    import numpy as np

    from agent.checkpoints import load_checkpoint, save_checkpoint
    path = str(tmp_path / "ck.msgpack")
    save_checkpoint(path, {"w": np.arange(4096, dtype=np.float32)}, {"a": 1})
    data = bytearray(open(path, "rb").read())
    k = data.find(np.float32(2048.0).tobytes())   # a byte inside the weights
    assert k > 0
    data[k] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        load_checkpoint(path)


def _subprocess(argv, cwd=None):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "shardgym.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_subprocess_contract(tmp_path, plan_file):
    """The real process: exit 2, one error line, no traceback, no partial file, iopddl's last line."""
    nan = _iopddl_cases(tmp_path)["NaN cost"]
    p = _subprocess(["iopddl", nan, "1"])
    assert "node 1" in _assert_one_error(p.returncode, p.stderr, "iopddl NaN")
    assert p.stdout.strip().splitlines()[-1] == "[]"
    p = _subprocess(["plan", "--model", "nope", "--out", str(tmp_path / "x.json")])
    _assert_one_error(p.returncode, p.stderr, "unknown model")
    assert not (tmp_path / "x.json").exists() and not _no_tmp(tmp_path)
    d, doc = plan_file
    big = copy.deepcopy(doc)
    big["meta"].pop("cluster_spec")
    big["meta"]["cluster"], big["mesh_shape"], big["axis_names"] = "h100-2x8", [2, 8], ["node", "gpu"]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    p = _subprocess(["run", str(path)])
    line = _assert_one_error(p.returncode, p.stderr, "16 devices")
    assert "needs 16 devices" in line and "device_count=16" in line


def test_undivided_mesh_refused_at_planning_and_cluster_file_plans_run(tmp_path, capsys):
    """Megatron on a 3x2 mesh shards gpt tiny's (256, 64) embedding gradient over 6 devices, which
    XLA miscomputes (inf): refused at planning, naming the argument, dim and axes. A plan made with
    --cluster-file carries its cluster and runs (it used to be a TypeError)."""
    c32 = tmp_path / "c32.json"
    c32.write_text(json.dumps({"name": "my-3x2", "mesh_shape": [3, 2], "axis_names": ["x", "y"],
                               "axis_bandwidth_Bps": [5e9, 10e9], "device_memory_bytes": "2GiB", "device_flops": 5e10}))
    out = tmp_path / "m.json"
    rc, _, err = _run(capsys, ["plan", "--model", "gpt", "--size", "tiny", "--method", "megatron",
                               "--cluster-file", str(c32), "--out", str(out)])
    line = _assert_one_error(rc, err, "3x2 megatron")
    assert "[0]['wte']['embedding'] dim 1 (size 64)" in line and "y+x (size 6)" in line
    assert not out.exists() and not _no_tmp(tmp_path)
    mine = tmp_path / "mine.toml"
    mine.write_text('name = "my-2x4"\nmesh_shape = [2, 4]\naxis_names = ["a", "b"]\naxis_bandwidth_Bps = [5e9, 1e10]\n'
                    'device_memory_bytes = "2GiB"\ndevice_flops = 5e10\n')
    plan = tmp_path / "p.json"
    assert cli.main(["plan", "--model", "mlp", "--size", "tiny", "--method", "dp", "--cluster-file", str(mine),
                     "--memory-cap", "1MiB", "--out", str(plan), "--no-plots"]) == 0
    meta = json.load(open(plan))["meta"]
    assert meta["cluster_spec"]["name"] == "my-2x4" and meta["memory_cap_bytes"] == 2**20
    capsys.readouterr()
    assert cli.main(["run", str(plan)]) == 0
    out = capsys.readouterr().out
    # the prediction is priced on the file's cluster under the plan's cap (not a preset, not device memory)
    assert "cost model: cluster" in out and "my-2x4" in out and "1.00 MiB" in out, out
    p = sg.Plan.from_json(str(plan))
    report = workflow.run_plan(p)   # no Problem given: the runtime rebuilds it from the plan file
    _, _, graph = workflow.traced(workflow.ModelSource("mlp", "tiny"), True)
    mine_problem = sg.build_problem(graph, Cluster.from_file(str(mine)))
    preset_problem = sg.build_problem(graph, Cluster.preset("cpu-2x4"))
    assert report.predicted_cluster == "my-2x4" and report.predicted_cap_bytes == 2**20
    assert report.predicted_step_time_s == pytest.approx(sg.evaluate(mine_problem, p).step_time_s)
    assert report.predicted_step_time_s != pytest.approx(sg.evaluate(preset_problem, p).step_time_s)
