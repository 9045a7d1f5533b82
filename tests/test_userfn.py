"""The user's own model from the CLI: ``shardgym plan --fn FILE.py:make_step`` then ``shardgym
run``, with dropout driven by PRNG keys (an argument and one made inside the step); the sharded
step matches the unsharded one, and the report's figures come from XLA."""
from __future__ import annotations

import json
import os

from shardgym import cli

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "dropout_model.py")


def test_dropout_model_plans_and_runs_from_the_cli(tmp_path, capsys):
    for method in ("megatron",):
        out = str(tmp_path / f"{method}.json")
        assert cli.main(["plan", "--fn", f"{MODEL}:make_step", "--method", method, "--out", out, "--no-plots"]) == 0
        plan = json.load(open(out))
        assert plan["meta"]["fn"] == f"{MODEL}:make_step"
        key_spec = [s for i, p, s in plan["input_specs"] if p == "[3]"]
        assert key_spec == [None]                   # the key argument: replicated
        assert any(s and any(s) for _, _, s in plan["input_specs"])   # something is sharded
        capsys.readouterr()
        assert cli.main(["run", out, "--rtol", "1e-5"]) == 0
        text = capsys.readouterr().out
        rel = float(next(ln for ln in text.splitlines() if "max rel err" in ln).split()[-1])
        assert rel < 1e-5, text
        assert "all-gather" in text                 # XLA's collectives, read from the compiled HLO
