"""Tests of costmodel/trace/ (trace): hand-checked small programs, the zoo, invariants under hypothesis."""
from __future__ import annotations

import json
import math
import warnings

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from costmodel.graph import OpGraph, Tensor
from costmodel.trace import trace

F32 = jnp.float32


def sds(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def check_invariants(g: OpGraph) -> None:
    """Structural invariants every traced graph satisfies."""
    seen_op = False
    for i, n in enumerate(g.nodes):
        assert n.id == i
        if n.is_input:
            assert not seen_op, "inputs must come first"
            assert n.operands == () and len(n.outputs) == 1
        else:
            seen_op = True
            assert len(n.outputs) >= 1
            assert n.order == i - len(g.inputs())
        assert len(n.operands) == len(n.operand_types) == len(n.operand_roles)
        for (src, si), t, r in zip(n.operands, n.operand_types, n.operand_roles):
            if src < 0:
                assert r == "constant"
                continue
            assert src < i, "operands must point backwards (topological ids)"
            assert g.nodes[src].outputs[si] == t, "operand type must equal the producer's output type"
            assert r == g.nodes[src].role
        assert math.isclose(sum(n.flops_by_primitive.values()), n.flops, rel_tol=0, abs_tol=1e-6)
    for src, si in g.outputs:
        assert src == -1 or si < len(g.nodes[src].outputs)
    assert len(g.output_aliases) == len(g.outputs)
    ops = [n for n in g.nodes if not n.is_input]
    assert sum(1 + len(n.folded) for n in ops) == g.num_eqns
    assert g.num_nodes_unfolded == g.num_eqns + len(g.inputs())


def check_fold_preserves(fn, *args) -> tuple[OpGraph, OpGraph]:
    g = trace(fn, *args)
    u = trace(fn, *args, fold=False)
    check_invariants(g)
    check_invariants(u)
    assert len(u) == g.num_nodes_unfolded == u.num_nodes_unfolded
    assert g.num_eqns == u.num_eqns
    assert g.total_flops == u.total_flops  # exact
    assert g.total_bytes == u.total_bytes  # exact
    assert g.flops_by_primitive() == u.flops_by_primitive()
    assert len(g) <= len(u)
    return g, u


# ---- hand-checked programs --------------------------------------------------------------------
def test_matmul_flops_bytes_shapes():
    g = trace(lambda a, b: a @ b, sds(4, 8), sds(8, 3))
    assert len(g) == 3 and g.num_eqns == 1 and g.num_nodes_unfolded == 3
    a, b, mm = g.nodes
    assert (a.primitive, a.role, a.input_index, a.input_path) == ("input", "param", 0, "[0]")
    assert (b.role, b.input_index, b.input_path) == ("batch", 1, "[1]")
    assert mm.primitive == "dot_general"
    assert mm.operands == ((0, 0), (1, 0))
    assert mm.operand_types == (Tensor((4, 8), "float32"), Tensor((8, 3), "float32"))
    assert mm.outputs == (Tensor((4, 3), "float32"),)
    assert mm.flops == 2 * 4 * 3 * 8 == 192
    assert mm.bytes_read == (32 + 24) * 4
    assert mm.bytes_written == 12 * 4
    assert mm.params["dimension_numbers"] == [[[1], [0]], [[], []]]
    assert mm.operand_roles == ("param", "batch")
    assert g.outputs == ((2, 0),) and g.output_aliases == (None,)
    assert g.flops_by_primitive() == {"dot_general": 192.0}


def test_fold_chain_hand_counted():
    # dot -> tanh -> mul(2) fold into one node; second dot and the reduction stay separate.
    def f(w1, x, w2):
        h = jnp.tanh(x @ w1) * 2.0
        return jnp.sum(h @ w2)

    B, I, H, O = 4, 8, 16, 2
    g, u = check_fold_preserves(f, sds(I, H), sds(B, I), sds(H, O))
    assert [n.primitive for n in u.nodes] == ["input"] * 3 + ["dot_general", "tanh", "mul", "dot_general", "reduce_sum"]
    assert [n.primitive for n in g.nodes] == ["input"] * 3 + ["dot_general", "dot_general", "reduce_sum"]
    assert [n.role for n in g.inputs()] == ["param", "opt_state", "batch"]  # arity 3
    d1 = g.nodes[3]
    assert d1.folded == ("tanh", "mul")
    assert d1.flops == 2 * B * I * H + B * H + B * H
    assert d1.flops_by_primitive == {"dot_general": 2 * B * I * H, "tanh": B * H, "mul": B * H}
    # bytes are additive over the absorbed equations
    assert d1.bytes_read == 4 * (B * I + I * H) + 4 * B * H + 4 * (B * H + 1)
    assert d1.bytes_written == 3 * 4 * B * H
    assert d1.outputs == (Tensor((B, H), "float32"),)  # only the mul result leaves the group
    assert g.nodes[4].operands[0] == (3, 0)
    assert g.nodes[5].flops == B * O


def _mlp_step_args():
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(16)(x)
            return nn.Dense(4)(nn.tanh(h))

    model = MLP()
    params = jax.eval_shape(model.init, jax.random.key(0), sds(8, 32))["params"]
    opt = optax.adamw(1e-3)
    opt_state = jax.eval_shape(opt.init, params)

    def step(params, opt_state, batch):
        def loss(p):
            return jnp.mean((model.apply({"params": p}, batch["x"]) - batch["y"]) ** 2)
        l, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, l

    return step, (params, opt_state, {"x": sds(8, 32), "y": sds(8, 4)})


def test_mlp_train_step():
    step, args = _mlp_step_args()
    g, u = check_fold_preserves(step, *args)
    B, I, H, O = 8, 32, 16, 4
    n_param, n_batch = 4, 2
    n_opt = len(jax.tree.leaves(args[1]))
    assert n_opt == 1 + 2 * n_param  # adam count, mu, nu (+ empty weight-decay / schedule states)
    roles = [n.role for n in g.inputs()]
    assert roles == ["param"] * n_param + ["opt_state"] * n_opt + ["batch"] * n_batch
    assert g.inputs()[0].input_path == "[0]['Dense_0']['bias']"
    assert g.inputs()[-1].input_path == "[2]['y']"
    # outputs: new params, new opt state (aliasing the old leaves one to one), loss
    assert len(g.outputs) == n_param + n_opt + 1
    assert g.output_aliases == tuple(range(n_param + n_opt)) + (None,)
    # 2 forward dots, dW for both layers, dX only for layer 2 (the batch needs no gradient)
    dots = [n for n in g.nodes if n.primitive == "dot_general"]
    assert [n.role for n in dots] == ["activation"] * 2 + ["gradient"] * 3
    assert dots[0].module_path == "MLP/Dense_0" and dots[1].module_path == "MLP/Dense_1"
    assert dots[0].folded[:2] == ("add", "tanh")  # bias add (after a pinned-source reshape), activation
    assert {n.module_path for n in dots[2:]} == {"MLP/Dense_0", "MLP/Dense_1"}
    fwd = 2 * B * (I * H + H * O)
    assert g.flops_by_primitive()["dot_general"] == 3 * fwd - 2 * B * I * H
    # folding merges element-wise chains: far fewer nodes, same number of dots
    assert len(g) < 0.6 * len(u)
    assert sum(n.primitive == "dot_general" for n in u.nodes) == 5
    assert any(n.folded for n in g.nodes)


def test_fold_softmax_stays_acyclic():
    def f(w, x):
        h = x @ w
        return jax.nn.softmax(h, axis=-1)

    g, u = check_fold_preserves(f, sds(8, 8), sds(4, 8))
    assert len(g) < len(u)
    dot = [n for n in g.nodes if n.primitive == "dot_general"][0]
    # h - max(h) cannot join the dot's group (max(h) depends on it) and max(h) is [4, 1] (jaxprs
    # broadcast size-1 dims implicitly): the sub heads its own node and the exp follows it
    assert dot.folded == ()
    (sub,) = [n for n in g.nodes if n.primitive == "sub"]
    assert sub.folded == ("exp",) and sub.operands[0] == (dot.id, 0)
    assert sub.flops == 2 * 4 * 8


def test_json_round_trip(tmp_path):
    step, args = _mlp_step_args()
    g = trace(step, *args, name="mlp")
    assert OpGraph.from_dict(g.to_dict()) == g
    p = tmp_path / "g.json"
    g.to_json(str(p))
    assert OpGraph.from_json(str(p)) == g


_weird_p = jex.core.Primitive("my_weird_op")
_weird_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))


def test_unsupported_primitive_is_replicate_only_node():
    def f(x, w):
        return jnp.tanh(_weird_p.bind(x @ w))

    with pytest.warns(UserWarning, match="my_weird_op"):
        g = trace(f, sds(4, 8), sds(8, 8))
    weird = [n for n in g.nodes if n.primitive == "my_weird_op"]
    assert len(weird) == 1 and weird[0].supported is False
    assert weird[0].flops_by_primitive == {"my_weird_op": 0.0, "tanh": 4 * 8}
    assert weird[0].folded == ("tanh",)  # element-wise consumers still fold into it
    assert all(n.supported for n in g.nodes if n.primitive != "my_weird_op")
    with warnings.catch_warnings(record=True) as rec:  # once per primitive per trace
        warnings.simplefilter("always")
        trace(lambda x: _weird_p.bind(_weird_p.bind(x)), sds(3))
    assert sum("my_weird_op" in str(w.message) for w in rec) == 1


def test_control_flow():
    # short scan: unrolled; long scan: one node with length x body FLOPs; cond: max branch; while: one iteration
    def short(c, xs):
        return lax.scan(lambda c, x: (c * x + 1.0, jnp.sin(c)), c, xs)

    g, _ = check_fold_preserves(short, sds(5), sds(3, 5))
    assert not any(n.primitive == "scan" for n in g.nodes)
    assert sum(n.primitive == "concatenate" for n in g.nodes) == 1
    assert g.total_flops == 3 * (5 + 5 + 5)  # mul, add, sin per step

    def long(c, xs):
        return lax.scan(lambda c, x: (c * x + 1.0, jnp.sin(c)), c, xs)

    g, _ = check_fold_preserves(long, sds(5), sds(100, 5))
    (sc,) = [n for n in g.nodes if n.primitive == "scan"]
    assert sc.flops == 100 * 15 and sc.params["replicate_only"] and sc.params["length"] == 100
    assert [t.shape for t in sc.outputs] == [(5,), (100, 5)]

    def cond(p, x):
        return lax.cond(p > 0, lambda x: x @ x, lambda x: x + 1.0, x)

    g, _ = check_fold_preserves(cond, sds(), sds(4, 4))
    (cn,) = [n for n in g.nodes if n.primitive == "cond"]
    assert cn.flops == 2 * 4 * 4 * 4 and cn.params["replicate_only"]

    def loop(x):
        return lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, jnp.tanh(c[1])), (0, x))[1]

    g, _ = check_fold_preserves(loop, sds(6))
    (wh,) = [n for n in g.nodes if n.primitive == "while"]
    assert wh.flops == 1 + 1 + 6  # cond lt + body add + tanh, one iteration


def test_inlining_and_params():
    @jax.jit
    def inner(x, w):
        return jax.nn.relu(x @ w)  # relu is a custom_jvp inside its own jit

    def f(x, w, idx):
        y = jax.checkpoint(lambda a: inner(a, w))(x)
        z = jnp.fft.fft(y.astype(jnp.complex64), axis=-1)
        s = jax.ops.segment_sum(jnp.abs(z), idx, num_segments=3)
        return jnp.transpose(s).reshape(-1), jnp.take(y, idx, axis=0)

    g, _ = check_fold_preserves(f, sds(4, 8), sds(8, 8), sds(4, dtype=jnp.int32))
    prims = {n.primitive for n in g.nodes}
    assert not prims & {"jit", "pjit", "custom_jvp_call", "remat2", "checkpoint"}
    (fft,) = [n for n in g.nodes if n.primitive == "fft"]
    assert fft.params["fft_type"] == "FFT" and fft.params["fft_lengths"] == [8]
    assert fft.flops_by_primitive["fft"] == round(5 * 8 * 3 * 4)
    (sc,) = [n for n in g.nodes if n.primitive == "scatter-add"]
    assert sc.flops_by_primitive["scatter-add"] == 4 * 8
    dn = sc.params["dimension_numbers"]
    assert set(dn) >= {"update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims"}
    (ga,) = [n for n in g.nodes if n.primitive == "gather"]
    assert set(ga.params["dimension_numbers"]) >= {"offset_dims", "collapsed_slice_dims", "start_index_map"}
    assert ga.params["slice_sizes"] == [1, 8]
    (tr,) = [n for n in g.nodes if n.primitive == "transpose"]
    assert tr.params["permutation"] == [1, 0]


def test_conv_flops():
    def f(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    g = trace(f, sds(2, 8, 8, 3), sds(3, 3, 3, 5))
    (cv,) = [n for n in g.nodes if n.primitive == "conv_general_dilated"]
    assert cv.flops == 2 * (2 * 8 * 8 * 5) * (3 * 3) * 3
    assert cv.params["dimension_numbers"] == {"lhs_spec": [0, 3, 1, 2], "rhs_spec": [3, 2, 0, 1],
                                              "out_spec": [0, 3, 1, 2]}
    assert cv.params["window_strides"] == [1, 1] and cv.params["feature_group_count"] == 1


def test_bad_input():
    with pytest.raises(ValueError, match="callable"):
        trace(42, sds(3))


# ---- the zoo --------------------------------------------------------------------------------
zoo = pytest.importorskip("zoo", reason="zoo/ (the model zoo) is not importable yet")


def test_gpt_tiny_matmul_flops():
    fn, args = zoo.build("gpt", "tiny", abstract=True)
    g = trace(fn, *args)
    want = zoo.gpt.matmul_flops(zoo.config("gpt", "tiny"))
    assert abs(g.flops_by_primitive()["dot_general"] - want) <= 1e-3 * want


@pytest.mark.parametrize("name", zoo.names() if hasattr(zoo, "names") else [])
def test_zoo_smallest_traces(name):
    size = zoo.sizes(name)[0]
    fn, args = zoo.build(name, size, abstract=True)
    g, u = check_fold_preserves(fn, *args)
    n_leaves = len(jax.tree.leaves(args))
    assert len(g.inputs()) == n_leaves
    assert [n.role for n in g.inputs()] == (["param"] * len(jax.tree.leaves(args[0]))
                                             + ["opt_state"] * len(jax.tree.leaves(args[1]))
                                             + ["batch"] * len(jax.tree.leaves(args[2])))
    n_state = len(jax.tree.leaves(args[0])) + len(jax.tree.leaves(args[1]))
    assert g.output_aliases[:n_state] == tuple(range(n_state))
    assert g.total_flops > 0 and len(g) < len(u)
    assert any(n.role == "gradient" for n in g.nodes)
    assert OpGraph.from_dict(json.loads(json.dumps(g.to_dict(), allow_nan=False))) == g  # strict JSON


@jax.custom_vjp
def _sin_vjp(x):
    return jnp.sin(x)


_sin_vjp.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,))


def test_scalar_key_leaves_custom_vjp_and_passthrough():
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)

    def step(p, n, key):
        noise = jax.random.normal(key, p.shape)
        loss, grad = jax.value_and_grad(lambda p: jnp.sum(_sin_vjp(p) * noise * n))(p)
        return p - grad, n, loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every primitive here has a rule
        g, _ = check_fold_preserves(step, sds(4), 3, key)
    p, n, k = g.inputs()
    assert (p.role, n.role, k.role) == ("param", "opt_state", "batch")
    assert n.outputs == (Tensor((), "int32"),)  # a Python int leaf is a 0-d int32 input
    assert k.outputs == (Tensor((2,), "uint32"),)  # a threefry key is two uint32 words
    assert g.outputs[1] == (1, 0)  # pass-through output points at the input node
    assert g.output_aliases == (0, 1, None)
    assert any(nd.primitive == "cos" for nd in g.nodes)  # the custom_vjp forward saves cos(x)


# ---- random programs ----------------------------------------------------------------------------
_IDX = np.array([1, 0, 2, 1, 3, 0, 2, 1])


def _apply(op, a, b, n):
    """One random operation on (n, n) float32 values, returning an (n, n) value."""
    idx = jnp.asarray(_IDX[:n] % n)
    if op == "matmul":
        return a @ b
    if op == "add":
        return a + b
    if op == "mul_sub":
        return a * b - 1.5
    if op == "exp_tanh":
        return jnp.exp(jnp.tanh(a)) / (1.0 + b * b)
    if op == "reduce":
        return jnp.broadcast_to(jnp.max(a, axis=1, keepdims=True), a.shape) + jnp.sum(b, axis=0)
    if op == "softmax":
        return jax.nn.softmax(a, axis=-1)
    if op == "reshape":
        return a.reshape(n * n // 2, 2).T.reshape(n, n)
    if op == "transpose":
        return a.T
    if op == "slice_concat":
        return jnp.concatenate([a[:, : n // 2], b[:, n // 2:]], axis=1)
    if op == "pad":
        return jnp.pad(a[1:, 1:], ((1, 0), (0, 1)))
    if op == "fft":
        return jnp.fft.irfft(jnp.fft.rfft(a, axis=-1), n=n, axis=-1) + jnp.abs(jnp.fft.fft(b)).astype(F32)
    if op == "gather":
        return a[idx] + jnp.take(b, idx, axis=1)
    if op == "scatter":
        return jnp.zeros_like(a).at[idx].add(b) + jax.ops.segment_sum(a, idx, num_segments=n)
    if op == "conv":
        k = b[:3, :3].reshape(3, 3, 1, 1)
        x = a.reshape(1, n, n, 1)
        return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")).reshape(n, n)
    if op == "cond":
        return lax.cond(jnp.sum(b) > 0, lambda x: x @ x, lambda x: -x, a)
    if op == "scan":
        c, ys = lax.scan(lambda c, x: (c + x, c * x), jnp.zeros(n, F32), a)
        return ys + c
    if op == "long_scan":
        return lax.scan(lambda c, _: (jnp.tanh(c @ b), None), a, None, length=70)[0]
    if op == "custom_jvp":
        return jax.nn.relu(a) + jax.nn.gelu(b) + jax.nn.softplus(a) + jax.nn.silu(b)
    if op == "jit":
        return jax.jit(lambda x, y: jnp.sin(x) @ y)(a, b)
    if op == "remat":
        return jax.checkpoint(lambda x, y: jnp.cos(x) * y)(a, b)
    if op == "cast":
        return (a.astype(jnp.bfloat16) * b.astype(jnp.bfloat16)).astype(F32)
    if op == "custom_vjp":
        return _sin_vjp(a) * b
    if op == "while":
        loop = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.tanh(c[1])), (0, b))[1]
        return a + lax.stop_gradient(loop)
    if op == "sort_cumsum":
        return jnp.cumsum(a, axis=0) + jnp.sort(b, axis=1)
    raise AssertionError(op)


_OPS = ["matmul", "add", "mul_sub", "exp_tanh", "reduce", "softmax", "reshape", "transpose", "slice_concat",
        "pad", "fft", "gather", "scatter", "conv", "cond", "scan", "long_scan", "custom_jvp", "jit", "remat",
        "cast", "sort_cumsum", "custom_vjp", "while"]


@st.composite
def programs(draw):
    n = draw(st.sampled_from([4, 6, 8]))
    steps = draw(st.lists(st.tuples(st.sampled_from(_OPS), st.integers(0, 99), st.integers(0, 99)),
                          min_size=1, max_size=5))
    mode = draw(st.sampled_from(["fwd", "grad", "jit_grad", "step"]))
    return n, steps, mode


def _build(n, steps, mode):
    def body(params, x):
        vals = [x, params["w"], params["w"] + params["b"]]
        for op, i, j in steps:
            vals.append(_apply(op, vals[i % len(vals)], vals[j % len(vals)], n))
        return vals[-1]

    params = {"w": sds(n, n), "b": sds(n)}
    x = sds(n, n)
    loss = lambda p, x: jnp.mean(body(p, x) ** 2)
    if mode == "fwd":
        return body, (params, x)
    if mode == "grad":
        return jax.grad(loss), (params, x)
    if mode == "jit_grad":
        return jax.jit(jax.value_and_grad(loss)), (params, x)

    def step(params, x):
        l, g = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), l
    return step, (params, x)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs(prog):
    n, steps, mode = prog
    fn, args = _build(n, steps, mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g, _ = check_fold_preserves(fn, *args)
    assert [n.role for n in g.inputs()] == ["param", "param", "batch"]
    if mode == "step":
        assert g.output_aliases == (0, 1, None)
