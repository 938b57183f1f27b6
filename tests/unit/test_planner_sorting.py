"""The planner's fast stable orders (``dcp.planner.sorting``) equal numpy's stable argsort, ties included, and
StepPlan.from_arrays(owned=True) freezes the arrays handed over instead of copying them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.plan import StepPlan
from dcp.planner.sorting import SMALL, argsort_float, argsort_int

_FLOATS = st.lists(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, 2.25, 7.0, 1e-9, 3e8]), max_size=80)


@settings(max_examples=200, deadline=None)
@given(values=_FLOATS, sort_first=st.booleans(), negate=st.booleans())
def test_argsort_float_is_the_stable_argsort(values, sort_first, negate):
    """Short arrays (numpy's stable sort as is) and long ones (the fast paths: values repeated past SMALL)."""
    x = np.asarray(values, dtype=np.float64)
    assert argsort_float(x).tolist() == np.argsort(x, kind="stable").tolist()
    x = np.resize(x, SMALL + 3 * len(x)) if len(x) else x
    if sort_first:  # the identity path: already sorted (ties in every run)
        x = np.sort(x)
    if negate:
        x = -x
    assert argsort_float(x).tolist() == np.argsort(x, kind="stable").tolist()


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.sampled_from([0, 1, 2, 6, 2**15 - 1, 2**15, 2**40]), max_size=80), small=st.booleans())
def test_argsort_int_is_the_stable_argsort(values, small):
    """Both paths: the radix sort (values below 2**15) and the integer keys (any larger value)."""
    x = np.asarray([v for v in values if v < 2**15] if small else values, dtype=np.int64)
    assert argsort_int(x).tolist() == np.argsort(x, kind="stable").tolist()
    x = np.resize(x, SMALL + 3 * len(x)) if len(x) else x  # the fast paths
    assert argsort_int(x).tolist() == np.argsort(x, kind="stable").tolist()


def test_argsorts_of_large_random_arrays():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, 20_000).astype(np.float64) / 7  # many ties
    assert np.array_equal(argsort_float(x), np.argsort(x, kind="stable"))
    y = rng.random(20_000)  # distinct
    assert np.array_equal(argsort_float(y), np.argsort(y, kind="stable"))
    z = rng.integers(0, 4096, 20_000)
    assert np.array_equal(argsort_int(z), np.argsort(z, kind="stable"))


def _arrays():
    return dict(first_rank=np.array([0, 2, 3]), sp_size=np.array([2, 1, 1]), recompute_layers=np.array([1, 0, 0]),
                ga_steps=np.array([2, 0, 1]), mb_time_s=np.array([2.0, 1.5, 1.0]), mb_seq_group=np.array([1, 2, 0]),
                mb_size=np.array([2, 1, 3]), sample_ids=np.array([4, 7, 1, 0, 2, 3]),
                seq_lens=np.array([30, 20, 90, 5, 6, 7]))


@pytest.mark.parametrize("owned", [False, True])
def test_from_arrays_owned_freezes_in_place_else_copies(owned):
    arrays = _arrays()
    plan = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **arrays, owned=owned)
    assert plan == StepPlan.from_arrays(0, 0, 4, "dcp-intra", **_arrays())
    assert (plan.sample_id_array is arrays["sample_ids"]) is owned
    assert arrays["sample_ids"].flags.writeable is not owned  # handed over: read-only; else the caller's own
    assert not plan.sample_id_array.flags.writeable and not plan.mb_time_s.flags.writeable


def test_from_arrays_owned_copies_what_it_cannot_take():
    """A view (it shares its base's memory) or another dtype is copied even when handed over."""
    arrays = _arrays()
    base = np.array([9, 4, 7, 1, 0, 2, 3])
    arrays["sample_ids"] = base[1:]
    arrays["mb_time_s"] = np.array([2, 1.5, 1], dtype=np.float32)
    plan = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **arrays, owned=True)
    assert base.flags.writeable and plan.sample_id_array.base is None and plan.mb_time_s.dtype == np.float64
    assert plan.sample_ids == (4, 7, 1, 0, 2, 3)


def _place_from_zero(sizes, world_size, ranks_per_node):
    """place_largest_first as it was: every group wider than a node searched from rank 0."""
    from dcp.planner import placement

    real = placement._place_cross
    try:
        placement._place_cross = lambda p, nodes, used, gaps, w, rpn, lo=0: real(p, nodes, used, gaps, w, rpn, 0)
        return placement.place_largest_first(sizes, world_size, ranks_per_node)
    finally:
        placement._place_cross = real


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=4, max_size=4), world=st.sampled_from([40, 64, 100, 128]),
       rpn=st.sampled_from([4, 8]))
def test_wide_groups_resume_their_search_and_place_as_from_rank_zero(counts, world, rpn):
    """Groups wider than a node (16, 32) resume after the last one placed: the same starts and free segments as
    searching from rank 0 for each (a start that failed fails again), partial nodes and gaps included."""
    from dcp.planner.placement import place_largest_first

    sizes = [p for p, c in zip((32, 16, 8, 2), counts, strict=True) for _ in range(c)]
    assert place_largest_first(sizes, world, rpn) == _place_from_zero(sizes, world, rpn)


@settings(max_examples=200, deadline=None)
@given(times=st.lists(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, 4.5]), max_size=40),
       rooms=st.lists(st.sampled_from([0.4, 1.0, 2.5, 3.0, 5.0]), max_size=30),
       others=st.lists(st.integers(0, 39), max_size=10), seed=st.integers(0, 5))
def test_the_adding_on_arrays_takes_what_the_list_form_takes(times, rooms, others, seed):
    """improve's adding from 512 ranks (arrays, gone links) picks, group after group, the same left-overs at the
    same times as the list form (bisect, popping what is claimed), with ids claimed elsewhere in between."""
    from dcp.planner.group import Group
    from dcp.planner.improve import _add_longest, _improve_group

    rng = np.random.default_rng(seed)
    ts = np.sort(np.asarray(times, dtype=np.float64))
    ids = rng.permutation(len(ts)).astype(np.int64)
    claimed_a: set[int] = set()
    claimed_b: set[int] = set()
    entry = (ts, ids, {})
    ts_l, ids_l = ts.tolist(), ids.tolist()
    for n, room in enumerate(rooms):
        if n < len(others):  # a kind of another r claims one in between
            claimed_a.add(others[n])
            claimed_b.add(others[n])
        ga, gb = Group(1, 0, 10.0 - room, [99]), Group(1, 0, 10.0 - room, [99])
        _add_longest(ga, entry, claimed_a, 10.0)
        _improve_group((), gb, ts_l, ids_l, claimed_b, 10.0, head=99, swaps=False)
        assert ga == gb and claimed_a == claimed_b
