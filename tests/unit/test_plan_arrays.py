"""StepPlan held as arrays: the GroupPlan view, lookups, predicted cost, digest, equality, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan


def _groups():
    return (
        GroupPlan(0, 2, 1, (MicroBatch((4, 7), (30, 20), 1, 2.0), MicroBatch((1,), (90,), 2, 1.5))),
        GroupPlan(2, 1, 0, ()),
        GroupPlan(3, 1, 0, (MicroBatch((0, 2, 3), (5, 6, 7), 0, 1.0),)),
    )


def _arrays_unsorted():
    """The same decisions as _groups(), with the groups given out of rank order."""
    return dict(first_rank=[3, 0, 2], sp_size=[1, 2, 1], recompute_layers=[0, 1, 0], ga_steps=[1, 2, 0],
                mb_time_s=[1.0, 2.0, 1.5], mb_seq_group=[0, 1, 2], mb_size=[3, 2, 1],
                sample_ids=[0, 2, 3, 4, 7, 1], seq_lens=[5, 6, 7, 30, 20, 90])


def test_from_arrays_sorts_groups_and_keeps_their_micro_batches():
    plan = StepPlan.from_arrays(0, 3, 4, "dcp-intra", **_arrays_unsorted())
    assert plan.first_rank.tolist() == [0, 2, 3]
    assert plan.groups == _groups()
    assert plan == StepPlan(0, 3, 4, "dcp-intra", _groups())
    assert plan.digest() == StepPlan(0, 3, 4, "dcp-intra", _groups()).digest()
    assert plan.sample_ids == (4, 7, 1, 0, 2, 3)


def test_group_of_is_built_alone_and_agrees_with_the_groups():
    lazy = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **_arrays_unsorted())
    alone = [lazy.group_of(r) for r in range(4)]  # before the full view exists
    assert lazy.group_of(1) is alone[0]  # one object per group
    assert alone == [g for g in _groups() for _ in range(g.sp_size)]
    assert [lazy.group_index_of(r) for r in range(4)] == [0, 0, 1, 2]


def test_predicted_cost_from_the_arrays():
    plan = StepPlan(0, 0, 4, "dcp-inter", _groups())
    assert plan.group_times_s.tolist() == [3.5, 0.0, 1.0]
    assert plan.step_time_s == 3.5
    assert plan.tokens == 158 and plan.samples == 6
    # GPU-weighted: (2 x 0 + 1 x 3.5 + 1 x 2.5) / (4 x 3.5); per busy batch: (0 + 2.5) / (2 x 3.5)
    assert plan.idle_ratio_gpu == pytest.approx(6.0 / 14.0)
    assert plan.idle_ratio_batch == pytest.approx(2.5 / 7.0)
    assert plan.summary() == "sp=[2,1,1] ga=[2,0,1] recompute=[1,0,0]"
    empty = StepPlan(0, 0, 2, "dcp-inter", (GroupPlan(0, 1, 0, ()), GroupPlan(1, 1, 0, ())))
    assert (empty.step_time_s, empty.idle_ratio_gpu, empty.idle_ratio_batch) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(("field", "index", "value"), [
    ("sample_ids", 1, 9),        # another sample
    ("mb_size", None, None),     # the same samples cut into micro-batches elsewhere
    ("recompute_layers", 0, 2),  # another recompute depth
    ("sp_size", None, None),     # other groups
])
def test_digest_follows_every_decision_but_not_the_times(field, index, value):
    base = _arrays_unsorted()
    ref = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **base).digest()
    changed = {k: list(v) for k, v in base.items()}
    if field == "mb_size":
        changed["mb_size"] = [2, 3, 1]
    elif field == "sp_size":
        changed.update(first_rank=[3, 0, 1], sp_size=[1, 1, 2])
    else:
        changed[field][index] = value
    assert StepPlan.from_arrays(0, 0, 4, "dcp-intra", **changed).digest() != ref
    retimed = dict(base, mb_time_s=[9.0, 9.0, 9.0])
    assert StepPlan.from_arrays(0, 0, 4, "dcp-intra", **retimed).digest() == ref
    assert StepPlan.from_arrays(0, 1, 4, "dcp-intra", **base).digest() != ref  # another step


def test_plan_is_immutable_picklable_and_remappable():
    plan = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **_arrays_unsorted())
    with pytest.raises(ValueError, match="read-only"):
        plan.sample_id_array[0] = 5
    assert pickle.loads(pickle.dumps(plan)) == plan
    moved = plan.with_sample_ids(np.asarray(plan.sample_id_array) + 100)
    assert moved.sample_ids == (104, 107, 101, 100, 102, 103)
    assert moved.groups[0].micro_batches[0].seq_lens == (30, 20)
    assert moved != plan and moved.digest() != plan.digest()
    assert plan != "a plan" and hash(plan) == hash(pickle.loads(pickle.dumps(plan)))


def test_arrays_that_disagree_in_length_are_refused():
    bad = dict(_arrays_unsorted(), mb_size=[3, 2, 2])
    with pytest.raises(ValueError, match="StepPlan arrays disagree in length: ga_steps must sum"):
        StepPlan.from_arrays(0, 0, 4, "dcp-intra", **bad)
    with pytest.raises(ValueError, match="StepPlan leaves rank 1 without a group"):
        StepPlan.from_arrays(0, 0, 4, "dcp-intra", **dict(_arrays_unsorted(), sp_size=[1, 1, 1],
                                                          first_rank=[3, 0, 2]))


def test_arrays_are_copied_groups_keep_their_order_and_bad_sizes_are_named():
    ids = np.array([0, 2, 3, 4, 7, 1])
    plan = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **dict(_arrays_unsorted(), sample_ids=ids))
    ids[0] = 99  # the caller's array stays the caller's
    assert ids.flags.writeable and plan.sample_ids == (4, 7, 1, 0, 2, 3)
    unsorted = StepPlan(0, 0, 4, "dcp-intra", _groups()[::-1])
    moved = unsorted.with_sample_ids(np.arange(6))
    assert moved.first_rank.tolist() == [3, 2, 0]  # the plan's own order, not re-sorted
    copy = pickle.loads(pickle.dumps(unsorted))
    assert copy == unsorted and not copy.sample_id_array.flags.writeable
    with pytest.raises(ValueError, match="every sp_size >= 1: world_size 4, group 1 has sp_size 0"):
        StepPlan(0, 0, 4, "dcp-intra", (GroupPlan(0, 4, 0, ()), GroupPlan(2, 0, 0, ())))


# ----- per-micro-batch recompute (StepPlan.mb_recompute_layers) --------------------------------------------


def _own_r_groups():
    """_groups() with the group of p = 2 at r = 3 and its first micro-batch running its own r = 1."""
    g = _groups()
    first = g[0]
    return (GroupPlan(0, 2, 3, (first.micro_batches[0]._replace(recompute_layers=1), first.micro_batches[1])),
            *g[1:])


def test_micro_batches_of_their_own_recompute_in_arrays_views_digest_and_pickle():
    plan = StepPlan(0, 0, 4, "dcp-intra", _own_r_groups())
    assert plan.mb_recompute_layers.tolist() == [1, 3, 0]
    arrays = dict(_arrays_unsorted(), recompute_layers=[0, 3, 0], mb_recompute_layers=[0, 1, 3])
    lazy = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **arrays)  # unsorted: the array follows its micro-batches
    assert lazy.mb_recompute_layers.tolist() == [1, 3, 0] and lazy == plan
    g0 = lazy.group_of(1)
    assert [g0.recompute_of(mb) for mb in g0.micro_batches] == [1, 3] and g0.recompute_layers == 3
    assert lazy.groups == plan.groups == _own_r_groups() and lazy.digest() == plan.digest()
    # the same decisions but every micro-batch at its group's r: another digest, not equal
    plain = StepPlan(0, 0, 4, "dcp-intra", (GroupPlan(0, 2, 3, _groups()[0].micro_batches), *_groups()[1:]))
    assert plain.mb_recompute_layers is None and plain.digest() != plan.digest() and plain != plan
    assert [plain.groups[0].recompute_of(mb) for mb in plain.groups[0].micro_batches] == [3, 3]
    copy = pickle.loads(pickle.dumps(lazy))
    assert copy == plan and copy.mb_recompute_layers.tolist() == [1, 3, 0]
    assert not copy.mb_recompute_layers.flags.writeable
    assert lazy.with_sample_ids(np.arange(6)).mb_recompute_layers.tolist() == [1, 3, 0]


def test_micro_batches_at_their_groups_recompute_leave_the_plan_as_without_the_field():
    # every micro-batch's r given, all equal to its group's: no array, the same digest and equality as before
    explicit = tuple(g._replace(micro_batches=tuple(mb._replace(recompute_layers=g.recompute_layers)
                                                     for mb in g.micro_batches)) for g in _groups())
    plan = StepPlan(0, 0, 4, "dcp-intra", explicit)
    ref = StepPlan(0, 0, 4, "dcp-intra", _groups())
    assert plan.mb_recompute_layers is None and plan == ref and plan.digest() == ref.digest()
    lazy = StepPlan.from_arrays(0, 0, 4, "dcp-intra", **_arrays_unsorted())
    assert all(mb.recompute_layers == -1 for g in lazy.groups for mb in g.micro_batches)


@pytest.mark.parametrize("bad", [[0, 1], [0, -1, 2]])
def test_bad_micro_batch_recompute_is_named(bad):
    with pytest.raises(ValueError, match=r"StepPlan mb_recompute_layers \(shape .*\) must hold one r >= 0 per "
                                         r"micro-batch \(3\)"):
        StepPlan.from_arrays(0, 0, 4, "dcp-intra", **dict(_arrays_unsorted(), mb_recompute_layers=bad))
