"""Which softmax-sized buffers XLA CPU holds from the forward pass to the backward, against the
model's (``materialised_outputs`` and the builder's intervals), on two small fwd+bwd programs:
gpt's causal attention (scores dot, mask, softmax, probabilities @ V) and the logits'
log-softmax cross-entropy. In both XLA writes out exp(s - max) (a YNNPACK fusion of the max
reduction with the subtract and exp) for the forward sum and the backward; attention also holds
the probabilities (a dot operand). The scores dot's result dies in the forward: the backward's
``select`` rebuilds the causal mask from its iota, while the model had held the scores to the
backward through the mask group's fused read (``slice_layout.read_extents``: 3 buffers, gpt 125m's
third 48 MiB per block, results/s20c_gpt_ilptime_peak.json)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp

import shardgym as sg
from costmodel.memory import materialised_outputs


def _attention(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    t = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, jnp.finfo(jnp.float32).min)
    return jnp.sum(jnp.tanh(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)))


def _logits(w, x, t):
    logp = jax.nn.log_softmax(x @ w, -1)
    return -jnp.mean(jnp.take_along_axis(logp, t[..., None], -1))


def _xla_held(fn, args, shape) -> list[str]:
    """Forward-pass instructions of ``shape`` (no parameter) that a backward one reads (op_name
    under ``transpose(``), in XLA's optimised HLO."""
    hlo = jax.jit(jax.grad(fn, tuple(range(len(args) - (fn is _logits))))).lower(*args).compile().as_text()
    typ = "f32[" + ",".join(map(str, shape)) + "]"
    fwd, held = set(), set()
    for line in hlo[hlo.index("ENTRY"):].splitlines():
        m = re.match(r"\s+(?:ROOT )?%(\S+) = (\S+) (\w[\w-]*)\((.*?)\)(.*)", line)
        if not m:
            continue
        name, ty, op, ops, rest = m.groups()
        if "transpose(" in rest:
            held |= fwd & set(re.findall(r"%([\w.\-]+)", ops))
        elif ty.startswith(typ) and op != "parameter":
            fwd.add(name)
    return sorted(held)


def _model_held(fn, args, shape) -> list[str]:
    """The model's kept buffers of ``shape`` (a node's output or its head's own result) made in
    the forward pass and live at the first gradient step."""
    step = jax.grad(fn, tuple(range(len(args) - (fn is _logits))))
    graph = sg.trace(step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    kept, _ = materialised_outputs(graph)
    first_grad = min(nd.order for nd in graph.nodes if not nd.is_input and nd.role == "gradient")
    out = []
    for nd in graph.nodes:
        if nd.is_input or nd.role == "gradient" or not kept[nd.id]:
            continue
        shapes = [tuple(nd.outputs[0 if o < 0 else o].shape) for o in kept[nd.id]]
        if tuple(shape) in shapes and problem.intervals[nd.id, 1] > first_grad:
            out.append(f"{nd.primitive}{'+' + '+'.join(nd.folded) if nd.folded else ''}")
    return sorted(out)


def test_attention_holds_exp_and_probabilities_not_the_scores():
    q = jnp.ones((2, 128, 4, 32))
    xla = _xla_held(_attention, (q, q, q), (2, 4, 128, 128))
    model = _model_held(_attention, (q, q, q), (2, 4, 128, 128))
    assert len(xla) == 2, xla                       # the max-sub-exp ynn_fusion, the probabilities
    assert model == ["div", "sub+exp"], model        # was 3: + dot_general+div (the scores)


def test_logits_softmax_keeps_its_exp():
    w, x, t = jnp.ones((64, 512)), jnp.ones((64, 64)), jnp.zeros((64,), jnp.int32)
    xla = _xla_held(_logits, (w, x, t), (64, 512))
    model = _model_held(_logits, (w, x, t), (64, 512))
    assert len(xla) == 1, xla                       # exp(l - max), read by the backward's fusion
    assert len(model) == 1 and "exp" in model[0], model
