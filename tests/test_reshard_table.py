"""Resharding measured from XLA: a few probes by hand (DESIGN.md's facts on the 2x4 CPU mesh), the
cost model pricing from a table of them and agreeing with XLA's compiled program on another shape,
the fallback to the hand rules counted and reported, and HLO replica groups read in every form."""
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from test_builder import hand_graph  # noqa: E402

from costmodel import reshard_table
from costmodel.builder import build_problem
from costmodel.cluster import Cluster
from costmodel.cost import Mesh as CostMesh
from costmodel.cost import clear_reshard_cache, reshard, reshard_rules
from runtime import reshard_probe
from runtime.hlo import mesh_axes, parse_collectives, replica_groups

S01RR, RRS01 = ((0, 1), (), ()), ((), (), (0, 1))
S1RR, RRS0 = ((1,), (), ()), ((), (), (0,))


def named(spec):
    return tuple(tuple("xy"[a] for a in e) for e in spec)


@pytest.fixture(scope="module")
def jmesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a0", "a1"), axis_types=(AxisType.Auto,) * 2)


@pytest.fixture(scope="module")
def probed(jmesh):
    return reshard_probe.build_here((2, 4), None, [(S01RR, RRS01), (S1RR, RRS0)])


@pytest.fixture
def only_table(tmp_path, monkeypatch, probed):
    """The cost model sees exactly the probed table (no shipped one, a fresh user cache)."""
    monkeypatch.setattr(reshard_table, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setenv("SHARDGYM_CACHE_DIR", str(tmp_path / "cache"))
    reshard_table.write(reshard_table.table_paths((2, 4))[1], (2, 4), probed)
    clear_reshard_cache()
    yield
    clear_reshard_cache()


def test_spec_enumeration_counts():
    # 2x4: each of the 2 axes unused or on one of r dims, both on one dim in 2 orders
    assert [len(reshard_probe.all_specs((2, 4), r)) for r in (1, 2, 3, 4)] == [5, 11, 19, 29]
    assert len(reshard_probe.all_specs((1, 8), 2)) == 3  # a size-1 axis shards nothing
    assert reshard_probe.name_of(S01RR) == "S01RR"


def test_probes_match_the_measured_facts(probed):
    a = probed["S01RR>RRS01"]  # one all-to-all over both axes of 1/8 the tensor: sends 7/64
    assert [(k, ax) for k, ax, *_ in a.collectives] == [("all-to-all", (0, 1))]
    assert a.collectives[0][2] == pytest.approx(1 / 8) and a.sent_frac == pytest.approx(7 / 64)
    assert not a.remat and a.stable
    b = probed["S1RR>RRS0"]  # full rematerialisation: all-gather over y to the whole tensor, then slice
    assert [(k, ax) for k, ax, *_ in b.collectives] == [("all-gather", (1,))]
    assert b.remat and b.sent_frac == pytest.approx(3 / 4) and b.temp_frac == pytest.approx(1.0, abs=0.01)
    assert b.stable


def test_reshard_prices_from_the_table_and_agrees_with_xla(only_table, jmesh):
    """f32[8,32,64] (not a probe shape): reshard()'s bytes are XLA's wire bytes for that program."""
    mesh = CostMesh(Cluster.preset("cpu-2x4"))
    shape, whole = (8, 32, 64), 4.0 * 8 * 32 * 64
    for src, dst in ((S01RR, RRS01), (S1RR, RRS0)):
        colls, _ = reshard_probe.measure(jmesh, src, dst, shape)
        xla_sent = sum(w * n for _, _, _, w, n in colls) * whole
        t, sent = reshard(shape, 4, named(src), named(dst), mesh)
        assert sent == pytest.approx(xla_sent) and t > 0
    # the hand rules priced S01RR -> RRS01 as a full rematerialisation (57 KB): the table fixes that
    assert reshard((8, 32, 64), 4, named(S01RR), named(RRS01), mesh)[1] == pytest.approx(7 * 1024)
    assert reshard_rules((8, 32, 64), 4, named(S01RR), named(RRS01), mesh)[1] > 7 * 1024
    # one all-to-all over (x, y) on the 8 KB local piece: collective()'s hierarchical α-β time
    t, _ = reshard(shape, 4, named(S01RR), named(RRS01), mesh)
    lat = 20e-6 + 3 * 10e-6
    assert lat < t < lat + 7 * 1024 / 5e9 + 1e-12
    # a pair no table holds falls back to the rules
    S0R, RR = (("x",), ()), ((), ())
    assert reshard((8, 32), 4, S0R, RR, mesh) == reshard_rules((8, 32), 4, S0R, RR, mesh)


def test_fallback_is_counted_and_reported(only_table):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = build_problem(hand_graph(), Cluster.preset("cpu-2x4"))
    st = p.meta.reshard_stats
    assert st["fallback_pairs"] > 0 and st["measured_pairs"] == 0  # the hand graph is rank 2 only
    assert any("partly priced by the hand rules" in str(x.message) for x in w)


def test_replica_group_forms():
    assert replica_groups("replica_groups={{0,1,2,3},{4,5,6,7}}").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), x").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert replica_groups("replica_groups=mesh['a'=2,'b'=4] {'b'}").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Shardy's own mesh of the sharding, with a device order: axis_0 (4) runs over y of the 2x4 mesh
    g = replica_groups("replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}")
    assert g.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a sub-axis: the minor 2 of axis_0 (size 4)
    g = replica_groups("replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}")
    assert g.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert replica_groups("replica_groups={}", num_devices=4).tolist() == [[0, 1, 2, 3]]


def test_mesh_axes_of_compiled_collectives(jmesh):
    """An all-gather over y and a permute swapping the device order of a dim, read off real HLO."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    for src, dst, kind, axes in ((P("a1"), P(), "all-gather", (1,)),
                                 (P(("a0", "a1")), P(("a1", "a0")), "collective-permute", (0, 1))):
        f = jax.jit(lambda x: x, in_shardings=NamedSharding(jmesh, src), out_shardings=NamedSharding(jmesh, dst))
        text = f.lower(jax.ShapeDtypeStruct((16, 8), np.float32)).compile().as_text()
        (c,) = parse_collectives(text, num_devices=8)
        assert c.kind == kind and mesh_axes(c, (2, 4)) == axes
