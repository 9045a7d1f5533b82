"""XLA CPU's YNNPACK reductions and the broadcasts they read as buffers (costmodel.reduce_reads),
checked against XLA's optimised HLO: small probes of the rule, and gpt tiny's replicated plan on
cpu-2x4 (compiled abstractly), whose LayerNorm backward reductions read ten written-out
broadcasts (predicted / XLA memory before the rule: 0.914)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardgym as sg
import zoo
from costmodel.reduce_reads import YNN_MIN_ELEMENTS


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def _broadcasts_read_by_ynn_reductions(hlo: str) -> list[str]:
    """Names of the fusions whose root is a broadcast (a written-out broadcast) read by a
    ``__ynn_fusion`` whose computation holds a reduce."""
    comps = {m.group(1): m.group(2) for m in re.finditer(r"^%(\S+) \(.*?\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M)}
    entry = hlo[hlo.index("ENTRY"):]
    defs = {}
    for line in entry.splitlines():
        m = re.match(r"\s+(?:ROOT )?%(\S+) = \S+ (\w[\w-]*)\((.*?)\)(.*)", line)
        if m:
            defs[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    out = set()
    for op, args, rest in defs.values():
        c = re.search(r"calls=%([\w.]+)", rest)
        if op != "fusion" or "__ynn_fusion" not in rest or not c or " reduce(" not in comps.get(c.group(1), ""):
            continue
        for a in re.findall(r"%([\w.\-]+)", args):
            d = defs.get(a)
            cb = re.search(r"calls=%([\w.]+)", d[2]) if d else None
            body = comps.get(cb.group(1), "") if cb else ""
            if d and d[0] == "fusion" and "__ynn_fusion" not in d[2] and re.search(r"ROOT %\S+ = \S+ (bitcast|broadcast)\(", body) \
                    and " broadcast(" in body and " multiply(" not in body:
                out.add(a)
    return sorted(out)


def test_a_broadcast_shared_with_another_reader_is_written_out_for_a_ynn_reduction():
    x = y = jnp.ones((64, 256))
    s = jnp.ones((256,))
    alone = _hlo(lambda x, y, s: jnp.sum(y * s, -1), x, y, s)
    shared = _hlo(lambda x, y, s: (jnp.sum(y * s, -1), x * s * 2), x, y, s)
    assert "__ynn_fusion" in alone and not _broadcasts_read_by_ynn_reductions(alone)
    assert len(_broadcasts_read_by_ynn_reductions(shared)) == 1


def test_small_reductions_are_loop_fusions():
    n = YNN_MIN_ELEMENTS
    assert "__ynn_fusion" in _hlo(lambda x: jnp.sum(x * x, -1), jnp.ones((1, n)))
    assert "__ynn_fusion" not in _hlo(lambda x: jnp.sum(x * x, -1), jnp.ones((1, n - 1)))


@pytest.fixture(scope="module")
def gpt_replicated():
    """gpt tiny's replicated plan, its Problem and the groups ``reduce_broadcast_lists`` gave it."""
    import costmodel.builder as builder

    captured, real = [], builder.reduce_broadcast_lists
    fn, args = zoo.build("gpt", "tiny", seed=0, abstract=True)
    graph = sg.trace(fn, *args)
    builder.reduce_broadcast_lists = lambda *a, **k: captured.append(real(*a, **k)) or captured[-1]
    try:
        problem = sg.build_problem(graph, "cpu-2x4")
    finally:
        builder.reduce_broadcast_lists = real
    plan = sg.solve(problem, method="replicated")
    return fn, args, graph, problem, plan, captured[-1]


def test_layernorm_backward_broadcasts_are_charged_as_xla_writes_them(gpt_replicated, tmp_path):
    """gpt tiny, replicated, cpu-2x4: XLA writes the scale and the rsqrt broadcast of each of the
    five LayerNorms out (``wrapped_broadcast``, ``bitcast_broadcast_fusion``, f32[8,32,64]) for
    the backward YNNPACK reductions; the model charges one copy group each, and the step's memory
    comes within 5% (0.914 without them)."""
    fn, args, graph, problem, plan, groups = gpt_replicated
    r = sg.execute(fn, args, graph, plan, compiler_options={"xla_dump_to": str(tmp_path)})
    hlo = max(tmp_path.glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size).read_text()
    written = _broadcasts_read_by_ynn_reductions(hlo)
    s = np.asarray(plan.strategies)
    ours = [(u, b) for u, b, members, *_ in groups
            if any(want[s[v]] and not free[s[u]] for v, _, want, free in members)]
    assert len(written) == 10 and len(ours) == 10 and all(b == 8 * 32 * 64 * 4 for _, b in ours), (written, ours)
    ratio = sg.evaluate(problem, plan).peak_memory_bytes / r.xla_memory_bytes
    assert abs(ratio - 1) <= 0.05, f"gpt tiny replicated: predicted / XLA memory {ratio:.3f}"
