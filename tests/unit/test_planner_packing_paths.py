"""The packing's fast paths give what the plain forms give: a window longest first (``packing.longest_first``: a
mask over the epoch's order or a sort), a packing's positions per kind (``rounds.columns``: one dominant kind by a
mask, else one stable sort), the head's group (``build._has_head``) and a round's least loaded groups
(``rounds._least_loaded``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.build import _has_head
from dcp.planner.packing import DENSE_WINDOW, longest_first
from dcp.planner.rounds import columns


def _epoch_order(times: np.ndarray) -> SimpleNamespace:
    by_rank = np.argsort(-times, kind="stable")
    rank_desc = np.empty(len(times), dtype=np.int64)
    rank_desc[by_rank] = np.arange(len(times))
    return SimpleNamespace(by_rank=by_rank, rank_desc=rank_desc)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 400), share=st.sampled_from([1.0, 0.5, 1 / DENSE_WINDOW, 0.05, 0.01]), seed=st.integers(0, 9))
def test_longest_first_is_the_sorted_places_dense_or_not(n, share, seed):
    """Windows above and below 1/DENSE_WINDOW of the epoch (the mask and the sort), times with ties."""
    rng = np.random.default_rng(seed)
    ep = _epoch_order(rng.integers(0, 5, n).astype(np.float64))
    win = np.sort(rng.choice(n, max(1, int(share * n)), replace=False))
    assert longest_first(ep, win).tolist() == ep.by_rank[np.sort(ep.rank_desc[win])].tolist()


@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 3, 12])), min_size=1, max_size=6),
       n=st.integers(1, 3000), dominant=st.floats(0.0, 1.0), seed=st.integers(0, 9))
def test_columns_are_every_kinds_positions_ascending(kinds, n, dominant, seed):
    """One kind holding most positions (the mask path) or none (the stable sort): each kind's positions, ascending,
    keyed p x n_r + r in ascending order, and the gathered p and r."""
    rng = np.random.default_rng(seed)
    mb_p = np.asarray([p for p, _ in kinds], dtype=np.int64)
    mb_r = np.asarray([r for _, r in kinds], dtype=np.int64)
    pick = np.where(rng.random(n) < dominant, 0, rng.integers(0, len(kinds), n))  # kind 0 holds `dominant`
    ep = SimpleNamespace(mb_p_np=mb_p, mb_r_np=mb_r)
    arr = pick.astype(np.int64)
    cols = columns(ep, arr)
    n_r = int(mb_r[arr].max()) + 1
    code = mb_p[arr] * n_r + mb_r[arr]
    want = {int(c): np.flatnonzero(code == c).tolist() for c in np.unique(code)}
    assert cols.n_r == n_r and list(cols.by_kind) == sorted(want)
    assert {k: v.tolist() for k, v in cols.by_kind.items()} == want
    assert cols.p.tolist() == mb_p[arr].tolist() and cols.r.tolist() == mb_r[arr].tolist()


def test_has_head_marks_the_one_group_holding_it():
    groups = [[1, 0, 1.0, [5, 6]], [2, 0, 1.0, [7, 3]], [1, 0, 1.0, [8]]]
    assert _has_head(groups, 3) == [False, True, False]
    assert _has_head(groups, 9) == [False, False, False]


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 0.25, 1.0, 1.5, 2.0, 7.5]), min_size=1, max_size=40),
       distinct=st.booleans(), long=st.booleans(), m=st.integers(1, 5000), seed=st.integers(0, 9))
def test_least_loaded_is_the_stable_order_cut(values, distinct, long, m, seed):
    """``rounds._least_loaded`` (numpy's sort unless two loads tie) is ``argsort_float(loads)[:m]``: short and
    long (>= SMALL) loads, with ties and without."""
    from dcp.planner.rounds import _least_loaded
    from dcp.planner.sorting import SMALL, argsort_float

    rng = np.random.default_rng(seed)
    loads = np.resize(np.asarray(values), SMALL + len(values)) if long else np.asarray(values)
    if distinct:
        loads = loads + rng.random(len(loads))
    assert _least_loaded(loads.copy(), m).tolist() == argsort_float(loads)[:m].tolist()
