"""The packing's fast paths give what the plain forms give: a window longest first (``packing.longest_first``: a
mask over the epoch's order or a sort), a packing's positions per kind (``rounds.columns``: one dominant kind by a
mask, else one stable sort), the head's group (``build._has_head``) and a round's least loaded groups
(``rounds._least_loaded``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.build import _has_head
from dcp.planner.group import Group
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
    keyed p x n_r + r in ascending order; one kind in every seq_group's setting (no gather) gives the same."""
    rng = np.random.default_rng(seed)
    mb_p = np.asarray([p for p, _ in kinds], dtype=np.int64)
    mb_r = np.asarray([r for _, r in kinds], dtype=np.int64)
    pick = np.where(rng.random(n) < dominant, 0, rng.integers(0, len(kinds), n))  # kind 0 holds `dominant`
    # the seq_groups' primary settings: one kind in all of them takes the path without a gather
    settings = {g: SimpleNamespace(sp_size=p, recompute_layers=r) for g, (p, r) in enumerate(kinds)}
    ep = SimpleNamespace(mb_p_np=mb_p, mb_r_np=mb_r, settings=settings)
    arr = pick.astype(np.int64)
    cols = columns(ep, arr)
    n_r = int(mb_r[arr].max()) + 1
    code = mb_p[arr] * n_r + mb_r[arr]
    want = {int(c): np.flatnonzero(code == c).tolist() for c in np.unique(code)}
    assert cols.n_r == n_r and list(cols.by_kind) == sorted(want)
    assert {k: v.tolist() for k, v in cols.by_kind.items()} == want


def test_has_head_marks_the_one_group_holding_it():
    groups = [Group(1, 0, 1.0, [5, 6]), Group(2, 0, 1.0, [7, 3]), Group(1, 0, 1.0, [8])]
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


def _take_loop(xs, ps, rs, fulls, forced, world_size):
    """``rounds._take`` ask by ask (its form before the prefix in numpy)."""
    free, gp, gr, sp, sr = world_size, [], [], [], []
    for x, p, r, full in zip(xs.tolist(), ps.tolist(), rs.tolist(), fulls.tolist(), strict=True):
        if p > free:
            continue
        if full or x in forced:
            gp.append(p)
            gr.append(r)
            free -= p
            if not free:
                break
        else:
            sp.append(p)
            sr.append(r)
    for p, r in zip(sp, sr, strict=True):
        if p <= free:
            gp.append(p)
            gr.append(r)
            free -= p
    return gp, gr


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 60), world=st.integers(1, 64), full_share=st.floats(0.0, 1.0), seed=st.integers(0, 99))
def test_take_is_the_ask_by_ask_grant(n, world, full_share, seed):
    """``rounds._take`` (the first pass's prefix at once, then ask by ask) grants what the plain loop grants: asks
    of mixed p, fillable or not, forced positions, worlds they over- and under-fill."""
    from dcp.planner.rounds import _take

    rng = np.random.default_rng(seed)
    xs = np.sort(rng.integers(0, 40, n))
    ps = rng.choice([1, 2, 4, 8], n).astype(np.int64)
    rs = rng.choice([0, 3], n).astype(np.int64)
    fulls = rng.random(n) < full_share
    forced = set(rng.integers(0, 40, 2).tolist())
    assert _take(xs, ps, rs, fulls, forced, world) == _take_loop(xs, ps, rs, fulls, forced, world)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 0.25, 1.0, 1.5, 2.0, 7.5]), min_size=1, max_size=60),
       long=st.booleans(), share=st.floats(0.0, 0.3), seed=st.integers(0, 99))
def test_reorder_is_the_stable_order_after_the_moves(values, long, share, seed):
    """``rounds._reorder`` (the unmoved groups kept, the moved merged in) is the stable sort of the new loads:
    loads with ties (moved onto others' loads too), short and long (>= SMALL), few moved or many; None (the
    caller sorts) exactly where more than REORDER_TIES moved loads equal unmoved ones."""
    from dcp.planner.rounds import REORDER_TIES, _reorder
    from dcp.planner.sorting import SMALL

    rng = np.random.default_rng(seed)
    loads = np.resize(np.asarray(values), SMALL + len(values)) if long else np.asarray(values)
    order = np.argsort(loads, kind="stable")
    moved = np.flatnonzero(rng.random(len(loads)) < share)
    rng.shuffle(moved)
    loads[moved] += rng.choice([0.25, 0.5, 1.0, 1.5], len(moved))  # onto other loads: ties with unmoved groups
    unmoved = np.delete(loads, moved)
    ties = int(np.isin(loads[moved], unmoved).sum())
    got = _reorder(loads, order, moved)
    assert (got is None) == (ties > REORDER_TIES)  # it gives up only on many ties (the caller then sorts)
    if got is not None:
        assert got.tolist() == np.argsort(loads, kind="stable").tolist()


def _rounds_plain(loads, tt, limit):
    """``rounds._rounds`` with a stable sort of every load per round (its form before ``_reorder``)."""
    n, G, pos = len(tt), len(loads), 0
    dest = np.full(n, -1, dtype=np.int64)
    while pos < n:
        m = min(G, n - pos)
        tgt = np.argsort(loads, kind="stable")[:m]
        new = loads[tgt] + tt[pos : pos + m]
        ok = new <= limit
        loads[tgt[ok]] = new[ok]
        dest[pos : pos + m][ok] = tgt[ok]
        pos += m
        if limit - loads.min() < tt[-1]:
            break
    return dest, loads


@settings(max_examples=100, deadline=None)
@given(groups=st.integers(1, 1500), n=st.integers(1, 6000), limit=st.floats(1.0, 40.0), discrete=st.booleans(),
       seed=st.integers(0, 99))
def test_rounds_are_the_rounds_of_a_full_sort_each(groups, n, limit, discrete, seed):
    """``rounds._rounds`` (the order kept round by round) places every item where a stable sort per round does:
    discrete times (ties: the merge gives up) or not (it merges), groups that fill or not."""
    from dcp.planner.rounds import _rounds

    rng = np.random.default_rng(seed)
    tt = -np.sort(-(rng.choice([0.25, 0.5, 1.0, 2.0, 3.5], n) if discrete else 4 * rng.random(n) ** 3))
    loads = rng.choice([0.0, 0.5, 1.0], groups)
    dest, after = _rounds(loads.copy(), tt, limit)
    want, want_after = _rounds_plain(loads.copy(), tt, limit)
    assert dest.tolist() == want.tolist() and after.tolist() == want_after.tolist()


@pytest.mark.parametrize("world", [8, 512])  # with swaps (the best fit) and only the adding (the numpy packer)
def test_idle_floor_bounds_what_the_local_search_reaches(world, monkeypatch):
    """``improve.idle_floor`` (what ``_try_targets`` skips a target's local search by) is at most the idle every
    packing of an epoch has after ``improve``: it is a bound, so the skip cannot change a plan."""
    import dcp.planner.step as step_mod
    from dcp.planner import EpochPlanner
    from dcp.planner.improve import idle, idle_floor
    from tests.unit.test_planner_assemble import lengths_for, make

    real = step_mod.improve
    seen: list[tuple[float, float]] = []

    def checked(ep, prog, win, groups, head):
        floor = idle_floor(ep, groups)
        real(ep, prog, win, groups, head)
        seen.append((floor, idle(groups, ep.world_size)))

    monkeypatch.setattr(step_mod, "improve", checked)
    cfg, table = make(world)
    for _ in EpochPlanner(lengths_for(60 * world, seed=3), table, cfg, world):
        pass
    assert seen and all(floor <= after + 1e-12 for floor, after in seen)
    assert any(floor > 0 for floor, _ in seen)  # not a vacuous bound
