"""XLA's C++ log lines, caught and summarised instead of streamed.

XLA writes warnings such as "Involuntary full rematerialization" from C++ straight to file
descriptor 2, past ``sys.stderr``; ``capture_fd2()`` points fd 2 at a temporary file for the
duration of a block (compile and run) and ``summarize`` turns what arrived into one line: how many
warnings of each kind and, for rematerialisations, the biggest tensor involved.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field

_REMAT = "Involuntary full rematerialization"
_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64|c64|c128)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


@dataclass
class Captured:
    text: str = ""
    lines: list = field(default_factory=list)


@contextlib.contextmanager
def capture_fd2():
    """Redirect fd 2 (C++ and Python stderr alike) to a temp file; the yielded Captured is filled
    on exit. Python's sys.stderr is flushed on both sides so nothing is lost or reordered."""
    cap = Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    tmp = tempfile.TemporaryFile()
    os.dup2(tmp.fileno(), 2)
    try:
        yield cap
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        tmp.seek(0)
        cap.text = tmp.read().decode("utf-8", errors="replace")
        tmp.close()
        cap.lines = [ln for ln in cap.text.splitlines() if ln.strip()]


def _tensor_bytes(line: str) -> tuple[int, str]:
    best = (0, "")
    for dt, dims in _SHAPE.findall(line):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        b = n * _BYTES[dt]
        if b > best[0]:
            best = (b, f"{dt}[{dims}]")
    return best


def summarize(lines: list[str]) -> str:
    """One line for what XLA logged: '' when nothing; else counts per kind, worst remat tensor."""
    if not lines:
        return ""
    remat = [ln for ln in lines if _REMAT in ln]
    warn = [ln for ln in lines if _REMAT not in ln and re.match(r"^[WE]\d{4} ", ln)]
    other = len(lines) - len(remat) - len(warn)
    parts = []
    if remat:
        b, t = max(_tensor_bytes(ln) for ln in remat)
        parts.append(f"{len(remat)} involuntary full rematerialization warning(s)"
                     + (f", worst {t} ({b / 2**20:.2f} MiB)" if t else ""))
    if warn:
        parts.append(f"{len(warn)} other warning(s), first: {warn[0][:120]}")
    if other:
        parts.append(f"{other} other line(s)")
    return "XLA: " + "; ".join(parts) + " (set SHARDGYM_XLA_LOG=1 to see them)"
