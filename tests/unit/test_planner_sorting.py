"""The planner's fast stable orders (``dcp.planner.sorting``) equal numpy's stable argsort, ties included, and
StepPlan.from_arrays(owned=True) freezes the arrays handed over instead of copying them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.plan import StepPlan
from dcp.planner.sorting import argsort_float, argsort_int

_FLOATS = st.lists(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, 2.25, 7.0, 1e-9, 3e8]), max_size=80)


@settings(max_examples=200, deadline=None)
@given(values=_FLOATS, sort_first=st.booleans(), negate=st.booleans())
def test_argsort_float_is_the_stable_argsort(values, sort_first, negate):
    x = np.asarray(values, dtype=np.float64)
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
