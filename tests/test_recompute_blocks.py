"""The ``"blocks"`` recompute policy (costmodel/trace/recompute.py): a block's output is saved, everything
inside a block is recomputed in the backward pass, its matmuls included (FLOPs by hand), and the
executor replays the rewritten program with the unsharded step's numbers."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardgym as sg
from costmodel.trace.recompute import block_depth
from runtime.core import execute

_N, _D, _K = 16, 8, 4


def _two_block_step():
    """value_and_grad of sum(sin(sin(x @ w1) @ w2)), each sin(. @ .) in its own named scope."""
    def loss(w1, w2, x):
        with jax.named_scope("b0"):
            h = jnp.sin(x @ w1)
        with jax.named_scope("b1"):
            o = jnp.sin(h @ w2)
        return jnp.sum(o)

    args = (jax.ShapeDtypeStruct((_D, _D), jnp.float32), jax.ShapeDtypeStruct((_D, _K), jnp.float32),
            jax.ShapeDtypeStruct((_N, _D), jnp.float32))
    return jax.value_and_grad(loss, argnums=(0, 1)), args


def test_block_depth_is_the_first_depth_with_two_scopes():
    assert block_depth(["M/b0/q", "M/b1/q", "M/ln_f", ""]) == 2
    assert block_depth(["b0", "b1/attn"]) == 1
    assert block_depth(["M/only", "M/only/x", ""]) == 0   # one block at every depth: nothing crosses


def test_blocks_recomputes_each_block_matmul_from_the_saved_block_input():
    """Forward: h = sin(x @ w1) in b0, o = sin(h @ w2) in b1; JAX's linearisation computes cos(x @ w1)
    and cos(h @ w2) in the forward for the backward. h crosses from b0 to b1, so it is saved; the
    two cosines are recomputed from their matmuls, which are recomputed too (not saved: read inside
    their block only): 2*N*D*D + 2*N*D*K more dot FLOPs. Under "dots" the matmuls are saved and h is
    recomputed (it is read by dw2 = h^T g and lies inside b0)."""
    step, args = _two_block_step()
    plain = sg.trace(step, *args, fold=False)
    blocks = sg.trace(step, *args, fold=False, recompute="blocks")
    assert blocks.recompute == "blocks"
    assert sorted(n.primitive for n in blocks.nodes if n.params.get("recomputed")) == \
        ["cos", "cos", "dot_general", "dot_general"]
    extra = blocks.flops_by_primitive()["dot_general"] - plain.flops_by_primitive()["dot_general"]
    assert extra == 2 * _N * _D * _D + 2 * _N * _D * _K
    dots = sg.trace(step, *args, fold=False, recompute="dots")
    assert sorted(n.primitive for n in dots.nodes if n.params.get("recomputed")) == ["cos", "cos", "sin"]


def test_blocks_step_runs_sharded_with_the_unsharded_numbers():
    step, shapes = _two_block_step()
    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal(s.shape), jnp.float32) for s in shapes)
    graph = sg.trace(step, *args, recompute="blocks")
    problem = sg.build_problem(graph, "cpu-2x4")
    r = execute(step, args, graph, sg.solve(problem, method="dp"), problem=problem, iters=1, warmup=0)
    assert r.max_rel_err < 1e-5 and r.loss_rel_err < 1e-6, (r.max_rel_err, r.loss_rel_err)


def test_step_time_floor_by_hand_and_choose_skips_a_program_below_it():
    """Two nodes (1 or 3 s; 2 or 0.5 s) and an edge costing 0.25 s unless both take strategy 0 or both 1:
    each node's cheapest (1 + 0.5) plus the edge's cheapest entry (0) is 1.5 s, below every plan
    (brute force: 1.75 s). ``choose`` under a bound below a program's floor does not solve it (its row
    gives the floor as its step time)."""
    from costmodel.problem import Problem, evaluate
    from shardgym.recompute import choose
    from solvers.ilp.bounds import step_time_floor

    p = Problem.from_lists("floor", [[1.0, 3.0], [2.0, 0.5]], [[1.0, 1.0]] * 2, [[0, 2]] * 2, [[0, 1]],
                           [[0.0, 0.25, 0.25, 0.0]])
    assert step_time_floor(p) == 1.5
    assert min(evaluate(p, [a, b]).step_time_s for a in (0, 1) for b in (0, 1)) == 1.75
    step, args = _two_block_step()
    floor = step_time_floor(sg.build_problem(sg.trace(step, *args, recompute="blocks"), "cpu-2x4"))
    with pytest.raises(ValueError, match=f"blocks: {floor:.4g} s"):   # not solved: its floor is the row's time
        choose(step, args, "cpu-2x4", max_step_time_s=floor / 2, time_limit_s=60, policies=("blocks",))
