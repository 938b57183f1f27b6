"""The packing's fast paths give what the plain forms give: a window longest first (``packing.longest_first``: a
mask over the epoch's order or a sort) and the head's group (``build._has_head``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.build import _has_head
from dcp.planner.group import Group
from dcp.planner.packing import DENSE_WINDOW, longest_first


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


def test_has_head_marks_the_one_group_holding_it():
    groups = [Group(1, 0, 1.0, [5, 6]), Group(2, 0, 1.0, [7, 3]), Group(1, 0, 1.0, [8])]
    assert _has_head(groups, 3) == [False, True, False]
    assert _has_head(groups, 9) == [False, False, False]


@pytest.mark.parametrize("world", [8, 512])  # with swaps and only the adding (from BULK_MIN_RANKS)
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
