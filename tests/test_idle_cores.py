"""``solvers.ilp.guard.idle_cores``: the gate of the policy seed beside the capped core (``solvers.dispatch._beside``)
reads the CPU's idle time now, not the 1-min load average alone."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

from solvers.ilp import guard


def _spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def test_busy_cores_read_as_not_idle():
    """Every core busy (one spinning process per core): less than one idle core."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_spin, args=(time.time() + 2.0,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for q in procs:
        q.start()
    try:
        time.sleep(0.3)
        assert guard.idle_cores(0.5) < 1.0
    finally:
        for q in procs:
            q.kill()
            q.join()


def test_a_high_load_average_reads_as_not_idle_and_no_proc_stat_falls_back_to_it(monkeypatch):
    cores = os.cpu_count() or 1
    monkeypatch.setattr(guard.os, "getloadavg", lambda: (cores + 1.5, 0.0, 0.0))
    assert guard.idle_cores(0.05) <= 0.0          # a lull in a busy machine's CPU time does not count
    monkeypatch.setattr(guard.os, "getloadavg", lambda: (0.5, 0.0, 0.0))

    def no_proc_stat(*a, **k):
        raise OSError("no /proc/stat")
    monkeypatch.setattr(guard, "open", no_proc_stat, raising=False)
    assert guard.idle_cores(0.05) == cores - 0.5
