"""The factor-graph network as a planner: a checkpoint of ``shardgym train --model fgnn`` turned
into plans with the same call as the GNN policy's ``Planner`` (``Planner.load`` hands such a
checkpoint here, so ``solve(method="policy", checkpoint=PATH)`` plans with it).

``FGPlanner.finetune(problem, time_limit_s)`` fine-tunes it on that problem (agent/fgnn_finetune.py):
the shared parameters it keeps replace the planner's, and the problem's readout table is kept under
the problem's fingerprint (``tables``), used only when that same problem (same limit) is planned.
``FGPlanner.plan(problem, polish=False)`` is the raw decode: one forward pass and solvers/bp.py's
masked one-node-at-a-time decode with the learned scores and messages, honouring the memory cap;
when no decode fits (their copies break the cap and the repair fails), the least-usage plan
repaired with its copies (``fitting_least_usage_plan``) if that fits (on the training split's gpt
tiny @ fg-random-2 cap 0.15: 1.98x the ILP label where every decode broke the cap by 4.2x).
With ``polish`` (the default) the plan then gets what the GNN planner gives its own decode
(``solvers.local.improve``: memory repair, local-search polish and, when the cap binds, refine for
``CAPPED_REFINE_TIME_LIMIT_S``, 3 s, from the cheaper polished start; when it does not bind, the whole-graph MILP seeded with the plan for
``whole_milp_time_limit`` (2 s, uncapped 2-5 s; it stops at its proof) first instead, ``solvers.local.lns.whole_milp``). A raw plan whose cost meets BP's lower bound
(``bp_solve``'s, on the numpy path) is proven optimal and gets no search (exact on trees; on the loopy
outside-the-zoo steps, 18-211 nodes, BP's bound is 7-46% under the plan, so it never fires there).
Under a usage limit (and no ``refine_time_limit_s`` given) the search is instead
``solvers.local.budgeted.capped_search``, budgeted in work units (``CAPPED_BUDGET``: Lagrangian rounds,
HiGHS node limits, BP rounds, forest moves, LNS neighbourhoods; wall-clock limits only as safety
caps, 300 s in all, 60 s a MILP), so its plan does not depend on the machine's load: the uncapped
optimum when it fits (up to 5,000 nodes), else 16 Lagrangian rounds (up to 2,000 nodes; they stop
once a round repeats a plan without raising the bound, session 27), their plans repaired, the union MILP
over the plans nearest the cap (from 2,000 to 5,000 nodes instead: the union of the uncapped optimum and
the decode, the MILP's root alone), polish, 2 LNS neighbourhoods (session 16, held-out split at load 2.0-2.2:
binding-cap median 1.000x, max 1.142x the best-known cost, 9-16 s, against 1.179x / 1.451x and
10-15 s before; the same plan costs at load 3.3 and beside two busy loops at load 5-6).
With ``refine_time_limit_s`` given, the older wall-clock path: ``solvers.local.lns.lagrange_starts``
for ``lagrange_time_limit`` (20 ms a node, 2-8 s), then ``improve``; its plan depends on the load.
``memory_cap_bytes`` tightens the problem's limit, as ``Planner.plan``'s.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
from flax import serialization

from agent.fgnn import FGNN, TABLE, FGConfig, live_parts
from agent.fgnn_finetune import finetune
from costmodel.limits import Limits
from costmodel.problem import Problem, evaluate, problem_fingerprint
from solvers.bp import bp_solve
from solvers.local import fitting_least_usage_plan, improve, least_usage_plan
from solvers.local.budgeted import CAPPED_BUDGET, capped_search
from solvers.local.lns import CAPPED_REFINE_TIME_LIMIT_S, lagrange_time_limit, whole_milp_time_limit

# Zero-correction networks plan with numpy BP up to this size: the jitted forward compiles once per
# shape bucket, 0.7-2.2 s on 2 cores (a first call on each new problem), where numpy BP takes
# 0.01-0.6 s from 18 to 2,000 nodes. Warm, the jitted forward is faster uncapped (random problems,
# load 9.6: 1,000 nodes 0.08 vs 0.14 s, 4,000 nodes 0.35 vs 0.58 s) and level under a cap (the decode
# dominates: 0.49 vs 0.47 s, 1.76 vs 1.88 s); its first call there took 2.15 and 2.16 s. 4,000 until
# session 27: meshgraphnet large @ h100-2x8 cap 0.3 (4,095 nodes, a first call, the same plan) took
# 3.5-4.5 s jitted against 2.1 s in numpy at load 3 (1.7 s at load 2, session 25). Above it numpy BP too where
# the problem has copy groups under a usage limit (session 28): the copy-priced phase stops the jitted rounds every
# 2 rounds to price and decode on the host, so the jit saves little and adds its compile, inputs and transfers
# (gpt 7b @ h100-2x8 cap 0.05, 8,583 nodes: see ``_decode``).
NUMPY_BP_MAX_NODES = 5000


class FGPlanner:
    """A trained factor-graph network; ``plan`` as ``agent.planner.Planner.plan``."""

    def __init__(self, params, config: dict, source: str = "", update: int = 0, extra: dict | None = None):
        self.config = FGConfig.from_dict(dict(config))
        self.net = FGNN(self.config, params)
        self.source, self.update, self.extra = source, int(update), dict(extra or {})
        self.tables = {}    # problem fingerprint -> its fine-tuned readout table (``finetune``)

    @classmethod
    def from_state(cls, state: dict, source: str) -> FGPlanner:
        import jax
        cfg = FGConfig.from_dict(state["config"])
        # shapes only (jax.eval_shape): a real template ran flax's init, 40 small XLA compiles, 0.1 s
        # warm but 5.8 s of a first call at load 12 (the held-out split's first problem)
        template = jax.eval_shape(lambda: FGNN(cfg).params)
        params = dict(state["params"])
        if set(template) - set(params):     # an older checkpoint: the entries added since, from a fresh network
            params = FGNN.complete(cfg, params)
        params = serialization.from_state_dict(template, params)
        return cls(params, state["config"], source=source, update=state["update"], extra=state.get("extra"))

    @property
    def params(self):
        return self.net.params

    def describe(self) -> dict:
        import jax
        n = sum(int(np.size(x)) for x in jax.tree.leaves(self.net.params))
        return {"source": self.source, "kind": "fgnn", "epochs": self.update, "parameters": n,
                "rounds": self.config.rounds, "hidden": self.config.hidden}

    def plan(self, problem: Problem, mode: str = "greedy", samples: int = 1, memory_cap_bytes=None,
             polish: bool = True, seed: int = 0, refine_time_limit_s: float | None = None, return_info: bool = False,
             params=None, time_limit_s: float | None = None, **_ignored):
        """The network's plan (see the module docstring); ValueError if no plan fits the cap.
        ``time_limit_s`` (``shardgym.solve``'s; None: none) bounds the whole call: numpy BP's rounds stop at
        it (its decode then runs on the messages it has), and the search's phases get what is left (each
        phase started before the limit runs to its own end, so a call can end past the limit by one phase,
        ``search_over_s`` below); a decode that needs more than the limit (the jitted run above
        ``NUMPY_BP_MAX_NODES``) is not cut. ``return_info``'s ``decode_found`` (numpy BP): (s from the decode's
        start, cost) of each cheaper fitting plan as BP decoded it (experiments/anytime.py's curve points)."""
        problem = Limits.of(memory_cap_bytes=memory_cap_bytes).apply(problem)
        t0 = time.perf_counter()
        deadline = None if time_limit_s is None else t0 + float(time_limit_s)
        left = (lambda cap: cap) if deadline is None else (lambda cap: max(min(cap, deadline - time.perf_counter()), 0.0))
        x, lb, found = self._decode(problem, params, bound=polish, time_limit_s=None if deadline is None else left(float("inf")))
        if x is None or (not polish and not evaluate(problem, x).feasible):
            # no decode (raw: none that fits): the least-usage plan, repaired with its copies priced
            fit = fitting_least_usage_plan(problem, time_limit_s=2.0)
            x = fit if fit is not None else x
            if x is None:
                c = evaluate(problem, least_usage_plan(problem))
                raise ValueError(f"no plan of {problem.name!r} fits the memory cap {problem.usage_limit:.4g} "
                                 f"bytes: the least-usage plan peaks at {c.peak_memory_bytes:.4g} bytes")
        raw = evaluate(problem, x)
        extra = {"decode_found": list(found)} if found else {}   # (s from numpy BP's start, ~this call's: cost)
        binds = problem.usage_limit is not None and not raw.feasible
        proven = raw.feasible and raw.total <= lb + 1e-9 * abs(lb)   # BP's lower bound: nothing to search
        if polish and not proven and problem.usage_limit is not None and refine_time_limit_s is None:
            # under a usage limit: the search budgeted in work units (``solvers.local.budgeted.capped_search``),
            # so the plan does not depend on the machine's load
            budget = CAPPED_BUDGET if deadline is None else replace(CAPPED_BUDGET, safety_s=min(CAPPED_BUDGET.safety_s,
                                                                                             left(float("inf"))))
            out, search = capped_search(problem, x, budget, seed=seed, return_info=True)
            extra["search"] = search
            x = x if out is None else out
            binds = search["phase"] != "uncapped optimum"
            # the uncapped optimum (HiGHS proved it) fits: the capped optimum; or the start meets a lower bound
            proven = not binds or search["phase"] == "at the bound"
        elif polish and not proven:
            if problem.usage_limit is not None and refine_time_limit_s is None:
                free = evaluate(problem.with_usage_limit(None), x)
                binds = binds or free.peak_memory_bytes > 0.999 * problem.usage_limit
            report = {}      # improve's proof, if any
            out = improve(problem, x, refine_time_limit_s=left((CAPPED_REFINE_TIME_LIMIT_S if binds else 0.0)
                                                               if refine_time_limit_s is None else refine_time_limit_s),
                          seed=seed, polish_time_limit_s=max(left(0.5), 0.05),
                          whole_time_limit_s=0.0 if binds else left(whole_milp_time_limit(problem)),
                          lagrange_time_limit_s=0.0 if problem.usage_limit is None else left(lagrange_time_limit(problem)),
                          report=report)
            x = x if out is None else out
            proven = bool(report.get("proven"))
        x = [int(v) for v in x]
        if return_info:
            wall = time.perf_counter() - t0
            if deadline is not None:
                extra["time_limit_s"], extra["search_over_s"] = float(time_limit_s), max(wall - float(time_limit_s), 0.0)
            return x, {"plan_time_s": wall, "raw_total": raw.total, "raw_feasible": raw.feasible,
                       "cap_binds": binds, "lower_bound": lb, "proven": bool(proven), **extra}
        return x

    def _decode(self, problem: Problem, params, bound: bool = True, time_limit_s: float | None = None) -> tuple:
        """(raw decode or None when none fits, a lower bound on the optimum or −inf, numpy BP's ``found`` log or ()).
        Without live
        corrections (``agent.fgnn.live_parts`` empty, damping parameters at 0, no warm hint) the network is BP exactly
        (tests/test_fgnn.py): up to ``NUMPY_BP_MAX_NODES`` nodes, and above with copy groups under a limit, it
        runs as ``solvers.bp.bp_solve`` (numpy, nothing to compile; with ``bound`` its lower bound at the start and the end, two
        tree DPs: 0.04 s of 0.14 s at 1,000 nodes), else through the jitted forward."""
        if params is None:
            params = self.net.params
            if self.tables:     # a problem fine-tuned on: its own readout table
                table = self.tables.get(problem_fingerprint(problem))
                params = params if table is None else {**params, TABLE: table}
        damped = bool(np.any(np.asarray(params["damp"])))     # a learned damping is no PART, but not BP's 0.5
        numpy_bp = problem.num_nodes <= NUMPY_BP_MAX_NODES or (problem.usage_limit is not None
                                                               and problem.edge_memory is not None)
        if not live_parts(params) and not damped and not self.config.warm and numpy_bp:
            r = bp_solve(problem, rounds=self.config.rounds, memory_prices=self.config.base == "lagrangian",
                         bound="end" if bound else False, time_limit_s=time_limit_s)
            return r.plan, r.lower_bound, r.found
        try:
            return self.net.plan(problem, params=params), -float("inf"), ()
        except ValueError:
            return None, -float("inf"), ()

    def finetune(self, problem: Problem, time_limit_s: float, memory_cap_bytes=None, seed: int = 0,
                 reinforce: bool = False, max_blocks: int | None = None, tune: str = "readout", **_ignored) -> list[dict]:
        """Imitation on the readout with a per-problem table (``tune="readout"``), or imitation + DAgger
        with ILP completions (+ POMO-style REINFORCE) on every parameter (``tune="all"``), on ``problem``
        alone for ``time_limit_s`` (agent/fgnn_finetune.py); every block is judged by this planner's own
        raw decode (``plan(polish=False)``), and the parameters of the cheapest raw plan seen are kept
        (never worse than zero-shot). Returns the per-block stats."""
        if time_limit_s <= 0:
            return []
        problem = Limits.of(memory_cap_bytes=memory_cap_bytes).apply(problem)

        def raw_cost(params) -> float:     # this planner's raw decode with ``params``, as ``plan(polish=False)``
            c = evaluate(problem, self.plan(problem, polish=False, params=params))
            return c.total if c.feasible else float("inf")
        params, stats = finetune(self.net, problem, time_limit_s, seed=seed, reinforce=reinforce,
                                 max_blocks=max_blocks, tune=tune, raw_cost=raw_cost)
        params = dict(params)
        table = params.pop(TABLE, None)
        self.net.params = params
        if table is not None:
            self.tables[problem_fingerprint(problem)] = table
        return stats
