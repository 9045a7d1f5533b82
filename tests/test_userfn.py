"""The user's own model from the CLI: ``shardgym plan --fn FILE.py:make_step`` then ``shardgym
run``, with dropout driven by PRNG keys (an argument and one made inside the step); the sharded
step matches the unsharded one, and the report's figures come from XLA. The plan is made for the
step traced with a recompute policy (``--recompute dots``: the dropout masks' random bits are
recomputed in the backward pass), which the plan records and ``run`` replays."""
from __future__ import annotations

import json
import os

from shardgym import cli

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "dropout_model.py")


def test_dropout_model_plans_and_runs_from_the_cli(tmp_path, capfd):
    out = str(tmp_path / "megatron.json")
    assert cli.main(["plan", "--fn", f"{MODEL}:make_step", "--method", "megatron", "--recompute", "dots",
                     "--out", out, "--no-plots"]) == 0
    plan = json.load(open(out))
    assert plan["meta"]["fn"] == f"{MODEL}:make_step" and plan["meta"]["recompute"] == "dots"
    key_spec = [s for i, p, s in plan["input_specs"] if p == "[3]"]
    assert key_spec == [None]                   # the key argument: replicated
    assert any(s and any(s) for _, _, s in plan["input_specs"])   # something is sharded
    capfd.readouterr()
    assert cli.main(["run", out, "--rtol", "1e-5"]) == 0
    text = capfd.readouterr().out
    assert "(recompute dots)" in text           # rebuilt and executed as the recomputing program
    rel = float(next(ln for ln in text.splitlines() if "max rel err" in ln).split()[-1])
    assert rel < 1e-5, text
    assert "all-gather" in text                 # XLA's collectives, read from the compiled HLO
    plan["meta"]["recompute"] = None            # the same strategies do not fit the plain program
    json.dump(plan, open(out, "w"))
    assert cli.main(["run", out]) == 2
    assert "was it made for another model?" in capfd.readouterr().err


def test_recompute_auto_records_the_policy_it_chose(tmp_path, capfd):
    """`plan --recompute auto`: the min-memory ILP under each policy within 1.05 x Megatron's step time
    (shardgym.recompute.choose), each policy's figures on stderr, the chosen one in the plan."""
    out = str(tmp_path / "auto.json")
    assert cli.main(["plan", "--fn", f"{MODEL}:make_step", "--method", "ilp", "--objective", "memory",
                     "--recompute", "auto", "--time-limit", "1", "--out", out, "--no-plots"]) == 0
    err = capfd.readouterr().err
    for policy in ("None", "dots", "dots_no_batch"):
        assert f"recompute {policy}: " in err, err
    chosen = err.split("chosen: recompute ")[1].split()[0]
    assert json.load(open(out))["meta"].get("recompute") == (None if chosen == "None" else chosen)


def test_bad_recompute_flags_get_one_line(capfd):
    assert cli.main(["plan", "--fn", f"{MODEL}:make_step", "--recompute", "everything"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--recompute 'everything'" in err[0] and "dots_no_batch" in err[0], err
    assert cli.main(["plan", "--fn", f"{MODEL}:make_step", "--recompute", "auto"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--objective memory" in err[0], err
    assert cli.main(["compare", "--fn", f"{MODEL}:make_step", "--recompute", "auto"]) == 2
    assert "name one for compare" in capfd.readouterr().err
