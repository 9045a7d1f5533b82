"""build_problem: compile an OpGraph on a Cluster into a Problem (the strategy graph solvers see).

One Problem node per OpGraph node, same order (``meta.graph_node[i] == i``). Per strategy:
- node_costs (s)     = compute time of the padded shard on the slowest device + the node's own
                       collectives (costmodel.cost.compute_time / collective);
- node_imbalance_s   = compute time on the slowest device − at the mean device FLOP/s;
- node_comm_bytes    = bytes per device the node's collectives send;
- node_usages        = per-device (padded) bytes of the node's outputs XLA keeps as buffers
                       (``materialised_outputs``: fused element-wise values cost nothing), except
                       outputs that alias a program input (new params / opt state replace the
                       donated input buffer), + the gathered copies of input operands the
                       strategy reads less sharded than they can be stored (``operand_copies``);
- node_redundant     = Σ over all non-aliased outputs of bytes × (replication factor − 1).
Liveness (docs/INTERFACES.md), T = 1 + the largest ``order``: input nodes live [0, T); an op lives
from its ``order`` to 1 + the order of its last consumer, or to T when one of its outputs is a
program output that aliases nothing; an op all of whose uses are aliased program outputs gets the
zero-length interval [order, order). A group's outputs share one interval (their longest); a
transparent node (an unfolded reshape: a bitcast) extends its producer's interval to its own end.
Edges: one per (producer, consumer) pair, the resharding matrices of all operands the consumer
takes from that producer summed (producer strategy = row). An output that aliases input leaf a
must end in a's storage layout: the resharding (producer's out spec -> a's storage spec) is added
to the edge (a's input node, producer), created if absent. Approximation: XLA reshards a value
once per distinct target layout and reuses it for every consumer of that layout (CSE: an FSDP
parameter is all-gathered once for its forward and backward matmuls), while each edge here pays
for its own reshard — collective bytes over-counted where several consumers share a layout
(FSDP rows 1.1-1.2x in results/fidelity.json); the pairwise edge format has no shared term.
usage_limit = min(memory_cap_bytes, cluster.memory_limit_bytes).
"""
from __future__ import annotations

import numpy as np

from costmodel.cost import Mesh, collective, compute_time, local_bytes, public_spec, redundant_bytes, reshard_matrix
from costmodel.graph import OpGraph
from costmodel.primitives import REDUCTIONS, SCATTER_COMBINE, WINDOWED
from costmodel.problem import Problem, ProblemMeta
from costmodel.strategies import MAX_STRATEGIES, RESHAPES, SCANS, enumerate_strategies, node_key, search_space

#: consumers XLA does not fuse their operands into: the operand is a materialised buffer.
NON_FUSIBLE = (frozenset({"dot_general", "conv_general_dilated", "fft", "gather", "scatter", "sort",
                          "dynamic_update_slice", "while", "cond", "scan", "select_and_scatter_add"})
               | SCATTER_COMBINE | SCANS | WINDOWED)
#: heads whose own result is always a buffer (non-fusible ops and reductions).
MATERIALISING = NON_FUSIBLE | REDUCTIONS
#: unfolded nodes that are a bitcast of their operand (no buffer of their own).
TRANSPARENT = RESHAPES
#: element-wise ops XLA will not duplicate into several consumers (InstructionFusion::IsExpensive).
EXPENSIVE = frozenset({"exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "sqrt", "rsqrt", "cbrt",
                       "div", "pow", "erf", "erfc", "erf_inv", "atan2", "sin", "cos", "tan", "lgamma",
                       "digamma"})


def build_problem(graph: OpGraph, cluster, memory_cap_bytes: float | None = None,
                  max_strategies: int = MAX_STRATEGIES, space="full") -> Problem:
    """Compile ``graph`` on ``cluster`` (a Cluster or a preset name) into a Problem with meta.
    ``space``: "full" (default), "alpa" (batch / feature sharding only: no spatial conv, fft
    replicated) or a ``costmodel.strategies.SearchSpace``."""
    from costmodel.cluster import Cluster
    if isinstance(cluster, str):
        cluster = Cluster.preset(cluster)
    if not isinstance(graph, OpGraph):
        raise ValueError(f"build_problem needs an OpGraph (from shardgym.trace), got {type(graph).__name__}")
    if len(graph.nodes) == 0:
        raise ValueError("build_problem: the OpGraph has no nodes")
    if max_strategies < 1:
        raise ValueError(f"max_strategies must be >= 1, got {max_strategies}")
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
        key = node_key(nd)
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
    copy_ops = operand_copies(graph, strats, mesh)

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
        ck = (id(strats[i]), tuple(counted), tuple(every), tuple((k, b) for k, _, b in copy_ops[i]))
        got = node_cache.get(ck)
        if got is None:
            rows = []
            for st in strats[i]:
                t, imb = compute_time(st.flops, mesh)
                cb = 0.0
                for kind, ax, B in st.collectives:
                    dt, ds = collective(kind, ax, B, mesh)
                    t += dt
                    cb += ds
                mem, red = st.extra_bytes, 0.0   # extra: a conv's haloed lhs copy (costmodel.halo)
                for k, ten, bmin in copy_ops[i]:  # resharded operand copies, live during the step
                    lb = local_bytes(ten.shape, np.dtype(ten.dtype).itemsize, st.operand_specs[k], mesh)
                    if lb > bmin:
                        mem += lb
                for o in counted:  # o = -1: the head's own result, of output 0's shape and spec
                    ten = nd.outputs[max(o, 0)]
                    mem += local_bytes(ten.shape, np.dtype(ten.dtype).itemsize, st.out_specs[max(o, 0)], mesh)
                for o in every:
                    red += redundant_bytes(nd.outputs[o].nbytes, st.out_specs[o], mesh)
                rows.append((t, mem, red, cb, imb))
            got = np.array(rows, dtype=np.float64).reshape(-1, 5)
            node_cache[ck] = got
        sl = slice(int(offs[i]), int(offs[i + 1]))
        costs[sl], usages[sl], redundant[sl], comm[sl], imbalance[sl] = got.T

    # ---- liveness ----
    T = 1 + max(int(nd.order) for nd in nodes)
    last_use = np.full(n, -1, dtype=np.int64)
    for nd in nodes:
        for src, _ in nd.operands:
            if src >= 0:
                last_use[src] = max(last_use[src], int(nd.order))
    intervals = np.zeros((n, 2), dtype=np.int64)
    to_end = {src for src, _ in plain_out}
    for i, nd in enumerate(nodes):
        if nd.is_input:
            intervals[i] = (0, T)
        else:
            start = int(nd.order)
            end = T if i in to_end else (last_use[i] + 1 if last_use[i] >= 0 else start)
            intervals[i] = (start, max(start, end))
    for i in sorted(transparent, reverse=True):  # a bitcast keeps its producer's buffer alive
        u = nodes[i].operands[0][0]
        if u >= 0 and not nodes[u].is_input:
            intervals[u, 1] = max(intervals[u, 1], intervals[i, 1])

    # ---- edges ----
    edge_parts: dict = {}
    mat_cache: dict = {}

    def add(u, v, T_, C_):
        got = edge_parts.get((u, v))
        if got is None:
            edge_parts[(u, v)] = [T_, C_]
        else:
            got[0] = got[0] + T_
            got[1] = got[1] + C_

    for v, nd in enumerate(nodes):
        for k, (u, oi) in enumerate(nd.operands):
            if u < 0:
                continue
            ten = nd.operand_types[k]
            src = tuple(s.out_specs[oi] for s in strats[u])
            dst = tuple(s.operand_specs[k] for s in strats[v])
            mk = (ten.shape, ten.dtype, src, dst)
            m = mat_cache.get(mk)
            if m is None:
                m = reshard_matrix(ten.shape, np.dtype(ten.dtype).itemsize, src, dst, mesh)
                mat_cache[mk] = m
            add(u, v, m[0], m[1])
    for w, u, oi in alias_edges:
        ten = nodes[u].outputs[oi]
        src = tuple(s.out_specs[oi] for s in strats[u])
        dst = tuple(s.out_specs[0] for s in strats[w])
        mk = (ten.shape, ten.dtype, src, dst)
        m = mat_cache.get(mk)
        if m is None:
            m = reshard_matrix(ten.shape, np.dtype(ten.dtype).itemsize, src, dst, mesh)
            mat_cache[mk] = m
        a, b = (w, u) if w < u else (u, w)
        if (a, b) == (w, u):
            add(w, u, m[0].T, m[1].T)
        else:
            add(u, w, m[0], m[1])
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
    )
    limit = float(cluster.memory_limit_bytes)
    if memory_cap_bytes is not None:
        if not memory_cap_bytes > 0:
            raise ValueError(f"memory_cap_bytes must be positive, got {memory_cap_bytes}")
        limit = min(limit, float(memory_cap_bytes))
    return Problem(
        name=f"{graph.name or 'graph'}@{cluster.name}",
        strategy_offsets=offs,
        node_costs=costs,
        node_usages=usages,
        intervals=intervals,
        edges=edges,
        edge_offsets=eoffs,
        edge_costs=ecost,
        usage_limit=limit,
        node_redundant=redundant,
        node_comm_bytes=comm,
        edge_comm_bytes=ecomm,
        node_imbalance_s=imbalance,
        meta=meta,
    )


def materialised_outputs(graph: OpGraph, plain_out=frozenset()) -> tuple[list[list[int]], set[int]]:
    """Which outputs of each node XLA keeps as a buffer (what ``node_usages`` counts), and the
    unfolded nodes that are bitcasts of their operand (``transparent``: no buffer of their own).

    Rule (XLA's fusion boundaries, approximately). XLA fuses element-wise ops, broadcasts,
    reshapes and transposes into the fusion of their consumer and recomputes a fused value in every
    consumer that needs it (forward and backward alike), so the buffers of a step are: the results
    of non-fusible ops and reductions (``MATERIALISING``), the operands of non-fusible ops
    (``NON_FUSIBLE``: dot, conv, fft, gather/scatter, sort, scans, control flow — the fusion feeding
    them writes its result out), and the program outputs. Per node:
      * a group whose head is in ``MATERIALISING`` keeps the head's own result (XLA's dot / conv /
        reduce writes it out; the folded chain's values are recomputed from it; for a group with
        folded ops it is counted as one extra buffer of output 0's shape and spec, since the head's
        value is usually not among the exposed outputs) plus every output that is *materialised*,
        plus — when the chain holds an ``EXPENSIVE`` op (exp, tanh, div, ...) whose value is read
        more than once — one more exposed output: XLA does not duplicate expensive ops into
        several consumers, it writes them out (GELU's tanh, softmax's exp);
      * any other node (element-wise, broadcast, slice, pad, concatenate, ...) keeps only its
        materialised outputs — none, when all its consumers fuse it;
      * an unfolded reshape / squeeze / expand_dims / transpose with one operand is ``transparent``:
        it keeps nothing, and its producer's buffer lives as long as it is used (builder extends the
        producer's interval).
    An output is *materialised* when it is a program output that aliases no input, or when one of
    its consumers takes it as a head operand of a ``NON_FUSIBLE`` op — looking through transparent
    nodes (``reshape(x) @ w`` materialises x's producer's output).
    Residual error (results/fidelity.json): which exposed output holds the expensive value is not
    recorded in the graph (any one of the head's shape is taken); a dot operand that is a transpose of a buffer may be copied
    (layout change) instead of folded into the dot: under-count; transient buffers of a group (the
    dot result before a bias add) overlap only briefly and are not counted: under-count near a peak;
    buffers XLA's scheduler reuses in place (element-wise outputs written over a dead operand) are
    counted separately: over-count; XLA's figure includes the temp allocation's fragmentation
    (its live-range peak is 10-30% below ``temp`` on small models): under-count.
    """
    nodes = graph.nodes
    consumers: dict = {}
    for nd in nodes:
        nh = int(nd.params.get("num_head_operands", len(nd.operands)))
        for k, (src, oi) in enumerate(nd.operands):
            if src >= 0:
                consumers.setdefault((src, oi), []).append((nd.id, k < nh))
    transparent = {nd.id for nd in nodes
                   if nd.primitive in TRANSPARENT and not nd.folded and len(nd.outputs) == 1
                   and len([1 for s, _ in nd.operands if s >= 0]) == 1 and nd.operands[0][0] >= 0
                   and not nd.params.get("replicate_only") and nd.supported}
    memo: dict = {}

    def feeds_buffer(i, o, depth=0):
        key = (i, o)
        got = memo.get(key)
        if got is not None:
            return got
        res = key in plain_out
        for c, head in consumers.get(key, ()):
            if res:
                break
            cn = nodes[c]
            if c in transparent:
                res = depth < 64 and feeds_buffer(c, 0, depth + 1)
            elif head and (cn.primitive in NON_FUSIBLE or cn.params.get("replicate_only") or not cn.supported):
                res = True
        memo[key] = res
        return res

    kept: list[list[int]] = []
    for nd in nodes:
        i = nd.id
        if nd.is_input:
            kept.append(list(range(len(nd.outputs))))
            continue
        if i in transparent:
            kept.append([o for o in range(len(nd.outputs)) if (i, o) in plain_out])
            continue
        head_buffer = (nd.primitive in MATERIALISING or nd.params.get("replicate_only") or not nd.supported)
        ko = [o for o in range(len(nd.outputs)) if (o == 0 and head_buffer and not nd.folded) or feeds_buffer(i, o)]
        if head_buffer and nd.folded:
            ko.append(-1)  # the head's own result, which the folded chain reads (see docstring)
        if (nd.primitive in EXPENSIVE or any(f in EXPENSIVE for f in nd.folded)):
            rest = [o for o in range(len(nd.outputs)) if o not in ko
                    and len(consumers.get((i, o), ())) + sum(len(consumers.get((i, q), ())) for q in ko) >= 2]
            ko += rest[:1]
        kept.append(sorted(ko))
    return kept, transparent


def operand_copies(graph: OpGraph, strats, mesh: Mesh) -> list[list[tuple]]:
    """Per node: the operands whose resharded copy is charged to the node's own usage, as
    (operand index k, Tensor, b_min) with b_min = the fewest per-device bytes any strategy of the
    producer stores that value in.

    A consumer that reads a program input (parameter, optimizer state, batch) in a less-sharded
    layout than the input can be stored in holds an extra buffer: the all-gathered copy (an FSDP
    parameter gathered for its matmul). XLA gathers it once and reuses it (CSE) for every consumer
    of that layout, so the copy lives from the forward use to the backward use — about the
    consumer's own interval for a forward matmul, which is what the copy is charged over here. The IOPDDL
    format has per-node usages only, so the copy cannot depend on both endpoints' strategies; the
    approximation charges consumer strategy s the local bytes of operand k under s's operand spec
    whenever they exceed b_min, over the consumer's interval. Exact-ish when the input is stored at
    b_min (FSDP storage); an over-count of one copy when the stored layout already matches (a
    replicated weight read by a replicated matmul under DP: the weight counted twice while the
    matmul's result lives). Activations are not charged: their producer's buffer is already
    counted and a copy would only be live for one step, which one interval per node cannot say
    (under-count where a plan gathers activations). Only head operands of
    ``NON_FUSIBLE`` consumers (dot, conv, fft, gather/scatter, ...) are charged: their operands are
    buffers; element-wise consumers are fused with the slice/gather producing their operands.
    On the CPU backend the charge also stands in for the copies XLA makes of weights in the layout
    its dot kernels want (``copy.N`` of parameters, live from the forward to the backward matmul).
    Measured (results/fidelity.json): moves FSDP rows from 0.3-0.6x to 0.6-0.9x of XLA and
    replicated / DP rows by -5% to +20%.
    """
    nodes = graph.nodes
    bmin_cache: dict = {}
    out: list[list[tuple]] = []
    for nd in nodes:
        res = []
        if not nd.is_input and nd.primitive in NON_FUSIBLE and len(strats[nd.id]) > 1:
            nh = int(nd.params.get("num_head_operands", len(nd.operands)))
            for k, (u, oi) in enumerate(nd.operands[:nh]):
                if u < 0 or not nodes[u].is_input:
                    continue
                key = (id(strats[u]), oi)
                b = bmin_cache.get(key)
                if b is None:
                    t = nodes[u].outputs[oi]
                    it = np.dtype(t.dtype).itemsize
                    b = min(local_bytes(t.shape, it, s.out_specs[oi], mesh) for s in strats[u])
                    bmin_cache[key] = b
                res.append((k, nd.operand_types[k], b))
        out.append(res)
    return out


def _public(st, cache):
    """(out specs, operand specs) of a strategy list in public form, once per distinct list."""
    got = cache.get(id(st))
    if got is None:
        got = ([public_spec(s.out_specs[0]) for s in st],
               [tuple(public_spec(o) for o in s.operand_specs) for s in st])
        cache[id(st)] = got
    return got


def strategies_of(graph: OpGraph, cluster, max_strategies: int = MAX_STRATEGIES, space="full"):
    """The per-node strategy lists build_problem uses (for inspection and the runtime)."""
    mesh = Mesh(cluster)
    search = search_space(space)
    return [enumerate_strategies(nd, mesh, max_strategies, search) for nd in graph.nodes]
