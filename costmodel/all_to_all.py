"""Which resharded copies XLA's SPMD partitioner makes by all-to-all alone (``all_to_all_only``).

A copy of a value in layout L whose replicated copy XLA has already made for an earlier reader is
usually sliced from that replicated copy, sending nothing (``CopyGroups.shared_comm_bytes``: the
partitioner reshards by all-gather + dynamic-slice, and the all-gather is the same instruction as
the replicated copy's, which CSE merges). Not when the producer's layout turns into L by one
all-to-all: the partitioner reshards a move of a mesh axis from one dim to another by an
all-to-all, which shares nothing with the replicated copy's all-gather, so it runs and sends its
bytes. Measured (session 16, XLA's HLO of rnn ilp-memory-1.05 on cpu-2x4, the stored session-13
plan): the recurrent kernel wh read S1R -> RS1 by two forward dots after its all-gather to RR for
four others (``all-to-all.8``, 3,072 B per device) and, per unrolled backward step, the squeezed
tanh' x dh read S0R -> RS0 by a weight-gradient dot after its gather to RR for the bias reduction
(``all-to-all.9``-``.15``, 1,024 B each): XLA sends those 10,240 B, the model priced them as
slices (collective bytes 0.897 -> 1.000 of XLA's). The same plan's S0R -> RS1 reads (a move to
another mesh axis: a gather over one axis and a slice over the other) are sliced by XLA from the
replicated copy, as the rule says; so are moe's, fno's and meshgraphnet's (gathers and axis
changes, no pure move), and so is a move of both mesh axes at once: rnn ilp-memory's stored
XLA-order plan reads wh S01R -> RS01 after its whole all-gather, and XLA slices it (no all-to-all
in that program) although the resharding table, probed in isolation, measured one all-to-all for
that pair (an entry marked unstable). So the rule is the hand rules' (``cost.axis_changes``):
every removed axis re-added on another dim, none gathered, not a full rematerialisation (which a
move of two axes is there). Re-priced (experiments.fidelity --reprice): rnn ilp-memory-1.05 0.897
-> 1.000, no other row of the zoo or outside tables, either order, moves. Approximate: two cases
of a pure one-axis move measured, one of a two-axis move.
"""
from __future__ import annotations

from functools import lru_cache

from costmodel.cost import Mesh, axis_changes


def all_to_all_only(src, dst, mesh: Mesh | None = None) -> bool:
    """Does XLA turn layout ``src`` into ``dst`` (per-dim mesh-axis tuples) by all-to-all alone:
    every mesh axis ``src`` drops from a dim re-added on another dim, nothing gathered, and not
    the hand rules' full rematerialisation (two or more axes moved at once)? ``mesh`` is unused
    (the rule depends on the specs only); kept for a measured variant's signature."""
    return _moves_only(tuple(tuple(d) for d in src), tuple(tuple(d) for d in dst))


@lru_cache(maxsize=None)
def _moves_only(src, dst) -> bool:
    removed, added, remat = axis_changes(src, dst)
    return (bool(removed) and not remat and set(removed) == set(added)
            and all(added[a] != d for a, d in removed.items()))
