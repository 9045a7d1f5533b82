"""The forked toulbar2 round of ``solvers.cfn`` (toulbar2's global state and any overrun stay in
the child) and the read-back of the plans a streamed round wrote before it was killed."""
from __future__ import annotations

import os
import pickle
import select
import signal
import time

import numpy as np


def forked(fn, args, deadline: float, margin_s: float):
    """``fn(*args)`` in a forked child (toulbar2's global state and any overrun stay there),
    killed ``margin_s`` after ``deadline``; (None, −inf, True) if it gives nothing by then.
    A bare ``os.fork`` (``capped.solve_guarded``'s child is a daemon process, which
    multiprocessing forbids to have children); the answer comes back pickled through a pipe."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # child: solve, write, exit without cleanup
        code = 1
        try:
            os.close(rfd)
            data = pickle.dumps(fn(*args))
            with os.fdopen(wfd, "wb") as f:
                f.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    chunks, out = [], (None, -np.inf, True)
    try:
        while True:
            wait = deadline + margin_s - time.perf_counter()
            if wait <= 0 or not select.select([rfd], [], [], wait)[0]:
                break
            chunk = os.read(rfd, 1 << 20)
            if not chunk:
                if chunks:
                    out = pickle.loads(b"".join(chunks))
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    return out


def streamed(path: str, model) -> np.ndarray | None:
    """The component plan of the last complete solution toulbar2 wrote to ``path`` (a
    "New solution: ..." line, then one line of values, one per variable with a choice), or None."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = int(model.free.sum())
    for i in range(len(lines) - 1, 0, -1):
        if lines[i - 1].startswith("New solution"):
            vals = lines[i].split()
            if len(vals) == want and all(v.isdigit() for v in vals):
                x = np.asarray([int(v) for v in vals], dtype=np.int64)
                if np.all(x < model.gc.k[model.free]):
                    return model.expand(x)
    return None
