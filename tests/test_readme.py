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
EXAMPLE = os.path.normpath(os.path.join(REPO, "..", "shared", "iopddl", "example.json"))
MODEL = os.path.join(REPO, "tests", "data", "dropout_model.py")
# (README text, what the test runs instead, why): the suite runs on 2 shared cores, where the
# README's gpt lines as written take minutes (7 methods + an ILP sweep; a plan with thousands of
# constraints to compile) — mlp tiny goes through the same code.
SUBSTITUTIONS = [
    ("--model gpt --size 1.3b --cluster h100-2x8", "--model mlp --size tiny --cluster cpu-2x4",
     "GPT-1.3B on 16 devices: mlp tiny on the 8 test devices (then `run plan.json` runs it)"),
    ("compare --model gpt --size tiny", "compare --model mlp --size tiny --time-limit 5",
     "minutes on 2 cores: mlp tiny, 5 s solver limits (the memory ILP runs to its limit: 54 s of the test's 100)"),
    ("my_model.py:make_step", f"{MODEL}:make_step", "the README's own-model file: the test's dropout model"),
    ("--model gpt --size 125m --method ilp --objective memory --recompute auto",
     "--model mlp --size tiny --method ilp --objective memory --recompute auto --time-limit 2",
     "GPT-125M traced three times with a 60 s ILP each: mlp tiny, 2 s limits"),
    ("FILE TIMEOUT_S", f"{EXAMPLE} 1", "placeholders: the shared example instance, 1 s"),
    ('"125m"', '"tiny"', "GPT-125M: tiny"),
    ("time_limit_s=60", "time_limit_s=5", "60 s solver limits: 5 s (a time-limited plan still comes back)"),
    ("--max-step-time 0.0045 --out p.json", "--max-step-time 0.0045 --time-limit 5 --out p.json",
     "the default 60 s solver limit: 5 s"),
    ('"../shared/iopddl/', '"' + os.path.normpath(os.path.join(REPO, "..", "shared", "iopddl")) + "/",
     "relative to the repository root"),
]
SKIPPED_LINES = {"shardgym train": "tests/test_train.py runs `shardgym train` (fresh, Ctrl-C, --resume) on a tiny "
                                   "config; 20 minutes here would not fit the suite"}
SKIPPED_BLOCKS = {"make demo": "make demo and make test are CI's own two steps (this test runs inside make test)",
                  "python3 -m venv": "a non-editable install needs a fresh venv and the package index; "
                                     "tests/test_packaging.py checks what the wheel holds"}


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
        if line and not line.startswith("#") and not any(line.startswith(k) for k in SKIPPED_LINES):
            out.append(shlex.split(_substitute(line)))
    return out


def test_every_block_is_run_or_skipped_with_a_reason():
    for lang, body in _blocks():
        if lang == "bash":
            first = body.strip().splitlines()[0]
            assert first.startswith("shardgym") or any(k in first for k in SKIPPED_BLOCKS), first


@pytest.mark.slow
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


@pytest.mark.slow
def test_python_block(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = [body for lang, body in _blocks() if lang == "python"]
    ns: dict = {}
    exec(compile(_substitute(code), "README.md", "exec"), ns)
    assert ns["cost"].feasible and ns["cost"].step_time_s <= 1.1 * ns["fast"].step_time_s * (1 + 1e-9)
    assert ns["report"].max_rel_err < 1e-3
    assert abs(float(ns["loss"]) - ns["report"].ref_loss) < 1e-5


@pytest.mark.parametrize("name", sorted(SKIPPED_BLOCKS) + sorted(SKIPPED_LINES))
def test_skipped_blocks_say_why(name):
    assert (SKIPPED_BLOCKS | SKIPPED_LINES)[name]
