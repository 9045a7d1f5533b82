"""`shardgym train` cannot destroy work: a default run writes a new run folder (never the shipped
policy), Ctrl-C saves and exits 130 with the resume command, and the resumed run ends with weights
bit-identical to an uninterrupted one. A tiny config (one random problem, 2 envs x 4 steps, 4 PPO
updates) keeps it to tens of seconds, most of it jit compiles (shared by the three runs, which run
in this process; the Ctrl-C is a real SIGINT to it). A SIGKILLed subprocess resumed from its last
checkpoint ends bit-identical too (checked by hand, see the issue-17 report)."""
from __future__ import annotations

import glob
import hashlib
import os
import signal

import pytest

from agent.checkpoints import load_checkpoint, weights_digest
from agent.ppo import PPOTrainer
from shardgym import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(REPO, "agent", "pretrained")
TINY = ["--no-workloads", "--random-problems", "1", "--bc-epochs", "0", "--updates", "4", "--checkpoint-every", "1",
        "--num-envs", "2", "--num-steps", "4", "--minibatches", "1", "--epochs", "1", "--hidden", "8", "--rounds", "1",
        "--random-fraction", "1.0", "--random-start", "0", "--wandb", "false", "--no-progress"]


def _digest_dir(path):
    return {f: hashlib.sha256(open(os.path.join(path, f), "rb").read()).hexdigest() for f in sorted(os.listdir(path))
            if os.path.isfile(os.path.join(path, f))}


@pytest.mark.slow
def test_interrupted_run_resumes_bit_identical_and_shipped_policy_untouched(tmp_path, monkeypatch, capsys):
    shipped_before = _digest_dir(SHIPPED)
    # the uninterrupted run, with the default --out, from a folder that looks like a clone
    root = tmp_path / "clone"
    (root / "agent" / "pretrained").mkdir(parents=True)
    (root / "agent" / "pretrained" / "policy.msgpack").write_bytes(b"shipped")
    monkeypatch.chdir(root)
    assert cli.main(["train", *TINY]) == 0
    (a,) = glob.glob(str(root / "runs" / "train-*"))
    assert (root / "agent" / "pretrained" / "policy.msgpack").read_bytes() == b"shipped"
    assert sorted(os.listdir(root / "agent" / "pretrained")) == ["policy.msgpack"]
    assert load_checkpoint(os.path.join(a, "policy.msgpack"))["update"] == 4

    # the same run, Ctrl-C'd in the RL phase (a real SIGINT, sent right after the checkpoint of
    # update 1 is written, so it lands mid-training), then resumed
    b = tmp_path / "B"
    sent: list = []
    save = PPOTrainer.save

    def save_then_ctrl_c(self, path, extra=None):
        out = save(self, path, extra)
        if self.update_count == 1 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(PPOTrainer, "save", save_then_ctrl_c)
    capsys.readouterr()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C -> KeyboardInterrupt
    try:
        assert cli.main(["train", *TINY, "--out", str(b)]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(PPOTrainer, "save", save)
    assert sent
    assert f"shardgym train --resume {b}" in capsys.readouterr().err
    assert 1 <= load_checkpoint(str(b / "policy.msgpack"))["update"] < 4
    assert cli.main(["train", "--resume", str(b)]) == 0
    assert load_checkpoint(str(b / "policy.msgpack"))["update"] == 4
    assert weights_digest(os.path.join(a, "policy.msgpack")) == weights_digest(str(b / "policy.msgpack"))
    assert cli.main(["train", *TINY, "--out", a]) == 2          # a checkpoint is there: refused
    assert _digest_dir(SHIPPED) == shipped_before


def test_budget_alarm_ends_a_step_that_has_no_clock():
    """``agent.runs.budget_alarm`` raises BudgetSpent (a KeyboardInterrupt, so the trainer's interrupt path
    drops the unfinished update) inside code that never looks at the time; it is off afterwards."""
    import time

    from agent.runs import BudgetSpent, budget_alarm
    t0 = time.perf_counter()
    with pytest.raises(BudgetSpent):
        with budget_alarm(0.2):
            while True:
                time.sleep(0.01)
    assert time.perf_counter() - t0 < 5
    time.sleep(0.3)   # the timer was cancelled: nothing fires now


def test_spent_budget_ends_normally_with_a_policy(tmp_path, capsys):
    """With no --updates and a budget spent before PPO's first update finishes, the run still ends
    with exit 0 and a loadable policy (not exit 130): the budget is a normal end."""
    i = TINY.index("--updates")
    args = TINY[:i] + TINY[i + 2:]
    out = tmp_path / "run"
    assert cli.main(["train", *args, "--minutes", "0.01", "--out", str(out)]) == 0
    import json
    card = json.load(open(out / "card.json"))
    # the policy written is the one the card reports (an unfinished update is dropped, not half-kept)
    assert load_checkpoint(out / "policy.msgpack")["update"] == card["ppo_updates"]
    assert "budget reached" in capsys.readouterr().out
