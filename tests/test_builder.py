"""build_problem: liveness and peak memory on a hand graph, aliasing edges, merged edges, meta,
and every zoo model on every cluster preset."""
import warnings

import numpy as np
import pytest

import zoo
from costmodel.builder import build_problem
from costmodel.cluster import Cluster
from costmodel.graph import Node, OpGraph, Tensor
from costmodel.problem import Plan, evaluate

f32 = "float32"


def hand_graph():
    """x[8,16] (batch), w[16,32] (param) -> h = x@w (order 2) -> loss = sum(h) (order 3);
    new_w = w - w (order 4) aliases w. T = 5."""
    x = Node(0, "input", (), (), (Tensor((8, 16), f32),), role="batch", input_index=0, input_path="[2]['x']")
    w = Node(1, "input", (), (), (Tensor((16, 32), f32),), role="param", input_index=1, input_path="[0]['w']")
    h = Node(2, "dot_general", ((0, 0), (1, 0)), (Tensor((8, 16), f32), Tensor((16, 32), f32)),
             (Tensor((8, 32), f32),), params={"dimension_numbers": [[[1], [0]], [[], []]]},
             flops=2.0 * 8 * 16 * 32, order=2)
    loss = Node(3, "reduce_sum", ((2, 0),), (Tensor((8, 32), f32),), (Tensor((), f32),),
                params={"axes": [0, 1]}, flops=256.0, order=3)
    upd = Node(4, "sub", ((1, 0), (1, 0)), (Tensor((16, 32), f32), Tensor((16, 32), f32)),
               (Tensor((16, 32), f32),), flops=512.0, order=4)
    return OpGraph((x, w, h, loss, upd), outputs=((3, 0), (4, 0)), output_aliases=(None, 1), name="hand")


@pytest.fixture(scope="module")
def cpu():
    return Cluster.preset("cpu-2x4")


def strat(p, i, name):
    return p.meta.strategy_names[i].index(name)


def test_liveness_and_peak_by_hand(cpu):
    p = build_problem(hand_graph(), cpu)
    # inputs [0,5); h until its consumer (order 3) + 1; loss is a program output -> T;
    # new_w aliases w: it lives its own step only, [4, 5), where it charges its transient buffers
    # (none here: the aliased output itself is not charged, below)
    assert p.intervals.tolist() == [[0, 5], [0, 5], [2, 4], [3, 5], [4, 5]]
    rep = [0] * 5
    c = evaluate(p, rep)
    # x 512 + w 2048 + h 1024 + loss 4 at t = 3; the new w adds nothing; every operand is read
    # as stored: no resharded copy (costmodel.edge_memory)
    assert c.peak_memory_bytes == 512 + 2048 + 1024 + 4
    assert p.node_usages[p.node_slice(4)].max() == 0.0
    # redundant bytes of the replicated plan: 7 x (512 + 2048 + 1024 + 4)
    assert c.redundant_memory_bytes == 7 * (512 + 2048 + 1024 + 4)
    # dp-like: x rows over (x,y), w replicated: h = S01R, loss all-reduced over (x,y)
    s = list(rep)
    s[0] = strat(p, 0, "S01R")
    s[2] = strat(p, 2, "S01R = S01R x RR")
    s[3] = strat(p, 3, "R = S01R (all-reduce x,y)")
    c2 = evaluate(p, s)
    # x and w read as stored (S01R, RR): no copy
    assert c2.peak_memory_bytes == 512 / 8 + 2048 + 1024 / 8 + 4
    assert c2.comm_bytes == pytest.approx(2 * 7 / 8 * 4)  # the scalar loss all-reduce only
    assert p.usage_limit == cpu.memory_limit_bytes
    # FSDP-like: w stored S0R (2048 / 2 B: axis x has 2 devices), updated in place sharded, read
    # replicated by h: the all-gathered copy (2048 B) is made at once (a collective: from w's
    # step 0) and lives to its reader h (step 2): at t = 2 x 64 + w 1024 + copy 2048 + h 128
    s3 = list(s)
    s3[1] = strat(p, 1, "S0R")
    s3[4] = strat(p, 4, "S0R = S0R x S0R")
    c3 = evaluate(p, s3)
    assert c3.peak_memory_bytes == 64 + 1024 + 2048 + 128
    assert p.edge_memory.intervals(np.array(s3))[1].tolist() == [3]   # gone at t = 3


def test_alias_edge_and_merged_operands(cpu):
    p = build_problem(hand_graph(), cpu, memory_cap_bytes=1e6)
    assert p.usage_limit == 1e6
    edges = [tuple(e) for e in p.edges]
    assert edges == [(0, 2), (1, 2), (1, 4), (2, 3)]  # (1,4) once although upd reads w twice
    e = edges.index((1, 4))
    M = p.edge_matrix(e)
    w_rep, w_s0 = strat(p, 1, "RR"), strat(p, 1, "S0R")
    u_rep = strat(p, 4, "RR = RR x RR")
    u_s0 = strat(p, 4, "S0R = S0R x S0R")
    ag_x = 0.5 * 2048 / 5e9 + 20e-6  # all-gather of the 2048 B w over x
    assert M[w_rep, u_rep] == 0.0
    assert M[w_s0, u_s0] == 0.0                              # ZeRO-style: update in place, sharded
    assert M[w_s0, u_rep] == pytest.approx(2 * ag_x)         # both operands gathered; write back = slice
    assert M[w_rep, u_s0] == pytest.approx(ag_x)             # slice in, gather back into storage
    ce = p.edge_matrix(e, p.edge_comm_bytes)
    assert ce[w_s0, u_rep] == pytest.approx(2 * 1024)


def test_meta_and_plan_specs(cpu):
    p = build_problem(hand_graph(), cpu)
    m = p.meta
    assert m.mesh_shape == (2, 4) and m.axis_names == ("x", "y") and m.cluster_name == "cpu-2x4"
    assert list(m.graph_node) == list(range(5))
    assert m.primitives[2] == "dot_general" and m.roles[1] == "param"
    assert m.input_index[:2] == [0, 1] and m.input_path[1] == "[0]['w']"
    i = strat(p, 2, "S0R = S0S1 x S1R (all-reduce y)")
    assert m.out_specs[2][i] == ("x", None)
    assert m.operand_specs[2][i] == (("x", "y"), ("y", None))
    s = [0] * 5
    s[1] = strat(p, 1, "S01R")
    plan = Plan.for_problem(p, s)
    assert plan.input_specs[1] == (1, "[0]['w']", (("x", "y"), None))
    for k in range(5):
        assert len(m.strategy_names[k]) == p.num_strategies[k] == len(m.out_specs[k]) == len(m.operand_specs[k])


def test_bad_input(cpu):
    with pytest.raises(ValueError, match="OpGraph"):
        build_problem("not a graph", cpu)
    with pytest.raises(ValueError, match="memory_cap_bytes"):
        build_problem(hand_graph(), cpu, memory_cap_bytes=-1)


@pytest.fixture(scope="module")
def zoo_graphs():
    import shardgym as sg
    graphs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in zoo.names():
            fn, args = zoo.build(name, zoo.sizes(name)[0], abstract=True)
            graphs[name] = sg.trace(fn, *args)
    return graphs


def test_zoo_every_model_every_preset(zoo_graphs):
    for name, g in zoo_graphs.items():
        unique = sum(t.nbytes for n in g.nodes for o, t in enumerate(n.outputs)
                     if not any(src == n.id and oi == o and a is not None and not n.is_input
                                for (src, oi), a in zip(g.outputs, g.output_aliases)))
        for preset in Cluster.presets():
            cl = Cluster.preset(preset)
            p = build_problem(g, cl)
            assert p.num_nodes == len(g.nodes)
            assert p.num_strategies.max() <= 32
            assert np.isfinite(p.node_costs).all() and np.isfinite(p.edge_costs).all()
            assert (p.node_costs >= 0).all() and (p.edge_costs >= 0).all()
            c = evaluate(p, [0] * p.num_nodes)  # strategy 0 = fully replicated
            assert c.comm_bytes == 0.0 and c.edge_cost == 0.0, (name, preset)
            assert c.redundant_memory_bytes == pytest.approx((cl.num_devices - 1) * unique), (name, preset)
            assert c.total == pytest.approx(g.total_flops / (min(cl.device_flops) * cl.efficiency)), (name, preset)


def test_cpu_backend_reduce_scatter_is_all_reduce_and_slice(cpu):
    """h = x @ w with the contraction over y: on XLA CPU a reduce-scatter runs as an all-reduce of
    the whole (8, 32) f32 result (1024 B; ring: 2·3/4·1024 = 1536 B sent) then a slice fused into the
    consumers, so the whole reduced tensor stays live with the output: the same bytes and memory as
    the all-reduce strategy. On a GPU backend it is a real reduce-scatter: 3/4·1024 sent, 256 B out."""
    rs, ar = "S1R = RS1 x S1R (reduce-scatter y)", "RR = RS1 x S1R (all-reduce y)"
    on = {b: build_problem(hand_graph(), cpu.with_(backend=b)) for b in ("cpu", "gpu")}
    assert cpu.backend == "cpu" and Cluster.preset("a100-1x8").backend == "gpu"
    p = on["cpu"]
    i_rs, i_ar = p.node_slice(2).start + strat(p, 2, rs), p.node_slice(2).start + strat(p, 2, ar)
    assert p.node_comm_bytes[i_rs] == p.node_comm_bytes[i_ar] == pytest.approx(1536)
    assert p.node_usages[i_rs] == p.node_usages[i_ar]
    assert p.node_costs[i_rs] == pytest.approx(p.node_costs[i_ar])
    g = on["gpu"]
    assert g.node_comm_bytes[i_rs] == pytest.approx(768)
    assert g.node_usages[i_rs] == pytest.approx(p.node_usages[i_rs] - 1024 + 256)
    with pytest.raises(ValueError, match="backend must be one of"):
        cpu.with_(backend="npu")
