"""The ILP's data: its options (``IlpConfig``), one solve's run options (``RunOptions``) and
request (``Request``), the objective weights (``Weights``), and what it answers (``SolveInfo``,
``InfeasibleError``). All frozen: an option is passed, never set on a module.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

OBJECTIVES = ("time", "memory", "redundancy")


@dataclass(frozen=True)
class IlpConfig:
    """Tuning of the exact solver; the defaults are what ``solve_ilp`` uses."""

    highs_options: tuple = ()
    """Extra HiGHS options for every model, as (name, value) pairs, set after ours (benchmarks
    pass them; empty = our settings of ``solvers.ilp.highs.configure``)."""
    heuristic_share: float = 0.5
    """Memory objective under a step-time bound: share of the time left for the peak shaver's
    bisection (``solvers.ilp.peak_shaver``) before the exact steps."""
    relax_share: float = 0.5
    """Time objective under a cap: share of the time left for the uncapped LP tried first
    (``solvers.ilp.objectives.relax_cap``)."""
    copy_free_share: float = 0.25
    """Memory objective with copy groups: share of the time left for the same objective on the
    problem without its copies, whose plan seeds the real one (``solvers.ilp.memory``)."""
    dense_memory_nonzeros: int = 2_000_000
    """Memory as one dense row per time point up to this many nonzeros, running sums above
    (``solvers.ilp.blocks.MemAux``; -1 = always running sums)."""
    lp_share: float = 0.5
    """Share of a solve's time limit for the LP relaxation tried first (``highs.try_lp``)."""

    @classmethod
    def node_limited(cls, nodes: int | None) -> IlpConfig:
        """The defaults with HiGHS's branch-and-bound node limit (``mip_max_nodes``) at ``nodes``, a
        deterministic budget (None: no limit)."""
        return cls() if nodes is None else cls(highs_options=(("mip_max_nodes", int(nodes)),))


@dataclass(frozen=True)
class Weights:
    """Weights of a weighted objective a·time + b·peak + c·redundant bytes."""

    time: float = 1.0
    memory: float = 0.0
    redundancy: float = 0.0

    @staticmethod
    def of(objective: str, weights: dict | None) -> tuple[Weights, bool]:
        """(weights, lexicographic?) of ``solve_ilp``'s ``objective`` / ``weights`` arguments: a
        named objective other than time is lexicographic (its measure first, then time)."""
        if weights:
            w = {"time": 0.0, "memory": 0.0, "redundancy": 0.0}
            bad = set(weights) - set(w)
            if bad:
                raise ValueError(f"weights has unknown keys {sorted(bad)}; use time, memory, redundancy")
            w.update({a: float(b) for a, b in weights.items()})
            if any(x < 0 for x in w.values()) or not any(w.values()):
                raise ValueError(f"weights must be non-negative and not all zero, got {weights}")
            return Weights(**w), False
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
        return Weights(1.0 if objective == "time" else 0.0, 1.0 if objective == "memory" else 0.0,
                       1.0 if objective == "redundancy" else 0.0), objective != "time"

    def key(self, cost) -> float:
        """The weighted value of a plan's ``Cost``."""
        return self.time * cost.total + self.memory * cost.peak_memory_bytes + self.redundancy * cost.redundant_memory_bytes


TIME = Weights()
MEMORY = Weights(0.0, 1.0, 0.0)
REDUNDANCY = Weights(0.0, 0.0, 1.0)


@dataclass(frozen=True)
class RunOptions:
    """How and until when one ``solve_ilp`` call runs (wall-clock ``perf_counter`` seconds)."""

    t0: float                  # when the call started
    deadline: float            # when every solve must have returned
    reduce: bool               # run solvers.reduce before each model
    threads: int               # HiGHS threads
    rel_gap: float             # HiGHS mip_rel_gap
    verbose: bool              # HiGHS's log on stdout
    forbid: bool               # leave entries >= FORBIDDEN_COST out of the model (re-solve if infeasible)
    memory_cap_bytes: float | None = None   # the caller's cap, for the error messages
    config: IlpConfig = IlpConfig()
    on_incumbent: object = None   # called with each plan found on the way (the watchdog's fallback)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def offer(self, plan) -> None:
        """Hand ``plan`` (a full strategy list, or None: ignored) to ``on_incumbent``: a guarded
        solve's parent keeps the plans its child found, so a kill answers the best of them."""
        if plan is not None and self.on_incumbent is not None:
            self.on_incumbent([int(k) for k in plan])

    def until(self, deadline: float) -> RunOptions:
        """These options with the deadline moved earlier to ``deadline`` (never later)."""
        return replace(self, deadline=min(self.deadline, deadline))


@dataclass(frozen=True, eq=False)
class Request:
    """One exact solve (``solvers.ilp.reduced.core``): the objective and the constraints, in the
    original problem's units."""

    weights: Weights = TIME
    objective: str = "time"            # the name reported in SolveInfo.objective_name
    lexi: bool = False                 # lexicographic: the weighted measure first, then time
    cap: float | None = None           # memory cap (bytes); None = no memory rows
    need_m: bool = False               # the model needs the peak variable M
    max_step_time_s: float | None = None   # time <= this row
    start: list | None = None          # a plan of the original problem to start from
    allowed: np.ndarray | None = None  # strategy mask the caller proved safe (None = all)
    m_lo: float = 0.0                  # a proven lower bound on M (bytes)
    cutoff_step_time_s: float | None = None   # stop at the first plan this fast (time objective)
    lp_only: bool = False              # stop after the LP relaxation unless it proves the optimum
    # set per attempt by ``core`` for ``solve_reduced``:
    forbid: bool = True                # leave forbidden entries out of the model
    row_times: np.ndarray | None = None   # the memory rows' time points that can bind (None = all)
    col_mask: np.ndarray | None = None    # strategy mask applied as column bounds (without reductions)

    @property
    def lex_redundancy(self) -> bool:
        """The model needs a row of redundant bytes (bounded in the lexicographic phase 2)."""
        return self.lexi and self.weights.redundancy > 0


class InfeasibleError(ValueError):
    """No plan meets the constraints. ``min_peak_bytes``: the lowest peak memory any plan reaches
    (under the step-time bound, if any); ``min_step_time_s``: the fastest step time any plan
    reaches under the memory cap (set when the step-time bound is what fails)."""

    def __init__(self, msg, min_peak_bytes=None, min_step_time_s=None):
        super().__init__(msg)
        self.min_peak_bytes = min_peak_bytes
        self.min_step_time_s = min_step_time_s


@dataclass(frozen=True)
class SolveInfo:
    status: str                 # "optimal" | "time_limit" | "infeasible" | "heuristic" | ...
    objective: float            # the requested objective on the returned plan (original problem)
    bound: float                # HiGHS's proven lower bound on the (first-phase) objective
    gap: float                  # (objective - bound) / |objective|
    wall_s: float
    num_vars: int
    num_rows: int
    reduced_nodes: int          # nodes left with more than one strategy after the reductions
    objective_name: str = "time"
    step_time_s: float = 0.0
    peak_memory_bytes: float = 0.0
    redundant_memory_bytes: float = 0.0
    reduction: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def but(self, **kw) -> SolveInfo:
        """This info with the fields ``kw`` replaced."""
        d = self.to_dict()
        d.update(kw)
        return SolveInfo(**d)
