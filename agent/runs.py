"""Run folders of the trainers (agent/train.py, agent/fgnn_train.py): the folder, its clock and its
budget, atomic JSON records, and the git revision a run records.

``run_dir(out, force)`` makes a fresh run folder (default ``runs/train-YYYYmmdd-HHMMSS`` under the
current directory, never the package) and refuses one that already holds a run's files unless
``force``. ``Run`` is the folder plus its clock: seconds used by earlier sessions (``state.json``'s
``used_s``) plus this one, against ``time_limit_s``. ``budget_alarm(time_limit_s)`` raises
``BudgetSpent`` in the main thread when the budget runs out inside a step that has no time check of
its own. Every file is written atomically (``agent.checkpoints.write_atomic``: tmp + rename).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import time

from agent.checkpoints import write_atomic

STATE = "state.json"
TEACHER = "teacher.msgpack"
BC = "bc.msgpack"
POLICY = "policy.msgpack"
CARD = "card.json"
#: the files that make a folder a run's (a fresh run refuses a folder holding any of them)
RUN_FILES = (POLICY, BC, TEACHER, STATE, CARD)


class BudgetSpent(KeyboardInterrupt):
    """The ``--minutes`` budget ran out inside a step that has no time check of its own (building
    the PPO environments, a rollout). A KeyboardInterrupt, so the trainer's interrupt path restores
    the state before the unfinished update and saves it; the run then ends normally."""


@contextlib.contextmanager
def budget_alarm(time_limit_s: float):
    """Raise BudgetSpent in the main thread once ``time_limit_s`` have passed (SIGALRM; a no-op
    where there is none, or off the main thread)."""
    if not hasattr(signal, "setitimer") or time_limit_s == float("inf"):
        yield
        return
    def spent(signum, frame):
        raise BudgetSpent()

    try:
        old = signal.signal(signal.SIGALRM, spent)
    except ValueError:    # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, max(float(time_limit_s), 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def write_json(path: str, doc: dict) -> None:
    """``doc`` as indented JSON at ``path``, atomically."""
    write_atomic(path, json.dumps(doc, indent=1, default=float).encode())


def run_dir(out: str | None, force: bool = False) -> str:
    """The run folder for a fresh run: refused if it holds a run's files (without ``force``, which
    deletes them)."""
    out = out or os.path.join("runs", time.strftime("train-%Y%m%d-%H%M%S"))
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out}: is a file, not a directory")
    existing = [f for f in RUN_FILES if os.path.exists(os.path.join(out, f))]
    if existing and not force:
        raise ValueError(f"--out {out} already holds {', '.join(existing)}; pass --force to overwrite, "
                         f"--resume {out} to continue it, or another --out")
    os.makedirs(out, exist_ok=True)
    for f in existing:
        os.remove(os.path.join(out, f))
    return out


class Run:
    """The run folder and its clock: seconds used by earlier sessions plus this one.

    ``args``: the run's recorded arguments; ``time_limit_s``: the whole run's wall-time budget, every
    session counted; ``state``: the saved ``state.json`` of a resumed run (None: a fresh one)."""

    def __init__(self, out: str, args: dict, time_limit_s: float, state: dict | None = None):
        self.out, self.args = out, args
        self.state = state or {"args": args, "phase": "teacher", "used_s": 0.0, "sessions": 0}
        self.state["sessions"] += 1
        self.t0 = time.perf_counter() - float(self.state["used_s"])
        self.budget_s = float(time_limit_s)

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def save(self, **kw) -> None:
        self.state.update(kw, used_s=self.elapsed())
        write_json(self.path(STATE), self.state)


def git_rev() -> str:
    """HEAD commit of the repository holding this file ("unknown" without git)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def resumed_args(a: argparse.Namespace, argv: list[str], overridable: tuple[str, ...]):
    """(args, state) of the run folder ``a.resume``: its saved arguments, except the ``overridable``
    ones given again on this command line (``--minutes`` to extend a budget), and its state.json."""
    with open(os.path.join(a.resume, STATE)) as f:
        state = json.load(f)
    saved = dict(state["args"])
    for k in overridable:
        if f"--{k.replace('_', '-')}" in argv:
            saved[k] = getattr(a, k)
    return argparse.Namespace(**{**vars(a), **saved, "resume": a.resume, "out": a.resume}), saved, state
