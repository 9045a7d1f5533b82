"""Edge memory: resharded copies shared per (value, layout), priced the same by evaluate, the ILP,
local search and the environment; checked by hand on a 4-node problem. Also which values XLA keeps
as buffers (costmodel.memory) on tiny traced steps."""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardgym as sg
from costmodel.edge_memory import CopyGroups
from costmodel.memory import materialised_outputs, materialising, outer_product
from costmodel.problem import Problem, evaluate
from solvers.ilp import solve_ilp
from solvers.local import LocalCosts

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402


def _problem(usage_limit=None, copies=True, early=True):
    """Producer 0 (strategies A, B) feeds consumers 1 (step 1), 2 (step 3) and 3 (step 5), each
    with strategies A, B. Node usages: 0 holds 4 bytes over [0, 6); the consumers hold 1 byte
    over their step. Reading layout B from a producer in A needs a copy of 10 bytes: made by a
    collective (``early``), it is shared by every consumer reading B and lives from the
    producer's step 0 to the last of them; otherwise (a slice) each reader holds it at its step.
    Time: A is slower for the consumers (cost 1 vs 0), so the fastest plan reads B everywhere
    from a producer in A (cost 0 for the producer's A, 5 for B)."""
    costs = [[0.0, 5.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    usages = [[4.0, 4.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    intervals = [[0, 6], [1, 2], [3, 4], [5, 6]]
    edges = [[0, 1], [0, 2], [0, 3]]
    ecosts = [[0.0, 0.0, 0.0, 0.0]] * 3
    em = None
    if copies:
        want_b, free_if_b = [False, True], [False, True]
        em = CopyGroups.from_lists([(0, 10.0, [(1, 1, want_b, free_if_b), (2, 3, want_b, free_if_b),
                                               (3, 5, want_b, free_if_b)], 0, [early, False])])
    return Problem.from_lists("copies", costs, usages, intervals, edges, ecosts, usage_limit=usage_limit,
                              edge_memory=em)


def usage_at(p, s, t):
    from costmodel.problem import usage_profile
    flat = p.strategy_offsets[:-1] + np.asarray(s)
    ts, live = usage_profile(p, p.node_usages[flat], extra=p.edge_memory.intervals(np.asarray(s)))
    return float(live[np.searchsorted(ts, t, side="right") - 1])


def test_evaluate_prices_a_shared_copy_from_producer_to_last_reader():
    p = _problem()
    # all read B from A: one copy of 10 over [0, 6): peak 4 + 10 + 1
    assert evaluate(p, [0, 1, 1, 1]).peak_memory_bytes == 15.0
    # only the first and the last read B: still one copy, live across step 3 where nobody reads it
    assert evaluate(p, [0, 1, 0, 1]).peak_memory_bytes == 15.0 and usage_at(p, [0, 1, 0, 1], 3) == 15.0
    # only consumer 1 reads B: the copy lives [0, 2), gone at step 3
    assert usage_at(p, [0, 1, 0, 0], 0) == 14.0 and usage_at(p, [0, 1, 0, 0], 3) == 5.0
    # the producer stores B: no copy
    assert evaluate(p, [1, 1, 1, 1]).peak_memory_bytes == 5.0
    assert evaluate(p, [0, 0, 0, 0]).peak_memory_bytes == 5.0
    # without edge memory the same plan prices as before
    assert evaluate(_problem(copies=False), [0, 1, 1, 1]).peak_memory_bytes == 5.0


def test_a_slice_copy_is_held_at_each_readers_step_only():
    p = _problem(early=False)
    assert evaluate(p, [0, 1, 0, 1]).peak_memory_bytes == 15.0
    assert usage_at(p, [0, 1, 0, 1], 0) == 4.0 and usage_at(p, [0, 1, 0, 1], 3) == 5.0
    assert usage_at(p, [0, 1, 0, 1], 5) == 15.0


def test_iopddl_round_trip_keeps_the_copies(tmp_path):
    p = _problem()
    path = tmp_path / "p.json"
    p.to_iopddl(str(path))
    q = Problem.from_iopddl(str(path))
    for s in ([0, 1, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]):
        assert evaluate(q, s).peak_memory_bytes == evaluate(p, s).peak_memory_bytes


def test_bad_copy_groups_name_the_group():
    em = CopyGroups.from_lists([(0, 10.0, [(1, 1, [True, False, True], [False, True])])])
    with pytest.raises(ValueError, match="copy group 0 member 0 has 3 want flags"):
        Problem.from_lists("bad", [[0.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], [[0, 2], [1, 2]],
                           [[0, 1]], [[0.0] * 4], edge_memory=em)


@pytest.mark.parametrize("reduce", [True, False])
def test_ilp_sees_the_copies(reduce):
    p = _problem()
    # min time: producer A, consumers B (cost 0), paying the copy: peak 15
    plan, info = solve_ilp(p, objective="time", reduce=reduce)
    assert plan == [0, 1, 1, 1] and evaluate(p, plan).peak_memory_bytes == 15.0
    # under a cap of 14 the copy cannot be live: the producer stores B (cost 5) or the consumers
    # read A (cost 3): the latter is cheaper
    plan, info = solve_ilp(p, objective="time", memory_cap_bytes=14.0, reduce=reduce)
    assert plan == [0, 0, 0, 0] and info.status == "optimal"
    # min memory: peak 5 (no copy), then the least time at that peak (3 < 5)
    plan, info = solve_ilp(p, objective="memory", reduce=reduce)
    assert evaluate(p, plan).peak_memory_bytes == 5.0 and evaluate(p, plan).total == 3.0
    assert info.status == "optimal"
    # min memory within step time 2: at most one consumer reads A; any copy adds 10: the producer
    # stores B (cost 5 > 2) is too slow, so the best is one copy: peak 15
    plan, info = solve_ilp(p, objective="memory", max_step_time_s=2.0, reduce=reduce)
    assert evaluate(p, plan).total <= 2.0 and evaluate(p, plan).peak_memory_bytes == 15.0


def test_local_search_profile_and_env_price_the_copies():
    p = _problem()
    g = LocalCosts(p)
    for s in ([0, 1, 0, 1], [0, 0, 1, 0], [1, 1, 1, 1]):
        assert g.profile(np.array(s)).max() == evaluate(p, s).peak_memory_bytes

    from env.sharding_env import ShardingEnv
    env = ShardingEnv(workloads=p, weights={"time": 0.0, "memory": 1.0}, skip_trivial=False)
    for plan in ([0, 1, 0, 1], [0, 0, 1, 0], [1, 1, 1, 1]):
        _, info = env.reset(options={"problem": p})
        total, done = 0.0, False
        while not done:
            _, r, done, _, info = env.step(plan[int(env._cur)])
            total += r
        assert info["cost"].peak_memory_bytes == evaluate(p, plan).peak_memory_bytes
        assert total == pytest.approx(-info["normalized_objective"], rel=1e-12, abs=1e-12)


def _with_random_copies(rng, p: Problem) -> Problem:
    """``p`` plus random copy groups: a producer node, 1-3 consumer members at random steps with
    random want / free flags, random integral bytes."""
    from dataclasses import replace
    k = p.num_strategies
    groups = []
    for _ in range(int(rng.integers(1, 4))):
        u = int(rng.integers(p.num_nodes))
        members = []
        for _ in range(int(rng.integers(1, 4))):
            v = int(rng.integers(p.num_nodes))
            members.append((v, int(rng.integers(0, 8)), rng.random(int(k[v])) < 0.5, rng.random(int(k[u])) < 0.3))
        early = () if rng.random() < 0.5 else (int(rng.integers(0, 4)), rng.random(int(k[u])) < 0.5)
        groups.append((u, float(rng.integers(1, 30)), members, *early))
    return replace(p, edge_memory=CopyGroups.from_lists(groups))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6), objective=st.sampled_from(["time", "memory"]),
       bounded=st.booleans())
def test_ilp_with_copies_matches_brute_force(seed, n, objective, bounded):
    """The ILP (reductions, tightening, copy columns) against enumeration priced by evaluate."""
    rng = np.random.default_rng(seed)
    p = _with_random_copies(rng, random_problem(rng, n, kmax=3, limit_q=None))
    plans = [[int(rng.integers(kk)) for kk in p.num_strategies] for _ in range(6)]
    cs = [evaluate(p, s) for s in plans]
    # integral data: 0.5 stands for a bound of 0, which costmodel.limits.Limits rejects
    cap = max(float(sorted(c.peak_memory_bytes for c in cs)[3]), 0.5)
    max_time = max(float(sorted(c.total for c in cs)[3]), 0.5) if bounded else None
    kw = {"memory_cap_bytes": cap} if objective == "time" else {"max_step_time_s": max_time}
    best, bc = brute_force(p, objective, cap=kw.get("memory_cap_bytes"), max_time=kw.get("max_step_time_s"))
    plan, info = solve_ilp(p, objective=objective, time_limit_s=20, **kw)
    c = evaluate(p, plan)
    assert info.status == "optimal"
    if objective == "time":
        assert c.peak_memory_bytes <= cap and c.total == pytest.approx(bc.total)
    else:
        assert c.peak_memory_bytes == pytest.approx(bc.peak_memory_bytes)
        assert c.total == pytest.approx(bc.total)


def test_a_shared_collective_is_one_collective_in_comm_bytes():
    """Two readers of one gathered copy: the edges each carry the 8 bytes sent, evaluate's
    comm_bytes counts the collective once (as XLA runs it)."""
    em = CopyGroups.from_lists([(0, 10.0, [(1, 1, [False, True], [False, True]), (2, 3, [False, True], [False, True])],
                                 0, [True, False], [8.0, 0.0])])
    ecomm = [[0.0, 8.0, 0.0, 0.0]] * 2
    p = Problem.from_lists("comm", [[0.0, 0.0]] * 3, [[1.0, 1.0]] * 3, [[0, 4], [1, 2], [3, 4]], [[0, 1], [0, 2]],
                           [[0.0] * 4] * 2, edge_comm_bytes=ecomm, edge_memory=em)
    assert evaluate(p, [0, 1, 1]).comm_bytes == 8.0
    assert evaluate(p, [0, 1, 0]).comm_bytes == 8.0
    assert evaluate(p, [0, 0, 0]).comm_bytes == 0.0


def _kept_by_primitive(fn, *shapes):
    """(graph, {primitive: kept outputs of its first node}) of fn traced at f32 ``shapes``."""
    g = sg.trace(fn, *(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
    plain = {(src, oi) for src, oi in g.outputs if src >= 0}
    kept, _ = materialised_outputs(g, plain)
    first: dict = {}
    for nd in g.nodes:
        first.setdefault(nd.primitive, (nd, kept[nd.id]))
    return g, first


def test_head_result_is_kept_only_where_a_consumer_recomputes_the_chain():
    """XLA's fusion boundaries, as read from its optimised HLO (costmodel.memory): a dot + bias
    read only as the biased value frees the dot's result after the bias fusion; a dot whose
    pre-activation a later element-wise consumer reads keeps it; an outer product (contracting
    size 1) is a fused broadcast multiply; a pad read by x ** 2 is written out."""
    # (x @ w + b) read only by the next dot: the bias add's output is the one buffer
    _, k = _kept_by_primitive(lambda x, w, b, v: (x @ w + b) @ v, (8, 4), (4, 4), (4,), (4, 2))
    nd, kept = k["dot_general"]
    assert nd.folded == ("add",) and kept == [0]
    # gelu(x @ w): its derivative in the backward pass reads the pre-activation, recomputed
    # there from the dot's result, which XLA keeps (-1)
    step = jax.grad(lambda w, x, v: jnp.sum(jax.nn.gelu(x @ w, approximate=True) @ v))
    _, k = _kept_by_primitive(step, (4, 4), (8, 4), (4, 2))
    nd, kept = k["dot_general"]
    assert "tanh" in nd.folded and -1 in kept
    # an outer product is element-wise: no buffer, its operands fuse into the reader
    g, k = _kept_by_primitive(lambda a, b, m: m * 0.9 + a @ b, (8, 1), (1, 8), (8, 8))
    nd, kept = k["dot_general"]
    assert outer_product(nd) and not materialising(nd) and kept == []
    # a pad read by x ** 2 is written out; read once, it is fused
    pw = ((2, 0), (0, 0))
    _, k = _kept_by_primitive(lambda a, c, m: m + (jnp.pad(a, pw) + jnp.pad(c, pw)) ** 2, (6, 8), (6, 8), (8, 8))
    assert k["pad"][0].folded == () and k["pad"][1] == [0]
    _, k = _kept_by_primitive(lambda a, c, m: m + (jnp.pad(a, pw) + jnp.pad(c, pw)), (6, 8), (6, 8), (8, 8))
    assert k["pad"][0].folded == () and k["pad"][1] == []


def test_a_node_feeding_only_aliased_outputs_holds_its_transients_at_its_step():
    """A weight-gradient conv whose folded SGD update writes the new (aliased) param: the
    update itself is not charged (it replaces the donated param), but the conv's own result,
    which the folded chain reads, is live at the conv's step (builder: [order, order + 1))."""
    def step(w, x):
        def loss(w_):
            return jnp.mean(jax.lax.conv_general_dilated(x, w_, (1, 1), "SAME",
                                                         dimension_numbers=("NHWC", "HWIO", "NHWC")) ** 2)
        return w - 0.1 * jax.grad(loss)(w), x
    args = (jnp.ones((3, 3, 4, 8)), jnp.ones((2, 8, 8, 4)))
    g = sg.trace(step, *args)
    p = sg.build_problem(g, "cpu-2x4")
    plan = sg.solve(p, method="replicated")
    out = {src for src, _ in g.outputs}
    wgrad = [nd for nd in g.nodes if nd.primitive == "conv_general_dilated" and nd.id in out]
    assert len(wgrad) == 1 and g.output_aliases[0] is not None
    i = wgrad[0].id
    assert tuple(p.intervals[i]) == (wgrad[0].order, wgrad[0].order + 1)
    u = p.node_usages[p.strategy_offsets[i] + plan.strategies[i]]
    assert u == 3 * 3 * 4 * 8 * 4  # its f32 result, replicated: read by the folded update
    t = int(wgrad[0].order)
    live = [p.node_usages[p.strategy_offsets[j] + plan.strategies[j]] for j in range(p.num_nodes)
            if p.intervals[j, 0] <= t < p.intervals[j, 1]]
    assert sum(live) >= u


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6))
def test_copy_intervals_are_never_negative_and_the_env_tracker_adds_up_to_them(seed, n):
    """Random copy groups (members may precede the producer's step, groups may be empty): every
    interval has start < end, and the environment's CopyTracker, deciding nodes in a random
    order, covers the same bytes at every grid point as ``intervals``; a decision tried and undone
    (``decide(..., log)`` then ``undo(log)``, as bp's copy-aware decode does) before each one changes nothing."""
    from costmodel.edge_memory import CopyTracker
    from costmodel.profile import live_on
    rng = np.random.default_rng(seed)
    p = _with_random_copies(rng, random_problem(rng, n, kmax=3, limit_q=None))
    em = p.edge_memory
    if rng.random() < 0.5:   # a trailing group without members
        em = CopyGroups.from_lists([*((int(u), float(b), [(int(em.member_node[m]), int(em.member_time[m]),
                                     em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]],
                                     em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]])
                                     for m in range(em.member_offsets[g], em.member_offsets[g + 1])], int(em.group_time[g]),
                                     em.group_early[em.early_offsets[g]:em.early_offsets[g + 1]])
                                     for g, (u, b) in enumerate(zip(em.group_node, em.group_bytes))),
                                    (0, 7.0, [], 0, np.ones(int(p.num_strategies[0]), dtype=bool))])
    s = np.array([int(rng.integers(k)) for k in p.num_strategies])
    lo, hi, b = em.intervals(s)
    assert np.all(lo < hi)
    grid = np.unique(np.concatenate([em.time_points(), [0]]))
    tracker = CopyTracker(em, grid, p.num_nodes)
    dec = np.full(p.num_nodes, -1)
    got = np.zeros(len(grid))
    for i in rng.permutation(p.num_nodes):
        log: list = []
        tracker.decide(int(i), int(rng.integers(p.num_strategies[i])), dec, log)
        tracker.undo(log)
        dec[i] = s[i]
        for a, c, by in tracker.decide(int(i), int(s[i]), dec):
            assert a < c
            got[a:c] += by
    np.testing.assert_allclose(got, live_on(grid, lo, hi, b))


def test_cpu_layout_copies_of_gradient_conv_operands():
    """A Flax-layout conv (NHWC, HWIO) reads its operands as they are; its weight-gradient conv
    reads the input as (feature, spatial, batch), which XLA CPU copies in that order: one extra
    early copy of the program input, live from step 0 to the gradient conv, on cpu clusters only."""
    from costmodel.copy_lists import conv_operand_order, layout_copied_reads

    def step(w, x):
        def loss(w):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jnp.sum(jnp.tanh(y))
        return w - 0.1 * jax.grad(loss)(w)

    w, x = jnp.ones((3, 3, 4, 8)), jnp.ones((8, 16, 16, 4))
    g = sg.trace(step, w, x)
    convs = [nd for nd in g.nodes if nd.primitive == "conv_general_dilated"]
    fwd, wgrad = convs[0], convs[-1]
    assert conv_operand_order(fwd, 0) is None and conv_operand_order(fwd, 1) is None
    assert conv_operand_order(wgrad, 0) is not None
    copied = layout_copied_reads(g)
    x_node = next(nd.id for nd in g.nodes if nd.is_input and nd.outputs[0].shape == (8, 16, 16, 4))
    assert any(u == x_node and (wgrad.id, 0) in rs for (u, _, _), rs in copied.items())
    from dataclasses import replace
    cpu = sg.build_problem(g, "cpu-2x4")
    gpu = sg.build_problem(g, replace(sg.Cluster.preset("cpu-2x4"), backend="gpu"))
    groups = (lambda p: sorted(zip(p.edge_memory.group_node.tolist(), p.edge_memory.group_bytes.tolist())))
    extra = list(groups(cpu))
    for grp in groups(gpu):
        extra.remove(grp)
    assert (x_node, float(x.nbytes)) in extra   # replicated strategy: the whole input copied
    s = [0] * cpu.num_nodes       # everything replicated: the copy is live at the gradient conv
    assert evaluate(cpu, s).peak_memory_bytes >= evaluate(gpu, s).peak_memory_bytes + x.nbytes


def test_donated_weight_copies_where_the_gradient_dot_has_no_all_reduce():
    """mlp tiny on cpu-2x4: XLA's buffer assignment copies Dense_1's and Dense_2's kernels under
    the replicated plan (their backward dX dots read them after the update could run; Dense_0's
    input gradient is never formed) and none under dp, where each weight gradient leaves its dot
    through an all-reduce that XLA combines with later layers' gradients."""
    import zoo
    fn, args = zoo.build("mlp", "tiny", seed=0)
    g = sg.trace(fn, *args)
    p = sg.build_problem(g, "cpu-2x4")
    em = p.edge_memory
    g_of = em.member_group

    def copied(plan):
        s = np.asarray(sg.solve(p, method=plan).strategies)
        act = em.active(s)
        out = set()
        for gi in np.unique(g_of[act]):
            ms = np.nonzero(g_of == gi)[0]
            w = int(em.group_node[gi])
            if g.nodes[w].role == "param" and all(g.nodes[int(em.member_node[m])].role == "gradient" and
                                                  g.nodes[int(em.member_node[m])].primitive == "dot_general"
                                                  # at the update's step, or the step before the dot
                                                  # (its result then goes into the weight's free buffer);
                                                  # a dot's layout copy is at the dot's own step
                                                  and em.member_time[m] != g.nodes[int(em.member_node[m])].order
                                                  for m in ms):
                out.add(g.nodes[w].input_path)
        return out

    rep = copied("replicated")
    assert len(rep) == 2 and all("Dense_1" in str(k) or "Dense_2" in str(k) for k in rep), rep
    assert all("kernel" in str(k) for k in rep)
    assert copied("dp") == set()


def test_dot_operand_order_rank4_weight_gradient_only():
    """XLA CPU's DotDecomposer copies a dot operand whose dims are out of (batch, free, contracting)
    / (batch, contracting, free) order when the operand has several contracting or free dims (a
    dense layer's weight gradient on a rank-4 input); a 2-D transpose folds into the dot (no copy).
    The copy is made at the dot's step, so the read keeps the producer's buffer alive."""
    from costmodel.copy_lists import dot_operand_order, layout_copied_reads

    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.einsum("bhwc,cd->bhwd", x, w))))(w)

    g4 = sg.trace(step, jnp.ones((4, 8)), jnp.ones((2, 4, 4, 4)))
    dots = [nd for nd in g4.nodes if nd.primitive == "dot_general"]
    assert dot_operand_order(dots[0], 0) is None and dot_operand_order(dots[0], 1) is None   # forward
    assert any(dot_operand_order(d, k) is not None for d in dots[1:] for k in (0, 1))    # weight gradient
    assert all(nd.primitive == "dot_general" for (u, _, _), rs in layout_copied_reads(g4).items()
               for v, _ in rs for nd in [g4.nodes[v]])
    g2 = sg.trace(lambda w, x: w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w), jnp.ones((4, 8)), jnp.ones((32, 4)))
    assert all(dot_operand_order(nd, k) is None for nd in g2.nodes if nd.primitive == "dot_general" for k in (0, 1))


def test_weights_read_through_a_slice_are_copied_only_for_a_sharded_reader():
    """FNO tiny at batch 1: the spectral weights are read as complex(w_real, w_imag) sliced to the
    kept modes. XLA's buffer assignment copies all four (131,072 B each) where a reader takes the
    sliced value sharded (the distributed-FFT plan of test_dist_fft, fno tiny ilp-time / policy)
    and none under the replicated plan."""
    import zoo
    fn, args = zoo.build("fno", "tiny", batch_size=1)
    g = sg.trace(fn, *args)
    p = sg.build_problem(g, "cpu-2x4")
    em, s = p.edge_memory, np.asarray(sg.solve(p, method="replicated").strategies)
    spectral = [nd.id for nd in g.nodes if nd.is_input and nd.role == "param" and "spectral" in str(nd.input_path)]
    assert len(spectral) == 4
    mine = [gi for gi in range(em.num_groups) if em.group_node[gi] in spectral and em.group_bytes[gi] == 131072
            and all(em.member_time[m] > g.nodes[int(em.member_node[m])].order      # held to the update
                    for m in range(em.member_offsets[gi], em.member_offsets[gi + 1]))]
    assert {int(em.group_node[gi]) for gi in mine} == set(spectral)
    act = em.active(s)
    assert not any(act[em.member_offsets[gi]:em.member_offsets[gi + 1]].any() for gi in mine)
    gi = mine[0]  # one member switched to a strategy reading its operand sharded turns the copy on
    m = int(em.member_offsets[gi])
    v, want = int(em.member_node[m]), em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
    s2 = s.copy()
    s2[v] = int(np.argmax(want))
    assert want.any() and em.active(s2)[m]


@pytest.mark.parametrize("seed", range(10))
def test_restrict_keeps_each_members_entries_of_the_kept_strategies(seed):
    """``CopyGroups.restrict`` (vectorised, session 28) against its definition, member by member: each
    member's want flags at its consumer's kept strategies, its free flags at its producer's, each early
    group's flags (and comm bytes) at its producer's."""
    rng = np.random.default_rng(1300 + seed)
    p = _with_random_copies(rng, random_problem(rng, 7, kmax=4, limit_q=None))
    em = p.edge_memory
    keep = [np.sort(rng.choice(int(k), size=int(rng.integers(1, int(k) + 1)), replace=False)) for k in p.num_strategies]
    r = em.restrict(keep)
    g_of = em.member_group
    for m, v in enumerate(em.member_node.tolist()):
        u = int(em.group_node[g_of[m]])
        assert np.array_equal(r.member_want[r.want_offsets[m]:r.want_offsets[m + 1]],
                              em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]][keep[v]])
        assert np.array_equal(r.member_free[r.free_offsets[m]:r.free_offsets[m + 1]],
                              em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]][keep[u]])
    for g, u in enumerate(em.group_node.tolist()):
        a, b = em.early_offsets[g], em.early_offsets[g + 1]
        want = em.group_early[a:b][keep[u]] if b > a else np.zeros(0, dtype=bool)
        assert np.array_equal(r.group_early[r.early_offsets[g]:r.early_offsets[g + 1]], want)
    assert r.member_want.dtype == r.member_free.dtype == r.group_early.dtype == bool
