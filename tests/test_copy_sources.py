"""A dot operand's layout copy that XLA CPU fuses from the copied value's operands
(``slice_layout.copy_source_reads``), on gpt's lm_head and cross-entropy at a small size, fwd+bwd,
replicated on cpu-2x4 (compiled abstractly). The logits gradient (exp * g / sum + the scatter-add
one-hot, an element-wise group) is written row-major for dX and, fused again from the exp and the
one-hot, transposed for the weight gradient dW (contracting batch and sequence: a
``copy_bitcast_fusion`` just before dW's dot), so the exp and the one-hot live to that dot: XLA
holds 4 logits-sized buffers there. The model freed both at the group's step: predicted / XLA
0.515, now 0.993 (gpt 125m ilp-memory-1.05 at real size 0.889 -> 1.005, re-priced)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

import shardgym as sg
from costmodel.copy_lists import layout_copied_reads
from costmodel.memory import materialising
from costmodel.problem import Plan
from solvers.baselines import baseline_plan


def _lm(w, x, t):
    logp = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", x, w), -1)
    return -jnp.mean(jnp.take_along_axis(logp, t[..., None], -1))


def _step(w, x, t):
    return jax.grad(_lm, (0, 1))(w, x, t)


def test_logits_gradient_copy_holds_its_operands_to_the_weight_gradient_dot():
    args = (jnp.ones((64, 2048)), jnp.ones((4, 256, 64)), jnp.zeros((4, 256), jnp.int32))
    graph = sg.trace(_step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    nodes = graph.nodes
    # the copied value: an element-wise group (not a buffer of its own kind) read by two dots,
    # one (dW) through a transposed copy
    (u, _, _), rs = next(((k, rs) for k, rs in layout_copied_reads(graph).items() if not materialising(nodes[k[0]])))
    (dw, _), = rs
    assert nodes[dw].primitive == "dot_general"
    big = [s for s, _ in nodes[u].operands if s >= 0 and nodes[s].outputs[0].nbytes >= 4 * 256 * 2048 * 4]
    assert len(big) == 2                                # exp(l - max) and the scatter-add one-hot
    for s in big:                                       # live to the copy's dot, not to the group
        assert problem.intervals[s, 1] > nodes[dw].order, (nodes[s].primitive, problem.intervals[s])
    s = baseline_plan(problem, "replicated", use_ilp=False)
    plan = Plan.for_problem(problem, list(s), method="replicated")
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    ratio = sg.evaluate(problem, s).peak_memory_bytes / sg.execute(_step, abstract, graph, plan).xla_memory_bytes
    assert abs(ratio - 1) <= 0.05, f"predicted / XLA memory {ratio:.3f} (0.515 before)"
