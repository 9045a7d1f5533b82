"""A watchdog for direct ``solve_ilp`` calls: HiGHS can overrun its own time limit (its MIP
presolve ran > 10 minutes past a 40 s limit on gpt tiny capped at 0.85, verbose, in a plain
process), and a native call cannot be interrupted from Python.

``solve_ilp_guarded(problem, time_limit_s=60, grace_s=None, **kw)`` runs ``solve_ilp`` in a forked
child and returns its answer, or raises its error; when the child has not answered ``grace_s``
after ``time_limit_s`` (default: 2 s + 5 % of the limit) it is killed and ``SolveOverrun`` (a
RuntimeError, as ``solve_ilp`` raises when HiGHS finds no plan in time) is raised, carrying the
plans the child streamed back before (``solve_ilp(on_incumbent=)``: the memory objective's copy-free
and heuristic plans), so a kill loses none of the work done before the last MIP. Without fork (not POSIX) it calls
``solve_ilp`` inline, as it does inside a guarded child (a daemon process: its parent's watchdog
bounds it). ``solvers.local.lns`` runs each neighbourhood's sub-ILP under it: one such sub-ILP of a
<= 1.5 s limit ran 20 minutes in HiGHS (meshgraphnet tiny @ h100-2x8, cap 0.5, the policy's
refine); a fork costs ~7 ms on 2 loaded cores. A forked child first resets HiGHS's task scheduler (``start_child``; also the
capped core's guard, ``solvers.capped.solve_guarded``).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time
import warnings

from costmodel.problem import evaluate
from solvers.ilp.highs import reset_scheduler
from solvers.ilp.objectives import solve_ilp


class SolveOverrun(RuntimeError):
    """The guarded solve gave no answer by its time limit plus grace and was stopped.
    ``incumbents``: the plans the child found before (``solve_ilp``'s ``on_incumbent``), oldest
    first; the caller answers the best of them and its seeds."""

    def __init__(self, message: str, incumbents=()):
        super().__init__(message)
        self.incumbents = [list(p) for p in incumbents]


def start_child(body):
    """Fork a daemon child that runs ``solvers.ilp.highs.reset_scheduler()`` and then ``body(send)``, ``send``
    being the write end of a one-way pipe (closed when ``body`` returns or raises): -> (process,
    receiving end). The parent's copy of ``send`` is closed, so ``recv`` sees EOF once the child
    is gone. JAX's warning about forking is silenced: the child runs numpy and HiGHS only. One
    home for the forked solvers (``solve_ilp_guarded``, ``solvers.capped.solve_guarded`` and its
    second search). The reset: HiGHS's global task scheduler inherited from the parent has no worker
    threads after fork, so when the parent had run HiGHS (bench_capped: the policy's MILP
    neighbourhoods, the setup's solves) the child's next parallel HiGHS call waited on them forever
    (mlp tiny cpu-2x4 at cap 50 %: no plan after BP's in 40 s; with it, the optimum in 3 s)."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        reset_scheduler()
        try:
            body(send)
        finally:
            send.close()

    proc = ctx.Process(target=child, daemon=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        proc.start()
    send.close()
    return proc, recv


def idle_cores(sample_s: float = 0.3) -> float:
    """How many cores are idle now (the policy seed's gate, ``solvers.dispatch._beside``): the smaller of (a) the idle share of CPU time over ``sample_s``
    (/proc/stat's "cpu" line, idle + iowait) times the core count and (b) cores + 1.5 − the 1-min load
    average (without /proc/stat: cores − that load). ``solvers.capped_phases.start_besides`` (the second search,
    the uncapped MILP and the LP beside the core) still reads cores − the load average. Why not the load average
    alone: it trails by a minute, so right after a run an idle machine reads as busy (a benchmark's
    sequential solves on 2 idle cores leave it at 1.2-2.0: no core "idle" by cores − load >= 1). Why
    (b) too: a 0.25-s sample on 2 cores busy with 3 jobs read 0.98 idle cores once in 6 (processes
    starting); at load >= cores + 0.5 it reads none."""
    def ticks():
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    cores, load = os.cpu_count() or 1, os.getloadavg()[0]
    try:
        idle0, total0 = ticks()
        time.sleep(sample_s)
        idle1, total1 = ticks()
    except (OSError, ValueError, IndexError):
        return cores - load
    return min(cores * (idle1 - idle0) / max(total1 - total0, 1e-9), cores + 1.5 - load)


def stop_child(proc) -> None:
    """Kill ``proc`` if it still runs, and reap it."""
    if proc.is_alive():
        proc.kill()
    proc.join(timeout=1.0)


def solve_ilp_guarded(problem, time_limit_s: float = 60, grace_s: float | None = None, progress=None, **kw):
    """``solve_ilp(problem, time_limit_s=time_limit_s, **kw)``, killed ``grace_s`` past its limit
    (the module docstring): then ``SolveOverrun`` (a RuntimeError) is raised. ``progress(msg)``:
    each plan ``solve_ilp`` streams (``on_incumbent``) that fits the problem's usage limit, as
    ``"incumbent: <step time> (<t>s, peak <bytes> B)"`` when it arrives (the time objective's
    HiGHS streams none; the memory objective's copy-free and heuristic plans)."""
    t0 = time.perf_counter()
    tell = _teller(problem, progress, t0, kw.get("on_incumbent"))
    kw.pop("on_incumbent", None)
    if not hasattr(os, "fork") or time_limit_s is None or not time_limit_s > 0 or mp.current_process().daemon:
        # inline without fork, or inside a guarded child (a daemon may not fork; its parent's
        # watchdog bounds it already)
        return solve_ilp(problem, time_limit_s=time_limit_s, on_incumbent=tell, **kw)
    grace = 2.0 + 0.05 * float(time_limit_s) if grace_s is None else float(grace_s)

    def body(send):
        def on_incumbent(plan):
            send.send(("incumbent", plan))
        try:
            out = ("ok", solve_ilp(problem, time_limit_s=time_limit_s, on_incumbent=on_incumbent, **kw))
        except Exception as exc:      # noqa: BLE001 -- handed to the parent, raised there
            out = ("error", exc)
        try:
            send.send(out)
        except (pickle.PicklingError, TypeError, AttributeError):
            send.send(("error", RuntimeError(f"{type(out[1]).__name__}: {out[1]}")))

    proc, recv = start_child(body)
    deadline = time.perf_counter() + float(time_limit_s) + grace
    msg, incumbents = None, []
    try:
        while msg is None and recv.poll(max(deadline - time.perf_counter(), 0.0)):
            got = recv.recv()
            if got[0] == "incumbent":
                incumbents.append(got[1])
                if tell is not None:
                    tell(got[1])
            else:
                msg = got
    except EOFError:                  # the child died without an answer
        msg = None
    finally:
        stop_child(proc)
    if msg is None:
        raise SolveOverrun(f"solve_ilp gave no answer within {time_limit_s:g} s + {grace:g} s "
                           f"(HiGHS overran its time limit): stopped", incumbents)
    if msg[0] == "error":
        raise msg[1]
    return msg[1]


def _teller(problem, progress, t0: float, on_incumbent=None):
    """``on_incumbent`` for ``solve_ilp``: ``on_incumbent(plan)`` (the caller's), then each plan
    that fits ``problem.usage_limit`` said through ``progress`` with its step time and peak; None
    when there is neither."""
    if progress is None and on_incumbent is None:
        return None

    def tell(plan):
        if on_incumbent is not None:
            on_incumbent(plan)
        if progress is not None:
            c = evaluate(problem, plan)
            if c.feasible:
                progress(f"incumbent: {c.total:.10g} ({time.perf_counter() - t0:.1f}s, peak {c.peak_memory_bytes:.0f} B)")
    return tell
