"""build_problem: compile an OpGraph on a Cluster into a Problem (the strategy graph solvers see).

One Problem node per OpGraph node, same order (``meta.graph_node[i] == i``). Per strategy:
- node_costs (s)     = compute time of the padded shard on the slowest device + the node's own
                       collectives (costmodel.cost.compute_time / collective);
- node_imbalance_s   = compute time on the slowest device − at the mean device FLOP/s;
- node_comm_bytes    = bytes per device the node's collectives send as the Cluster's backend runs them
                       (``cost.node_collective``: CPU turns a reduce-scatter into an all-reduce whose
                       whole reduced tensor is charged to node_usages), + for a program output that
                       aliases no input its gather to replicated (the runtime returns it replicated;
                       convae's plans: collective bytes 0.74-0.82x -> 0.93-1.00x of XLA; the gathered
                       output's memory is not charged);
- node_usages        = per-device (padded) bytes of the node's outputs XLA keeps as buffers
                       (``materialised_outputs``: fused element-wise values cost nothing), except
                       outputs that alias a program input (written into the donated buffer), + the
                       gathered copies of input operands read less sharded than they can be stored
                       (``operand_copies``);
- node_redundant     = Σ over all non-aliased outputs of bytes × (replication factor − 1).
Liveness (docs/INTERFACES.md), T = 1 + the largest ``order``: input nodes live [0, T); an op lives
from its ``order`` to 1 + the order of its last consumer, or to T when one of its outputs is a
program output that aliases nothing; an op all of whose uses are aliased program outputs lives its
own step, [order, order + 1): its aliased outputs are not in node_usages (they are written into the
donated buffer), so what it holds there is its transient buffers: the head's own result a folded
chain reads (a weight-gradient conv whose folded update writes the new param), a conv's halo copy,
a collective's extra buffer, gathered operand copies; 0 B for a fused element-wise op (Adam's last
div). An op computed from the donated state alone (``value_origin.state_only``) starts at 0: XLA
computes it before the forward pass. A group's outputs share one interval (their longest, a partly kept
chain's unkept outputs left out: ``slice_layout.buffer_reads``; in XLA's schedule a buffer dying early is a copy group:
``memory.early_buffers``); a transparent node (a bitcast reshape) extends its producer's interval to
its own end, and so does a node that keeps no buffer (``materialised_outputs``: an element-wise node
fused into its consumers): XLA runs a fusion once, at its root, and reads every buffer the fused ops
read there (rnn under lax.scan: the unrolled loop's weight-gradient dots all live to one fused add);
of one read through a collective, its copy (``slice_layout``: ``read_extents``, ``held_read_steps``).
Edges: one per (producer, consumer) pair, the resharding matrices of all operands the consumer
takes from that producer summed (producer strategy = row). An output that aliases input leaf a
must end in a's storage layout: the resharding (producer's out spec -> a's storage spec) is added
to the edge (a's input node, producer), created if absent. Approximation: XLA reshards a value
once per distinct target layout and reuses it for every consumer of that layout (CSE: an FSDP
parameter is all-gathered once for its forward and backward matmuls), while each edge here pays
for its own reshard: collective bytes over-counted where consumers share a layout (FSDP 1.1-1.2x).
usage_limit = min(memory_cap_bytes, cluster.memory_limit_bytes): ``Limits.effective_cap`` (the one
validation of a cap; ``shardgym.solve`` applies a cap the same way, to a Problem built without one).
"""
from __future__ import annotations

import warnings

import numpy as np

from costmodel.cluster import Cluster
from costmodel.combined import with_combined_all_reduces
from costmodel.copy_lists import (
    copy_group_lists,
    donated_copy_lists,
    layout_copied_reads,
    layout_copy_lists,
)
from costmodel.cost import (
    Mesh,
    compute_time,
    local_bytes,
    lowered_kind,
    node_collective,
    public_spec,
    redundant_bytes,
    reshard_coverage,
    reshard_matrix,
)
from costmodel.edge_memory import CopyGroups
from costmodel.graph import OpGraph
from costmodel.limits import Limits
from costmodel.memory import (
    EXPENSIVE,
    MATERIALISING,
    NON_FUSIBLE,
    TRANSPARENT,
    buffer_bytes,
    early_buffer_groups,
    early_buffers,
    in_place_nodes,
    materialised_outputs,
    operand_copies,
)
from costmodel.problem import Problem, ProblemMeta
from costmodel.slice_layout import (
    buffer_reads,
    copied_together,
    copy_source_reads,
    fused_read_groups,
    held_read_steps,
    partly_kept_reads,
    read_extents,
    reader_layout_slices,
    recomputed_reads,
)
from costmodel.strategies import MAX_STRATEGIES, enumerate_strategies, node_key, search_space
from costmodel.value_origin import state_only
from costmodel.ynn_reads import shared_broadcast_lists

__all__ = ["build_problem", "strategies_of", "EXPENSIVE", "MATERIALISING", "NON_FUSIBLE", "TRANSPARENT",
           "materialised_outputs", "operand_copies"]


def build_problem(graph: OpGraph, cluster, memory_cap_bytes: float | None = None,
                  max_strategies: int = MAX_STRATEGIES, space="full", edge_memory: bool = True) -> Problem:
    """Compile ``graph`` on ``cluster`` (a Cluster or a preset name) into a Problem with meta.
    ``space``: "full" (default), "alpa" (batch / feature sharding only: no spatial conv, fft
    replicated) or a ``costmodel.strategies.SearchSpace``. ``edge_memory``: price resharded
    copies as shared copy groups (``costmodel.edge_memory``; default) instead of charging gathered
    input copies to their consumers (``operand_copies``, the pairwise-format approximation)."""
    if isinstance(cluster, str):
        cluster = Cluster.preset(cluster)
    if not isinstance(graph, OpGraph):
        raise ValueError(f"build_problem needs an OpGraph (from shardgym.trace), got {type(graph).__name__}")
    if len(graph.nodes) == 0:
        raise ValueError("build_problem: the OpGraph has no nodes")
    if max_strategies < 1:
        raise ValueError(f"max_strategies must be >= 1, got {max_strategies}")
    limits = Limits.of(memory_cap_bytes)
    search = search_space(space)
    mesh = Mesh(cluster)
    nodes = graph.nodes
    n = len(nodes)
    for i, nd in enumerate(nodes):
        if nd.id != i:
            raise ValueError(f"OpGraph node at position {i} has id {nd.id}; ids must equal positions")

    # ---- strategies (cached across repeated layers) ----
    cache: dict = {}
    strats = []
    for nd in nodes:
        key = node_key(nd, search)
        st = cache.get(key)
        if st is None:
            st = enumerate_strategies(nd, mesh, max_strategies, search)
            cache[key] = st
        strats.append(st)

    # ---- aliasing and program outputs ----
    aliased: set = set()
    plain_out: set = set()
    alias_edges = []  # (input node, producer node, producer output idx)
    input_of_leaf = {nd.input_index: nd.id for nd in nodes if nd.is_input and nd.input_index is not None}
    for k, (src, oi) in enumerate(graph.outputs):
        if src < 0:
            continue
        a = graph.output_aliases[k] if k < len(graph.output_aliases) else None
        if a is not None and not nodes[src].is_input:
            aliased.add((src, oi))
            w = input_of_leaf.get(a)
            if w is not None and w != src:
                alias_edges.append((w, src, oi))
        else:
            plain_out.add((src, oi))

    kept, transparent = materialised_outputs(graph, plain_out)
    late = _read_at_fusion_root(graph, kept, transparent, strats)
    copy_ops = [[] for _ in nodes] if edge_memory else operand_copies(graph, strats, mesh)

    # ---- node arrays ----
    k_arr = np.array([len(s) for s in strats], dtype=np.int64)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(k_arr, out=offs[1:])
    S = int(offs[-1])
    costs = np.zeros(S)
    usages = np.zeros(S)
    redundant = np.zeros(S)
    comm = np.zeros(S)
    imbalance = np.zeros(S)
    node_cache: dict = {}
    for i, nd in enumerate(nodes):
        every = [o for o in range(len(nd.outputs)) if (i, o) not in aliased]
        counted = [o for o in kept[i] if (i, o) not in aliased]
        ck = (id(strats[i]), tuple(counted), tuple(every), tuple((k, b) for k, _, b in copy_ops[i]), i in late)
        got = node_cache.get(ck)
        if got is None:
            rows = []
            for st in strats[i]:
                t, imb = compute_time(st.flops, mesh)
                cb, red = 0.0, 0.0
                mem = float(st.extra_bytes)   # a conv's haloed lhs copy (costmodel.halo)
                for kind, ax, B in st.collectives:
                    dt, ds, extra = node_collective(kind, ax, B, mesh)
                    t += dt
                    cb += ds
                    mem += extra
                    if i in late and lowered_kind(kind, mesh) == "all-reduce":
                        mem += B  # its operand, held until the combined all-reduce runs
                for k, ten, bmin in copy_ops[i]:  # resharded operand copies, live during the step
                    lb = local_bytes(ten.shape, np.dtype(ten.dtype).itemsize, st.operand_specs[k], mesh)
                    if lb > bmin:
                        mem += lb
                mem += sum(buffer_bytes(nd, o, st, mesh) for o in counted)  # o = -1: the head's own result
                for o in every:
                    red += redundant_bytes(nd.outputs[o].nbytes, st.out_specs[o], mesh)
                rows.append((t, mem, red, cb, imb))
            got = np.array(rows, dtype=np.float64).reshape(-1, 5)
            node_cache[ck] = got
        sl = slice(int(offs[i]), int(offs[i + 1]))
        costs[sl], usages[sl], redundant[sl], comm[sl], imbalance[sl] = got.T

    # ---- liveness ----
    T = 1 + max(int(nd.order) for nd in nodes)
    copied = layout_copied_reads(graph) if cluster.backend == "cpu" and edge_memory else {}
    last_use = copy_source_reads(graph, copied)   # -1, or the last dot whose layout copy XLA fuses from it
    together = copied_together(graph, copied, plain_out)  # reads of a layout copy (``copied_together``' docstring)
    via_copy = {r for (u, oi, _), rs in copied.items() for r in rs if graph.nodes[r[0]].primitive != "dot_general"
                or graph.nodes[r[0]].order > together.get((u, oi), np.inf)}
    recomputed = recomputed_reads(graph, kept, transparent, plain_out)   # cheap buffers a fusion recomputes
    buffer_reads(graph, last_use, kept, via_copy, recomputed, partly_kept_reads(graph, kept, transparent)
                 if edge_memory else {})   # the last reader of each kept buffer
    intervals = np.zeros((n, 2), dtype=np.int64)
    to_end = {src for src, _ in plain_out}
    for i, nd in enumerate(nodes):
        if nd.is_input:
            intervals[i] = (0, T)
        else:
            start = int(nd.order)
            end = T if i in to_end else (last_use[i] + 1 if last_use[i] >= 0 else start + 1)
            intervals[i] = (start, max(start, end))
    # fused into their consumers (no buffer): operands and read copies live to their last reader
    fused, through = read_extents(graph, intervals, kept, transparent, recomputed, edge_memory)

    early = early_buffers(graph, [[o for o in kept[i] if (i, o) not in aliased] for i in range(n)], kept, intervals,
                          transparent | fused, plain_out) if edge_memory and graph.schedule == "xla" else []
    intervals[in_place_nodes(graph, kept, transparent, intervals, early), 0] += 1   # written over a dying operand
    intervals[np.nonzero(from_state := state_only(graph, alias_edges))[0], 0] = 0   # before the forward pass
    buffer_groups = early_buffer_groups(graph, strats, mesh, early, intervals, usages, offs)
    # ---- edges ----
    edge_parts: dict = {}
    mat_cache: dict = {}
    covered = [0, 0]  # resharding pairs priced from XLA's measured table / by the fallback rules
    reads = []        # (consumer, operand, producer, output, comm bytes matrix) for the copy groups

    def add(u, v, T_, C_):
        got = edge_parts.get((u, v))
        if got is None:
            edge_parts[(u, v)] = [T_, C_]
        else:
            got[0] = got[0] + T_
            got[1] = got[1] + C_

    def matrix(ten, src, dst, count):
        """(time, comm bytes) resharding matrices of ``ten`` from specs ``src`` to ``dst``, once per
        distinct key; ``count``: a new key adds to ``covered`` (operand edges only)."""
        mk = (ten.shape, ten.dtype, src, dst)
        m = mat_cache.get(mk)
        if m is None:
            m = reshard_matrix(ten.shape, np.dtype(ten.dtype).itemsize, src, dst, mesh)
            mat_cache[mk] = m
            if count:
                covered[:] = np.add(covered, reshard_coverage(src, dst, mesh))
        return m

    for v, nd in enumerate(nodes):
        for k, (u, oi) in enumerate(nd.operands):
            if u < 0:
                continue
            ten = nd.operand_types[k]
            src = tuple(s.out_specs[oi] for s in strats[u])
            dst = tuple(s.operand_specs[k] for s in strats[v])
            m = matrix(ten, src, dst, count=True)
            add(u, v, m[0], m[1])
            reads.append((v, k, u, oi, m[1]))
    for w, u, oi in alias_edges:
        ten = nodes[u].outputs[oi]
        src = tuple(s.out_specs[oi] for s in strats[u])
        dst = tuple(s.out_specs[0] for s in strats[w])
        m = matrix(ten, src, dst, count=False)
        a, b = (w, u) if w < u else (u, w)
        if (a, b) == (w, u):
            add(w, u, m[0].T, m[1].T)
        else:
            add(u, w, m[0], m[1])
    for i, o in sorted(plain_out):   # the runtime returns a plain output replicated (runtime.shardings
        if nodes[i].is_input:        # output_shardings): XLA gathers a sharded one at the end
            continue
        ten = nodes[i].outputs[o]
        m = matrix(ten, tuple(s.out_specs[o] for s in strats[i]), (((),) * len(ten.shape),), count=False)
        costs[offs[i]:offs[i + 1]] += m[0][:, 0]
        comm[offs[i]:offs[i + 1]] += m[1][:, 0]
    keys = sorted(edge_parts)
    edges = np.array(keys, dtype=np.int64).reshape(-1, 2)
    eoffs = np.zeros(len(keys) + 1, dtype=np.int64)
    if keys:
        np.cumsum([edge_parts[k][0].size for k in keys], out=eoffs[1:])
        ecost = np.concatenate([edge_parts[k][0].ravel() for k in keys])
        ecomm = np.concatenate([edge_parts[k][1].ravel() for k in keys])
    else:
        ecost = np.zeros(0)
        ecomm = np.zeros(0)

    # ---- meta ----
    axes = mesh.axis_names
    pub_cache: dict = {}
    meta = ProblemMeta(
        mesh_shape=tuple(int(x) for x in cluster.mesh_shape),
        axis_names=tuple(axes),
        cluster_name=cluster.name,
        graph_node=np.arange(n, dtype=np.int64),
        names=[nd.module_path or nd.primitive for nd in nodes],
        primitives=[nd.primitive for nd in nodes],
        roles=[nd.role for nd in nodes],
        strategy_names=[[s.name for s in st] for st in strats],
        out_specs=[list(_public(st, pub_cache)[0]) for st in strats],
        operand_specs=[list(_public(st, pub_cache)[1]) for st in strats],
        input_index=[nd.input_index for nd in nodes],
        input_path=[nd.input_path for nd in nodes],
        graph=graph,
        reshard_stats={"measured_pairs": int(covered[0]), "fallback_pairs": int(covered[1])},
        space=search,
    )
    if covered[1]:   # one text per mesh shape (the counts are in meta.reshard_stats), so Python's
        # default warning filter says it once per mesh and call site instead of once per problem
        warnings.warn(f"build_problem: resharding on mesh {tuple(cluster.mesh_shape)} is partly priced by the hand "
                      "rules (no measured table entry; build one with python -m runtime.reshard_probe); "
                      "problem.meta.reshard_stats has the counts", stacklevel=2)
    sliced = reader_layout_slices(graph, strats, mesh, reads, intervals, kept, transparent, usages, offs,
                                  plain_out | aliased, recomputed) + fused_read_groups(graph, strats, mesh, reads, intervals, through, usages, offs) if edge_memory else []
    return Problem(
        name=f"{graph.name or 'graph'}@{cluster.name}",
        strategy_offsets=offs,
        node_costs=costs,
        node_usages=usages,
        intervals=intervals,
        edges=edges,
        edge_offsets=eoffs,
        edge_costs=ecost,
        usage_limit=limits.effective_cap(float(cluster.memory_limit_bytes)),
        node_redundant=redundant,
        node_comm_bytes=comm,
        edge_comm_bytes=ecomm,
        node_imbalance_s=imbalance,
        meta=meta,
        edge_memory=CopyGroups.from_lists(with_combined_all_reduces(copy_group_lists(graph, strats, mesh, reads, intervals, held_read_steps(
            graph, intervals, kept, transparent, fused, from_state)) + sliced + (layout_copy_lists(graph, strats, mesh, intervals[:, 0], copied, together)
                + shared_broadcast_lists(graph, strats, mesh, kept, intervals) if cluster.backend == "cpu" else [])
            + donated_copy_lists(graph, strats, mesh, alias_edges, kept, transparent, copied),
            graph, strats, mesh, late) + buffer_groups) if edge_memory else None,
    )


def _read_at_fusion_root(graph: OpGraph, kept, transparent, strats) -> set[int]:
    """Nodes with a reducing strategy (an all-reduce / reduce-scatter of their partial result)
    whose every consumer keeps no buffer (fused element-wise ops) and whose fusion root also sums
    another such node: gradient contributions accumulated by one fused add chain (a
    weight read at every step of an unrolled lax.scan). The all-reduces of such partial results
    are independent of each other, and XLA's all-reduce combiner merges them into one tuple
    all-reduce that runs once all its operands exist, before the fused sum: each operand (the
    partial result, B per device) stays live beside its result, so such a strategy is charged B
    more (rnn under lax.scan, dp / fsdp: the eight per-iteration weight-gradient dots and their
    reduced results all sit at XLA's peak, one 25-operand all-reduce; 0.41x / 0.18x -> 0.99x).
    Approximate: the charge covers the node's whole interval, while XLA holds both only from
    the combined all-reduce on (an over-count of B per node before it, where a peak there sees
    it). A single contribution (a gradient fed straight to the optimizer update, gpt dp) is not
    charged: there XLA's peak is mid-backward and the combined all-reduce does not set it."""
    used = graph.consumer_nodes()
    memo: dict = {}

    def fused(c, depth=0):  # c keeps no buffer; a bitcast counts as its own consumers
        if c not in memo:
            memo[c] = (all(fused(d, depth + 1) for d in used.get(c, ())) and depth < 64 if c in transparent
                       else not kept[c])
        return memo[c]

    reducing = {i for i, ss in enumerate(strats)
                if any(k in ("all-reduce", "reduce-scatter") for st in ss for k, _, _ in st.collectives)}
    late = [u for u, cs in used.items() if u in reducing and all(fused(c) for c in cs)]
    roots_memo: dict = {}

    def roots(c, depth=0):  # the buffers a fused node ends up in (its fusion roots)
        if c not in roots_memo:
            roots_memo[c] = (frozenset().union(*(roots(d, depth + 1) for d in used[c]))
                             if fused(c) and used.get(c) and depth < 64 else frozenset({c}))
        return roots_memo[c]

    root_of = {u: frozenset().union(*(roots(c) for c in used[u])) for u in late}
    count: dict = {}
    for r in root_of.values():
        for x in r:
            count[x] = count.get(x, 0) + 1
    return {u for u in late if any(count[x] >= 2 for x in root_of[u])}


def _public(st, cache):
    """(out specs, operand specs) of a strategy list in public form, once per distinct list."""
    got = cache.get(id(st))
    if got is None:
        got = ([public_spec(s.out_specs[0]) for s in st],
               [tuple(public_spec(o) for o in s.operand_specs) for s in st])
        cache[id(st)] = got
    return got


def strategies_of(graph: OpGraph, cluster, max_strategies: int = MAX_STRATEGIES, space="full"):
    """The per-node strategy lists build_problem uses (for inspection and the runtime); ``space``
    may be None ("full")."""
    mesh = Mesh(cluster)
    search = search_space(space or "full")
    return [enumerate_strategies(nd, mesh, max_strategies, search) for nd in graph.nodes]
