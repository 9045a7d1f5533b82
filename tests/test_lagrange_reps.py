"""The Lagrangian bound's copy terms (``solvers.lagrange.CopyTerms``) against every plan of small
random problems with copy groups: whichever plans pick the representatives, the copies they charge
never exceed the copies a plan holds at any time point (so the bound stays valid), the plan that
picked them is charged exactly, and the priced problem's cost of a plan is its time plus the
prices times its node usages and charged copies."""
from __future__ import annotations

import itertools
import os
import sys

import numpy as np
import pytest

from costmodel.problem import evaluate
from costmodel.profile import step_sum
from solvers.lagrange import CopyTerms, relaxed_problem
from solvers.local.costs import LocalCosts

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import random_problem  # noqa: E402


def _with_shared_copies(rng, p):
    """``p`` plus 2-4 random copy groups of 1-4 members each (mostly made by a collective, so
    that several members extend one copy; readers may share a step or precede the producer's)."""
    from dataclasses import replace

    from costmodel.edge_memory import CopyGroups
    k, groups = p.num_strategies, []
    for _ in range(int(rng.integers(2, 5))):
        u = int(rng.integers(p.num_nodes))
        members = [(v, int(rng.integers(0, 6)), rng.random(int(k[v])) < 0.6, rng.random(int(k[u])) < 0.25)
                   for v in rng.integers(p.num_nodes, size=int(rng.integers(1, 5))).tolist()]
        early = () if rng.random() < 0.25 else (int(rng.integers(0, 3)), rng.random(int(k[u])) < 0.6)
        groups.append((u, float(rng.integers(1, 30)), members, *early))
    return replace(p, edge_memory=CopyGroups.from_lists(groups))


def _copies_profile(p, lc, s) -> np.ndarray:
    lo, hi, b = p.edge_memory.intervals(np.asarray(s, dtype=np.int64))
    return step_sum(np.searchsorted(lc.times, lo), np.searchsorted(lc.times, hi), b, len(lc.times))


@pytest.mark.parametrize("seed", range(16))
def test_charged_copies_are_below_the_held_copies_for_every_plan(seed):
    rng = np.random.default_rng(900 + seed)
    p = _with_shared_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    lc = LocalCosts(p)
    terms = CopyTerms(p, lc.times)
    T = len(lc.times)
    plans = [list(s) for s in itertools.product(*[range(int(k)) for k in p.num_strategies])]
    picks = [(None,), (plans[int(rng.integers(len(plans)))],),
             (plans[int(rng.integers(len(plans)))], plans[int(rng.integers(len(plans)))])]
    lam = rng.random(T) * (rng.random(T) < 0.7)
    for pick in picks:
        start, sr = terms.representatives(*pick)
        q = relaxed_problem(p, lc, terms, lam, start, sr)
        for s in plans:
            x = np.asarray(s, dtype=np.int64)
            low = terms.low_profile(x, start, sr, T)
            full = _copies_profile(p, lc, s)
            assert np.all(low <= full + 1e-9)
            node = lc.profile_of(lc.live_usage[lc.offs[:-1] + x])
            want = evaluate(p.with_usage_limit(None), s).total + float(lam @ (node + low))
            assert evaluate(q, s).total == pytest.approx(want, rel=1e-9, abs=1e-9)
        if pick[0] is not None:        # the first picking plan: charged exactly
            x = np.asarray(pick[0], dtype=np.int64)
            assert np.allclose(terms.low_profile(x, start, sr, T), _copies_profile(p, lc, pick[0]))



@pytest.mark.parametrize("seed", range(4))
def test_copy_terms_keep_only_chargeable_entries(seed):
    """``CopyTerms`` keeps only the (member, strategy pair) entries a price can charge (the terms are
    outer products of masks, mostly 0: gpt 7b h100-2x8 keeps 3.5 M of 86.5 M); each kept entry names
    its member, whose edge block holds it. The priced costs of every plan stay exact (the test above)."""
    rng = np.random.default_rng(900 + seed)
    p = _with_shared_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    terms = CopyTerms(p, LocalCosts(p).times)
    k = p.num_strategies
    dense = int(np.sum(k[terms.u] * k[terms.v]))
    assert len(terms.pos) == len(terms.ev) == len(terms.sv) == len(terms.member) < dense
    assert np.all((terms.ev != 0) | (terms.sv != 0))
    assert np.all(np.diff(terms.member) >= 0) and terms.member.max() < len(terms.v)
