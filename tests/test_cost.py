"""Cost model checked by hand: collectives, compute (padding, slow devices), resharding, memory.

cpu-2x4: axes x (2 devices, 5e9 B/s, 20 µs) and y (4 devices, 10e9 B/s, 10 µs); every device
50e9 FLOP/s at efficiency 0.5 -> 25e9 FLOP/s achieved. y is the fastest axis.
"""
import dataclasses
import math

import numpy as np
import pytest

from costmodel.cluster import Cluster
from costmodel.cost import (
    Mesh,
    collective,
    compute_time,
    local_bytes,
    norm_spec,
    public_spec,
    redundant_bytes,
    reshard,
    reshard_rules,
)
from costmodel.graph import Node, Tensor
from costmodel.strategies import enumerate_strategies

F = 25e9  # achieved FLOP/s on cpu-2x4


@pytest.fixture(scope="module")
def mesh():
    return Mesh(Cluster.preset("cpu-2x4"))


def matmul_node(b=8, k=16, n=32):
    return Node(2, "dot_general", ((0, 0), (1, 0)),
                (Tensor((b, k), "float32"), Tensor((k, n), "float32")), (Tensor((b, n), "float32"),),
                params={"dimension_numbers": [[[1], [0]], [[], []]]}, flops=2.0 * b * k * n, order=2)


def by_name(strategies):
    return {s.name: s for s in strategies}


def own(st, mesh):
    t = compute_time(st.flops, mesh)[0]
    sent = 0.0
    for kind, ax, B in st.collectives:
        dt, ds = collective(kind, ax, B, mesh)
        t += dt
        sent += ds
    return t, sent


def test_specs_round_trip():
    assert norm_spec((None, "x", ("x", "y"))) == ((), ("x",), ("x", "y"))
    assert public_spec(((), ("x",), ("x", "y"))) == (None, "x", ("x", "y"))
    assert norm_spec(None, 2) == ((), ())
    with pytest.raises(ValueError):
        norm_spec(("x", "y", None), 2)


def test_collectives_by_hand(mesh):
    # all-reduce over y of 512 B: 2·3/4·512/1e10 + 2·3·10µs
    t, s = collective("all-reduce", ("y",), 512.0, mesh)
    assert t == pytest.approx(2 * 3 / 4 * 512 / 10e9 + 6 * 10e-6)
    assert s == pytest.approx(768.0)
    # all-gather / reduce-scatter over x of 1024 B: 1/2·1024/5e9 + 20µs
    for kind in ("all-gather", "reduce-scatter"):
        t, s = collective(kind, ("x",), 1024.0, mesh)
        assert t == pytest.approx(0.5 * 1024 / 5e9 + 20e-6)
        assert s == pytest.approx(512.0)
    # all-to-all over y of a 1024 B group tensor: (n-1)/n^2 · B = 3/16 · 1024 = 192 B sent
    t, s = collective("all-to-all", ("y",), 1024.0, mesh)
    assert s == pytest.approx(192.0)
    assert t == pytest.approx(192 / 10e9 + 3 * 10e-6)
    # hierarchical all-reduce over (x, y) of 1024 B = RS_y(1024) + AR_x(256) + AG_y(1024)
    t, s = collective("all-reduce", ("x", "y"), 1024.0, mesh)
    rs_y = 0.75 * 1024 / 10e9 + 3 * 10e-6
    ar_x = 2 * 0.5 * 256 / 5e9 + 2 * 20e-6
    assert t == pytest.approx(2 * rs_y + ar_x)
    assert s == pytest.approx(2 * 768 + 256)  # = 2(8-1)/8 · 1024, the flat ring's bytes
    assert s == pytest.approx(2 * 7 / 8 * 1024)
    assert collective("all-reduce", (), 1024.0, mesh) == (0.0, 0.0)


def test_matmul_strategies_by_hand(mesh):
    """[B=8,K=16] x [16,N=32] f32 = 8192 FLOPs, result 1024 B, on cpu-2x4."""
    st = by_name(enumerate_strategies(matmul_node(), mesh))
    assert len(st) <= 32
    flops = 2 * 8 * 16 * 32
    # (name, compute s, collective s, bytes sent, per-device result bytes, redundant bytes)
    ar_y_512 = 2 * 3 / 4 * 512 / 10e9 + 6 * 10e-6
    rs_y_512 = 3 / 4 * 512 / 10e9 + 3 * 10e-6
    ar_x_1024 = 2 * 1 / 2 * 1024 / 5e9 + 2 * 20e-6
    ar_xy_1024 = 2 * (0.75 * 1024 / 10e9 + 3 * 10e-6) + (2 * 0.5 * 256 / 5e9 + 2 * 20e-6)
    cases = [
        ("RR = RR x RR", flops / F, 0.0, 0.0, 1024, 7 * 1024),
        ("S0R = S0R x RR", flops / 2 / F, 0.0, 0.0, 512, 3 * 1024),          # B over x
        ("S0S1 = S0R x RS1", flops / 8 / F, 0.0, 0.0, 128, 0),              # B over x, N over y
        ("S01R = S01R x RR", flops / 8 / F, 0.0, 0.0, 128, 0),              # B over (x, y)
        ("S0R = S0S1 x S1R (all-reduce y)", flops / 8 / F, ar_y_512, 768, 512, 3 * 1024),
        ("S01R = S0S1 x S1R (reduce-scatter y)", flops / 8 / F, rs_y_512, 384, 128, 0),
        ("RR = RS0 x S0R (all-reduce x)", flops / 2 / F, ar_x_1024, 1024, 1024, 7 * 1024),
        ("RR = RS01 x S01R (all-reduce x,y)", flops / 8 / F, ar_xy_1024, 1792, 1024, 7 * 1024),
    ]
    for name, comp, coll, sent, mem, red in cases:
        s = st[name]
        t, b = own(s, mesh)
        assert compute_time(s.flops, mesh)[0] == pytest.approx(comp), name
        assert t == pytest.approx(comp + coll), name
        assert b == pytest.approx(sent), name
        assert local_bytes((8, 32), 4, s.out_specs[0], mesh) == mem, name
        assert redundant_bytes(1024, s.out_specs[0], mesh) == red, name
    # operand specs follow the iteration dims
    s = st["S0R = S0S1 x S1R (all-reduce y)"]
    assert s.operand_specs == ((("x",), ("y",)), (("y",), ()))
    assert s.out_specs == ((("x",), ()),)


def test_padding_raises_compute_and_memory(mesh):
    """B=6 over y (4 devices): each device holds ceil(6/4) = 2 rows, not 1.5."""
    st = by_name(enumerate_strategies(matmul_node(b=6), mesh))
    s = st["S1R = S1R x RR"]
    flops = 2 * 6 * 16 * 32
    assert s.flops == pytest.approx(flops * 2 / 6)          # padded shard
    assert compute_time(s.flops, mesh)[0] - flops / 4 / F == pytest.approx(flops * (2 / 6 - 1 / 4) / F)
    assert local_bytes((6, 32), 4, s.out_specs[0], mesh) == 2 * 32 * 4
    # a dim smaller than its shard count is never sharded that way
    st2 = by_name(enumerate_strategies(matmul_node(b=2), mesh))
    assert not any(s.out_specs[0][0] and len(s.out_specs[0][0]) and
                   math.prod(mesh.size[a] for a in s.out_specs[0][0]) > 2 for s in st2.values())
    assert "S0R = S0R x RR" in st2 and "S1R = S1R x RR" not in st2


def test_slow_device_sets_compute_time():
    """a100-hetero-2x4: devices 4..7 run at half speed; the SPMD step waits for them."""
    het = Mesh(Cluster.preset("a100-hetero-2x4"))
    uni = Mesh(Cluster.preset("a100-hetero-2x4").with_(device_flops=(156e12,) * 8))
    f = 8192.0
    t_het, imb_het = compute_time(f, het)
    t_uni, imb_uni = compute_time(f, uni)
    assert t_uni == pytest.approx(f / (156e12 * 0.5)) and imb_uni == 0.0
    assert t_het == pytest.approx(2 * t_uni)                      # slowest device: 78e12
    assert imb_het == pytest.approx(f / (78e12 * 0.5) - f / (117e12 * 0.5))  # mean = 117e12


def test_resharding_by_hand(mesh):
    """The hand rules (the fallback for pairs no measured table holds); XLA disagrees on some, below."""
    shape, item = (8, 32), 4  # 1024 B
    S0R, RR, RS0, S01R = (("x",), ()), ((), ()), ((), ("x",)), (("x", "y"), ())
    # slicing is free
    assert reshard_rules(shape, item, RR, S0R, mesh) == (0.0, 0.0)
    assert reshard_rules(shape, item, S0R, S01R, mesh) == (0.0, 0.0)
    # sharded -> replicated: all-gather over x of the whole 1024 B
    t, s = reshard_rules(shape, item, S0R, RR, mesh)
    assert t == pytest.approx(0.5 * 1024 / 5e9 + 20e-6) and s == pytest.approx(512)
    # x moves from dim 0 to dim 1: all-to-all over x; local 512 B, group tensor 1024 B -> 1/4 sent
    t, s = reshard_rules(shape, item, S0R, RS0, mesh)
    assert s == pytest.approx(256) and t == pytest.approx(256 / 5e9 + 20e-6)
    # (x,y) -> replicated: all-gather over x (slowest first) on 256 B, then over y on 1024 B
    t, s = reshard_rules(shape, item, S01R, RR, mesh)
    assert t == pytest.approx(0.5 * 256 / 5e9 + 20e-6 + 0.75 * 1024 / 10e9 + 3 * 10e-6)
    assert s == pytest.approx(128 + 768)
    # y moves dim 0 -> dim 1 while x is gathered: XLA replicates, then slices -> same as S01R -> RR
    assert reshard_rules(shape, item, S01R, ((), ("y",)), mesh) == pytest.approx((t, s))
    # two axes swap dims (S0S1 -> S1S0): replicate (gather x on 256 B: 128 sent; y on 1024 B: 768), slice
    t2, s2 = reshard_rules(shape, item, (("x",), ("y",)), (("y",), ("x",)), mesh)
    assert s2 == pytest.approx(128 + 768) and t2 == pytest.approx(t)
    # XLA (the shipped 2x4 table) agrees on S01R -> RS1 (it replicates), but swaps S0S1 -> S1S0 with an
    # all-to-all over y and a collective-permute: 1/16 + 1/16 of the tensor, not a replication
    assert reshard(shape, item, S01R, ((), ("y",)), mesh)[1] == pytest.approx(128 + 768)
    assert reshard(shape, item, (("x",), ("y",)), (("y",), ("x",)), mesh)[1] == pytest.approx(1024 / 8)


def test_input_layouts_and_unsupported(mesh):
    w = Node(0, "input", (), (), (Tensor((16, 32), "float32"),), role="param", input_index=0, input_path="[0]['w']")
    st = enumerate_strategies(w, mesh)
    names = [s.name for s in st]
    assert names[0] == "RR"
    assert set(names) == {"RR", "S0R", "S1R", "S01R", "RS0", "RS1", "RS01", "S0S1", "S1S0"}
    assert all(s.flops == 0 and s.collectives == () for s in st)
    odd = Node(1, "custom_thing", ((0, 0),), (Tensor((16, 32), "float32"),), (Tensor((16, 32), "float32"),),
               flops=10.0, supported=False, order=1)
    (only,) = enumerate_strategies(odd, mesh)
    assert only.out_specs == (((), ()),) and only.flops == 10.0


def test_fft_runs_replicated_as_xla_does(mesh):
    """XLA all-gathers a sharded FFT operand (even batch-sharded): in Alpa's space (what plain XLA
    runs) one replicated strategy, and the gather is the edge from a batch-sharded producer: S01R ->
    RR of the 4096-B tensor = gather over x on 1024 B (sends 512) then over y on 4096 B (sends 3/4
    of it: 3072). The full space adds the distributed FFTs the runtime runs with shard_map."""
    from costmodel.strategies import ALPA
    x = Node(1, "fft", ((0, 0),), (Tensor((8, 64), "complex64"),), (Tensor((8, 64), "complex64"),),
             params={"fft_type": "FFT", "fft_lengths": [64]}, flops=5.0 * 64 * 6 * 8, order=1)
    st = enumerate_strategies(x, mesh, search=ALPA)
    assert [s.name for s in st] == ["RR = RR"] and st[0].flops == x.flops
    full = by_name(enumerate_strategies(x, mesh))
    assert full["S01R = S01R"].collectives == () and full["S01R = S01R"].flops == x.flops / 8
    _, sent = reshard((8, 64), 8, (("x", "y"), ()), ((), ()), mesh)
    assert sent == pytest.approx(512 + 3072)


def test_fft_whole_dims_cost_all_to_all(mesh):
    from costmodel.space import ALPA
    no_xla = dataclasses.replace(ALPA, xla_fft_replicated=False)   # the all-to-all strategies
    x = Node(1, "fft", ((0, 0),), (Tensor((8, 64), "complex64"),), (Tensor((8, 64), "complex64"),),
             params={"fft_type": "FFT", "fft_lengths": [64]}, flops=5.0 * 64 * 6 * 8, order=1)
    st = by_name(enumerate_strategies(x, mesh, search=no_xla))
    assert st["S0R = S0R"].collectives == ()
    s = st["RS1 = RS1 (all-to-all y) (all-to-all y)"]
    kinds = [c[0] for c in s.collectives]
    assert kinds == ["all-to-all", "all-to-all"]
    # operand local 8·16·8 B = 1024 B, group tensor = 4096 B
    assert s.collectives[0][2] == pytest.approx(4096)


def test_cap_keeps_replicated_first(mesh):
    st = enumerate_strategies(matmul_node(), mesh, max_strategies=5)
    assert len(st) == 5
    assert st[0].name == "RR = RR x RR"
    full = enumerate_strategies(matmul_node(), mesh)
    assert len(full) > 5
    assert np.isfinite([own(s, mesh)[0] for s in st]).all()


def test_reshape_map_follows_major_dims():
    from costmodel.space_rules import reshape_map
    assert reshape_map((8, 32, 64), (8, 32, 4, 16)) == (0, 1, 2, None)   # split: major part follows
    assert reshape_map((8, 32, 64), (256, 64)) == (0, 2)                  # merge: major dim follows
    assert reshape_map((256, 64), (8, 32, 64)) == (0, None, 1)
    assert reshape_map((64,), (1, 1, 64)) == (None, None, 0)


def test_gather_vocab_parallel_all_reduce(mesh):
    """Embedding lookup table[256, 64][ids[8, 32, 1]] -> [8, 32, 64] f32 (65536 B): sharding the
    vocab dim over y is a masked local lookup plus an all-reduce of the result over y."""
    node = Node(2, "gather", ((0, 0), (1, 0)), (Tensor((256, 64), "float32"), Tensor((8, 32, 1), "int32")),
                (Tensor((8, 32, 64), "float32"),),
                params={"dimension_numbers": {"offset_dims": [2], "collapsed_slice_dims": [0], "start_index_map": [0],
                                              "operand_batching_dims": [], "start_indices_batching_dims": []},
                        "slice_sizes": [1, 64]}, order=2)
    st = by_name(enumerate_strategies(node, mesh, max_strategies=200))
    s = st["RRR = S1R x RRR (all-reduce y)"]
    assert s.collectives == (("all-reduce", ("y",), 65536.0),)
    assert st["S0RR = RR x S0RR"].collectives == ()          # batch-sharded ids, replicated table
    assert st["RRS1 = RS1 x RRR"].collectives == ()          # table sharded on the feature dim
