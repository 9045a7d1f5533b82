"""Observation features of the sharding env: names, units, and the static part of each array.

Everything here is computed once per Problem (``static_features``); the env then updates the
dynamic columns in place as nodes are decided. Units used for normalisation (per problem):

* ``cost_unit = reference_cost / num_nodes`` (seconds, or contest units): the reference plan's
  average cost per node. Cost-like features are ``log1p(cost / cost_unit)`` (so 0 stays 0, a typical
  node is O(1), and IOPDDL's 1e18 "forbidden" costs stay below ~60).
* ``mem_unit``: the reference plan's peak live usage (bytes per device; independent of the cap,
  which enters as the ``cap_ratio`` context feature). Memory features are ``usage / mem_unit``
  clipped to [0, 10].
* ``red_unit``, ``comm_unit``: the mean of the positive redundant bytes / comm bytes over all
  strategies of the problem (1 if none). Features are ``log1p(x / unit)``.

Node rows, action rows and edge rows are in *problem order* (row i = problem node i; edge row e =
problem edge e, ``edge_index[e] = (producer, consumer)``). Node ids are never features.
"""
from __future__ import annotations

import numpy as np

NODE_FEATURES = [
    "cost_min",          # log1p(min_s node_cost / cost_unit)
    "cost_mean",         # log1p(mean_s node_cost / cost_unit)
    "cost_max",          # log1p(max_s node_cost / cost_unit)
    "usage_min",         # min_s usage / mem_unit (clipped to 10)
    "usage_max",         # max_s usage / mem_unit (clipped to 10)
    "interval_start",    # start of the liveness interval / horizon (largest interval end)
    "interval_length",   # (end - start) / horizon
    "log_in_degree",     # log1p(number of producer edges)
    "log_out_degree",    # log1p(number of consumer edges)
    "log_num_strategies",  # log(k_i)
    "log_flops",         # log10(1 + FLOPs) / 12 (traced problems with an OpGraph; else 0)
    "log_bytes",         # log10(1 + bytes read + written) / 12 (same)
    "kind_input", "kind_matmul", "kind_conv", "kind_reduce", "kind_fft",
    "kind_gather_scatter", "kind_reshape_transpose", "kind_elementwise_other",  # op kind one-hot (all 0 without meta)
    "role_param", "role_opt_state", "role_batch", "role_activation", "role_gradient",
    "role_none",         # role one-hot (role_none for IOPDDL/random problems and other roles)
    "has_meta",          # 1 for traced problems
    "position",          # rank of the node in the decision order / num_nodes
    "cap_ratio",         # episode context (same on every node): memory cap / mem_unit (clipped to 10), 0 if none
    "has_cap",           # episode context: 1 if the episode has a memory cap
    "weight_time", "weight_memory", "weight_redundancy", "weight_balance",  # episode context: objective weights
    "decided",           # dynamic: 1 once the node's strategy is fixed
    "current",           # dynamic: 1 for the node being decided now
    "decided_cost",      # dynamic: log1p(chosen strategy's node cost / cost_unit)
    "decided_memory",    # dynamic: chosen strategy's usage / mem_unit
    "decided_reshard",   # dynamic: log1p(resharding paid when the node was decided / cost_unit)
]

ACTION_FEATURES = [
    "valid",             # 1 if strategy s exists for node i (s < k_i)
    "node_cost",         # log1p(node_cost / cost_unit)
    "node_cost_rel",     # (c - min_s c) / (max_s c - min_s c) within the node (0 if all equal)
    "memory",            # usage / mem_unit (clipped to 10)
    "memory_rel",        # (u - min_s u) / (max_s u - min_s u) within the node (0 if all equal)
    "redundant",         # log1p(redundant bytes / red_unit)
    "comm",              # log1p(comm bytes of the node's own collectives / comm_unit)
    "imbalance",         # log1p(imbalance_s / cost_unit)
    "reshard_decided",   # dynamic: log1p(Σ resharding cost to already-decided neighbours / cost_unit)
    "incremental",       # dynamic: log1p((node cost + reshard_decided cost) / cost_unit): the time part of -reward
    "reshard_future_lb",  # static: log1p(Σ over incident edges of min over the other end's strategies / cost_unit)
    "peak_rise",         # dynamic, set when the node becomes current (then frozen): (max live usage of the decided
                         #   nodes over the node's interval + usage - running peak) / mem_unit; > 0: the peak rises
                         #   by that much if chosen, < 0: headroom below the running peak. 0 for undecided nodes.
    "best_incremental",  # dynamic, set when the node becomes current (then frozen): 1 for the valid strategy with the
                         #   least incremental time cost (node + resharding to decided neighbours)
    "chosen",            # dynamic: 1 for a decided node's chosen strategy
]

EDGE_FEATURES = [
    "cost_min",          # log1p(min of the resharding matrix / cost_unit)
    "cost_mean",         # log1p(mean / cost_unit)
    "cost_max",          # log1p(max / cost_unit)
    "zero_frac",         # fraction of (producer, consumer) strategy pairs that reshard for free
    "tensor_bytes",      # log10(1 + bytes of the producer's output) / 12 (traced problems; else 0)
    "src_decided",       # dynamic: producer decided
    "dst_decided",       # dynamic: consumer decided
    "realised_cost",     # dynamic: log1p(E[s_u, s_v] / cost_unit) once both ends are decided
]

NODE_INDEX = {n: i for i, n in enumerate(NODE_FEATURES)}
ACTION_INDEX = {n: i for i, n in enumerate(ACTION_FEATURES)}
EDGE_INDEX = {n: i for i, n in enumerate(EDGE_FEATURES)}

OP_KINDS = ("input", "matmul", "conv", "reduce", "fft", "gather_scatter", "reshape_transpose", "elementwise_other")
ROLE_KINDS = ("param", "opt_state", "batch", "activation", "gradient", "none")

_KIND_OF = {
    "input": "input", "dot_general": "matmul", "conv_general_dilated": "conv", "fft": "fft",
    "gather": "gather_scatter", "scatter": "gather_scatter", "scatter-add": "gather_scatter",
    "scatter_add": "gather_scatter", "scatter-mul": "gather_scatter", "scatter_mul": "gather_scatter",
    "scatter-min": "gather_scatter", "scatter-max": "gather_scatter", "dynamic_slice": "gather_scatter",
    "dynamic_update_slice": "gather_scatter", "take": "gather_scatter", "segment_sum": "gather_scatter",
    "reshape": "reshape_transpose", "transpose": "reshape_transpose", "broadcast_in_dim": "reshape_transpose",
    "squeeze": "reshape_transpose", "expand_dims": "reshape_transpose", "concatenate": "reshape_transpose",
    "slice": "reshape_transpose", "pad": "reshape_transpose", "rev": "reshape_transpose",
    "copy": "reshape_transpose",
}


def op_kind(primitive: str) -> str:
    """The op-kind bucket of a JAX primitive name (reductions by prefix, unknowns elementwise_other)."""
    if primitive in _KIND_OF:
        return _KIND_OF[primitive]
    if primitive.startswith(("reduce_", "argmax", "argmin", "cum")) or primitive in ("reduce", "reduce_precision_sum"):
        return "reduce"
    if primitive.startswith("scatter"):
        return "gather_scatter"
    if primitive.startswith("conv"):
        return "conv"
    if primitive.startswith("dot"):
        return "matmul"
    return "elementwise_other"


def unit_of(values: np.ndarray) -> float:
    """Mean of the positive finite entries of ``values``; 1.0 if there are none."""
    v = values[np.isfinite(values) & (values > 0)]
    return float(v.mean()) if len(v) else 1.0


def _log1p_units(x, unit: float) -> np.ndarray:
    return np.log1p(np.maximum(np.asarray(x, dtype=np.float64), 0.0) / unit)


def _rel(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per-row (x - min) / (max - min) over valid entries; 0 where a row is constant."""
    big = np.where(valid, x, np.inf)
    lo = big.min(axis=1, keepdims=True)
    hi = np.where(valid, x, -np.inf).max(axis=1, keepdims=True)
    span = hi - lo
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(span > 0, (x - lo) / np.where(span > 0, span, 1.0), 0.0)
    out = np.where(valid & np.isfinite(out), out, 0.0)
    return out


def static_features(problem, padded: dict, units: dict, rank: np.ndarray, kmat: dict) -> dict:
    """The static columns of the three feature arrays for ``problem``, unpadded:
    ``node`` (n, F_node), ``action`` (n, K, F_act), ``edge`` (m, F_edge), float32.

    ``kmat``: per-node padded (n, K) float64 matrices ``cost``, ``usage``, ``redundant``, ``comm``,
    ``imbalance`` and the bool ``valid``. ``rank[i]``: position of node i in the decision order.
    """
    n, m, K = problem.num_nodes, problem.num_edges, padded["K"]
    cu, mu = units["cost_unit"], units["mem_unit"]
    valid = kmat["valid"]
    node = np.zeros((n, len(NODE_FEATURES)), dtype=np.float64)
    act = np.zeros((n, K, len(ACTION_FEATURES)), dtype=np.float64)
    edge = np.zeros((m, len(EDGE_FEATURES)), dtype=np.float64)
    k = problem.num_strategies
    cost, usage = kmat["cost"], kmat["usage"]
    cmin = np.where(valid, cost, np.inf).min(axis=1)
    cmax = np.where(valid, cost, -np.inf).max(axis=1)
    cmean = np.add.reduceat(problem.node_costs, problem.strategy_offsets[:-1]) / k if n else np.zeros(0)
    umin = np.where(valid, usage, np.inf).min(axis=1)
    umax = np.where(valid, usage, -np.inf).max(axis=1)
    N = NODE_INDEX
    node[:, N["cost_min"]] = _log1p_units(cmin, cu)
    node[:, N["cost_mean"]] = _log1p_units(cmean, cu)
    node[:, N["cost_max"]] = _log1p_units(cmax, cu)
    node[:, N["usage_min"]] = np.clip(umin / mu, 0, 10)
    node[:, N["usage_max"]] = np.clip(umax / mu, 0, 10)
    horizon = float(max(problem.intervals.max(), 1)) if n else 1.0
    node[:, N["interval_start"]] = problem.intervals[:, 0] / horizon
    node[:, N["interval_length"]] = np.maximum(problem.intervals[:, 1] - problem.intervals[:, 0], 0) / horizon
    if m:
        node[:, N["log_in_degree"]] = np.log1p(np.bincount(problem.edges[:, 1], minlength=n))
        node[:, N["log_out_degree"]] = np.log1p(np.bincount(problem.edges[:, 0], minlength=n))
    node[:, N["log_num_strategies"]] = np.log(k)
    node[:, N["position"]] = rank / max(n, 1)
    meta = problem.meta
    if meta is not None:
        node[:, N["has_meta"]] = 1.0
        graph = getattr(meta, "graph", None)
        gnodes = getattr(graph, "nodes", None)
        for i in range(n):
            prim = meta.primitives[i] if i < len(meta.primitives) else ""
            node[i, N["kind_" + op_kind(prim)]] = 1.0
            role = meta.roles[i] if i < len(meta.roles) else "none"
            node[i, N["role_" + (role if role in ROLE_KINDS else "none")]] = 1.0
            if gnodes is not None:
                g = gnodes[int(meta.graph_node[i])]
                node[i, N["log_flops"]] = np.log10(1.0 + g.flops) / 12
                node[i, N["log_bytes"]] = np.log10(1.0 + g.bytes_read + g.bytes_written) / 12
        if gnodes is not None and m:
            for e in range(m):
                g = gnodes[int(meta.graph_node[int(problem.edges[e, 0])])]
                nbytes = g.outputs[0].nbytes if g.outputs else 0
                edge[e, EDGE_INDEX["tensor_bytes"]] = np.log10(1.0 + nbytes) / 12
    else:
        node[:, N["role_none"]] = 1.0

    A = ACTION_INDEX
    act[:, :, A["valid"]] = valid
    act[:, :, A["node_cost"]] = np.where(valid, _log1p_units(np.where(valid, cost, 0), cu), 0)
    act[:, :, A["node_cost_rel"]] = _rel(cost, valid)
    act[:, :, A["memory"]] = np.where(valid, np.clip(usage / mu, 0, 10), 0)
    act[:, :, A["memory_rel"]] = _rel(usage, valid)
    act[:, :, A["redundant"]] = np.where(valid, _log1p_units(kmat["redundant"], units["red_unit"]), 0)
    act[:, :, A["comm"]] = np.where(valid, _log1p_units(kmat["comm"], units["comm_unit"]), 0)
    act[:, :, A["imbalance"]] = np.where(valid, _log1p_units(kmat["imbalance"], cu), 0)
    act[:, :, A["incremental"]] = act[:, :, A["node_cost"]]

    if m:
        E = EDGE_INDEX
        lb = np.zeros((n, K))
        for e in range(m):
            u, v = int(problem.edges[e, 0]), int(problem.edges[e, 1])
            mat = problem.edge_matrix(e)
            edge[e, E["cost_min"]] = _log1p_units(mat.min(), cu)
            edge[e, E["cost_mean"]] = _log1p_units(mat.mean(), cu)
            edge[e, E["cost_max"]] = _log1p_units(mat.max(), cu)
            edge[e, E["zero_frac"]] = float((mat == 0).mean())
            if u != v:
                lb[u, :k[u]] += mat.min(axis=1)
                lb[v, :k[v]] += mat.min(axis=0)
            else:
                lb[u, :k[u]] += np.diagonal(mat)
        act[:, :, A["reshard_future_lb"]] = np.where(valid, _log1p_units(lb, cu), 0)
    return {"node": node.astype(np.float32), "action": act.astype(np.float32), "edge": edge.astype(np.float32)}
