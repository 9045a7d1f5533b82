"""Tests of the Flax model zoo: every model trains on CPU, abstract builds allocate nothing,
and GPT's closed-form matmul FLOPs match a count of the dot_generals jax.grad emits."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo import gpt
from zoo.common import _FAST_COMPILE


def _dot_flops(jaxpr) -> float:
    """Sum of 2*|result|*prod(contracting dims) over dot_general eqns, recursing into sub-jaxprs."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = eqn.invars[0].aval.shape
            k = math.prod(lhs_shape[d] for d in lhs_contract)
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * k
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    total += _dot_flops(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    total += _dot_flops(sub)
    return total


def _is_abstract(tree) -> bool:
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


@pytest.mark.parametrize("name", zoo.names())
def test_smallest_size_trains(name):
    size = zoo.sizes(name)[0]
    step, (params, opt_state, batch) = zoo.build(name, size, seed=0)
    assert not _is_abstract(params)
    for leaf in jax.tree.leaves(batch):  # leading batch (or node/edge) dims split over a 2x4 mesh
        assert leaf.shape[0] % 8 == 0, leaf.shape
    # jax.jit with XLA's optimisation passes off: halves the compile time, same program.
    jstep = jax.jit(step).lower(params, opt_state, batch).compile(compiler_options=_FAST_COMPILE)
    new_params, new_opt_state, loss0 = jstep(params, opt_state, batch)
    assert np.isfinite(float(loss0))
    assert jax.tree.structure(new_params) == jax.tree.structure(params)
    assert jax.tree.structure(new_opt_state) == jax.tree.structure(opt_state)
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params)):
        assert a.shape == b.shape and a.dtype == b.dtype == jnp.float32
    p, o, losses = new_params, new_opt_state, [float(loss0)]
    for _ in range(3):
        p, o, loss = jstep(p, o, batch)
        losses.append(float(loss))
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses


def test_build_is_deterministic_from_seed():
    _, (p0, _, b0) = zoo.build("mlp", "tiny", seed=3)
    _, (p1, _, b1) = zoo.build("mlp", "tiny", seed=3)
    _, (p2, _, b2) = zoo.build("mlp", "tiny", seed=4)
    np.testing.assert_array_equal(b0["x"], b1["x"])
    np.testing.assert_array_equal(p0["Dense_0"]["kernel"], p1["Dense_0"]["kernel"])
    assert not np.array_equal(b0["x"], b2["x"])


@pytest.mark.parametrize("name", zoo.names())
def test_abstract_builds_every_size(name):
    for size in zoo.sizes(name):
        step, args = zoo.build(name, size, abstract=True)
        assert _is_abstract(args)
        params, opt_state, batch = args
        assert isinstance(params, dict) and "params" not in params


def test_gpt_7b_eval_shape_without_allocating():
    step, args = zoo.build("gpt", "7b", abstract=True)
    assert _is_abstract(args)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(args[0]))
    cfg = zoo.config("gpt", "7b")
    assert 6.0e9 < n_params < 7.5e9, n_params
    # the state carries two AdamW moments per parameter (plus the step count)
    n_state = sum(math.prod(x.shape) for x in jax.tree.leaves(args[1]))
    assert n_state == 2 * n_params + 1
    new_params, new_opt_state, loss = jax.eval_shape(step, *args)
    assert loss.shape == () and loss.dtype == jnp.float32
    assert jax.tree.structure(new_params) == jax.tree.structure(args[0])
    assert jax.tree.structure(new_opt_state) == jax.tree.structure(args[1])
    assert args[2]["inputs"].shape == (cfg.batch, cfg.seq_len)


def test_gpt_param_count_closed_form():
    cfg = zoo.config("gpt", "125m")
    _, (params, _, _) = zoo.build("gpt", "125m", abstract=True)
    d, f, v, t, layers = cfg.d_model, cfg.d_ff, cfg.vocab, cfg.seq_len, cfg.n_layers
    per_layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    expected = v * d + t * d + layers * per_layer + 2 * d + d * v
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == expected


def test_gpt_matmul_flops_by_hand_tiny():
    cfg = zoo.config("gpt", "tiny")  # B=8 T=32 d=64 f=256 V=256 L=2
    b, t, d, f, v = 8, 32, 64, 256, 256
    assert (cfg.batch, cfg.seq_len, cfg.d_model, cfg.d_ff, cfg.vocab, cfg.n_layers) == (b, t, d, f, v, 2)
    fwd_layer = 8 * b * t * d * d + 4 * b * t * t * d + 4 * b * t * d * f  # 8388608 + 2097152 + 16777216
    assert gpt.matmul_flops(cfg) == 3 * (2 * fwd_layer + 2 * b * t * d * v) == 3 * (2 * 27_262_976 + 8_388_608) == 188_743_680


@pytest.mark.parametrize("size", ["tiny", "125m"])
def test_gpt_matmul_flops_match_jaxpr(size):
    step, args = zoo.build("gpt", size, abstract=True)
    counted = _dot_flops(jax.make_jaxpr(step)(*args).jaxpr)
    expected = gpt.matmul_flops(zoo.config("gpt", size))
    assert counted == pytest.approx(expected, rel=1e-3)


def test_gpt_matmul_flops_bound_xla_cost():
    step, args = zoo.build("gpt", "tiny", abstract=True)
    xla = jax.jit(step).lower(*args).compile().cost_analysis()["flops"]
    mm = gpt.matmul_flops(zoo.config("gpt", "tiny"))
    assert mm <= xla <= 1.5 * mm


def test_batch_size_override():
    _, (_, _, batch) = zoo.build("gpt", "125m", abstract=True, batch_size=32)
    assert batch["inputs"].shape == (32, 1024)
    with pytest.raises(ValueError, match="batch_size"):
        zoo.build("mlp", "tiny", batch_size=0)
    with pytest.raises(ValueError, match="seed"):
        zoo.build("mlp", "tiny", seed="0")


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="valid names: .*gpt"):
        zoo.build("resnet", "tiny")
    with pytest.raises(ValueError, match="valid names"):
        zoo.sizes("resnet")
    with pytest.raises(ValueError, match="valid sizes: tiny, 125m, 350m, 1.3b, 7b"):
        zoo.config("gpt", "huge")
    assert zoo.sizes("gpt")[0] == "tiny"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit", "fno", "unet", "meshgraphnet", "mlp"])
def test_larger_sizes_step_traces(name):
    for size in zoo.sizes(name)[1:]:
        step, args = zoo.build(name, size, abstract=True)
        new_params, new_opt_state, loss = jax.eval_shape(step, *args)
        assert loss.shape == () and jax.tree.structure(new_params) == jax.tree.structure(args[0])


def test_fno_spectral_conv_keeps_only_low_modes():
    """A Fourier mode above `modes` is filtered out exactly; one inside passes (times the weights)."""
    from zoo.fno import SpectralConv2d

    n, m = 16, 4
    layer = SpectralConv2d(features=2, modes=m)
    yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    wave = lambda ky, kx: np.cos(2 * np.pi * (ky * yy + kx * xx) / n)[None, :, :, None].astype(np.float32)
    params = jax.jit(layer.init)(jax.random.PRNGKey(0), wave(1, 1))
    apply = jax.jit(layer.apply)
    high = apply(params, wave(m + 1, 2))  # first-axis frequency m+1 and n-(m+1) both dropped
    low = apply(params, wave(1, 2))
    assert np.abs(high).max() < 1e-5
    assert np.abs(low).max() > 1e-3
    # a real mode (ky, kx) comes back as a cosine at the same frequency: project on it by hand
    w = np.asarray(params["params"]["w_real"][0, 1, 2, 0] + 1j * params["params"]["w_imag"][0, 1, 2, 0])
    phase = 2 * np.pi * (yy + 2 * xx) / n
    expected = (w[None, None, :] * np.exp(1j * phase)[..., None]).real  # Re(w e^{i phase})
    np.testing.assert_allclose(np.asarray(low[0]), expected, atol=1e-5)


def test_meshgraphnet_graph_structure():
    from zoo import meshgraphnet

    cfg = zoo.config("meshgraphnet", "tiny")
    step, (_, _, batch) = zoo.build("meshgraphnet", "tiny", abstract=True, batch_size=2)
    assert batch["nodes"].shape == (2 * cfg.n_nodes, cfg.node_in)
    assert batch["senders"].shape == batch["receivers"].shape == (2 * cfg.n_edges,)
    assert batch["senders"].dtype == jnp.int32
    concrete = jax.jit(lambda key: meshgraphnet.make_batch(dataclasses.replace(cfg, batch=2), key))(jax.random.PRNGKey(1))
    s, r = np.asarray(concrete["senders"]), np.asarray(concrete["receivers"])
    k = cfg.n_edges // cfg.n_nodes
    assert np.all(np.bincount(r, minlength=2 * cfg.n_nodes) == k)  # every node receives k edges
    assert np.all(s != r)  # no self-loops
    assert np.all((s < cfg.n_nodes) == (r < cfg.n_nodes))  # disjoint union: no edge crosses graphs


def test_unet_and_vit_shapes():
    for name, key, shape in [("unet", "clean", (8, 32, 32, 3)), ("vit", "images", (8, 32, 32, 3))]:
        spec = __import__(f"zoo.{name}", fromlist=["model"])
        cfg = zoo.config(name, "tiny")
        _, (params, _, batch) = zoo.build(name, "tiny", abstract=True)
        assert batch[key].shape == shape
        out = jax.eval_shape(lambda p, b: spec.model(cfg).apply({"params": p}, b), params, batch)
        assert out.shape == (shape if name == "unet" else (8, cfg.n_classes))
