"""Every command block of README.md runs as written, with small sizes where the README uses big
ones (SUBSTITUTIONS says which) — or is skipped here with the reason (SKIPPED_BLOCKS)."""
from __future__ import annotations

import os
import re
import shlex

import pytest

from shardgym import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
EXAMPLE = os.path.join(REPO, "..", "shared", "iopddl", "example.json")
MODEL = os.path.join(REPO, "tests", "data", "dropout_model.py")
TINY_TRAIN = ("--no-workloads --random-problems 1 --bc-epochs 1 --updates 1 --num-envs 2 --num-steps 4 "
              "--minibatches 1 --epochs 1 --hidden 8 --rounds 1 --random-fraction 1.0 --wandb false --no-progress")
# (README text, what the test runs instead, why)
SUBSTITUTIONS = [
    ("--size 1.3b --cluster h100-2x8", "--size tiny --cluster cpu-2x4", "1.3B on 16 devices: tiny on the 8 test devices"),
    ("my_model.py:make_step", f"{MODEL}:make_step", "the README's own-model file: the test's dropout model"),
    ("--minutes 20", f"--minutes 20 {TINY_TRAIN} --out runs/train-20260101-120000", "20 minutes: a tiny run"),
    ("FILE TIMEOUT_S", f"{EXAMPLE} 1", "placeholders: the shared example instance, 1 s"),
    ('"125m"', '"tiny"', "GPT-125M: tiny"),
    ("../shared/iopddl/", os.path.join(REPO, "..", "shared", "iopddl") + "/", "relative to the repository root"),
]
SKIPPED_BLOCKS = {"make demo": "make demo and make test are CI's own two steps (this test runs inside make test)"}


def _blocks():
    text = open(README).read()
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


def _substitute(text: str) -> str:
    for old, new, _ in SUBSTITUTIONS:
        text = text.replace(old, new)
    return text


def _commands(block: str) -> list[list[str]]:
    out = []
    for line in block.splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(_substitute(line)))
    return out


def test_every_block_is_run_or_skipped_with_a_reason():
    for lang, body in _blocks():
        if lang == "bash":
            first = body.strip().splitlines()[0]
            assert first.startswith("shardgym") or any(k in first for k in SKIPPED_BLOCKS), first


def test_cli_block(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    toml = next(body for lang, body in _blocks() if lang == "toml")
    (tmp_path / "my_cluster.toml").write_text(toml)           # the README's cluster file
    for lang, body in _blocks():
        if lang != "bash" or not body.strip().startswith("shardgym"):
            continue
        for argv in _commands(body):
            assert argv[0] == "shardgym"
            rc = cli.main(argv[1:])
            err = capsys.readouterr().err
            assert rc == 0, f"{shlex.join(argv)} exited {rc}:\n{err}"
    assert (tmp_path / "plan.json").exists() and (tmp_path / "results" / "compare" / "pareto.png").exists()


def test_python_block(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = [body for lang, body in _blocks() if lang == "python"]
    ns: dict = {}
    exec(compile(_substitute(code), "README.md", "exec"), ns)
    assert ns["cost"].feasible and ns["cost"].step_time_s <= 1.1 * ns["fast"].step_time_s * (1 + 1e-9)
    assert ns["report"].max_rel_err < 1e-3
    assert abs(float(ns["loss"]) - ns["report"].ref_loss) < 1e-5


@pytest.mark.parametrize("name", sorted(SKIPPED_BLOCKS))
def test_skipped_blocks_say_why(name):
    assert SKIPPED_BLOCKS[name]
