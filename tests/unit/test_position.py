"""The data position: which samples an epoch trained, the plan segment, and every way a checkpoint's
position is refused. Plans here are stand-ins with a ``sample_id_array``, as the manager's are."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dcp.runtime.position import EpochPosition, PositionError, segment_key


def chunked(step_size: int):
    """A plan source: ``ids`` in steps of ``step_size`` samples (in the given order)."""
    def plans(ids):
        for k in range(0, len(ids), step_size):
            yield SimpleNamespace(step=k // step_size, sample_id_array=np.asarray(ids[k:k + step_size]))
    return plans


def run(pos: EpochPosition, key: str, source, steps: int | None = None) -> list[list[int]]:
    it, skip, _ = pos.resume(lambda base: key, source)
    trained = []
    for plan in it:
        if steps is not None and len(trained) == steps:
            break
        pos.record(plan.sample_id_array, plan.step)
        trained.append(plan.sample_id_array.tolist())
    return trained


def test_same_plan_resumes_after_its_finished_steps():
    pos = EpochPosition.start(0, 10)
    first = run(pos, "k", chunked(3), steps=2)
    again = EpochPosition.from_state(pos.to_state(), 10)
    rest = run(again, "k", chunked(3))
    assert first + rest == run(EpochPosition.start(0, 10), "k", chunked(3))
    assert again.done.all()


def test_another_key_replans_the_samples_left_and_trains_each_once():
    pos = EpochPosition.start(0, 11)
    first = run(pos, "table A, W=2", chunked(4), steps=1)
    again = EpochPosition.from_state(pos.to_state(), 11)
    it, skip, replanned = again.resume(lambda base: "table B, W=3", chunked(2))
    assert skip == 0 and replanned
    rest = []
    for plan in it:
        again.record(plan.sample_id_array, plan.step)
        rest.append(plan.sample_id_array.tolist())
    trained = sorted(i for step in first + rest for i in step)
    assert trained == list(range(11))  # each sample exactly once
    # a second resume inside the new segment, at its own key, replays that segment
    third = EpochPosition.from_state(again.to_state(), 11)
    assert third.resume(lambda base: "table B, W=3", chunked(2))[1] == len(rest)


def test_a_sample_trained_twice_in_an_epoch_raises():
    pos = EpochPosition.start(0, 4)
    pos.record(np.array([0, 1]), 0)
    with pytest.raises(PositionError, match=r"epoch 0 step 1 trained samples \[1\] a second time"):
        pos.record(np.array([1, 2]), 1)
    with pytest.raises(PositionError, match=r"epoch 0 step 1 trained samples a sample twice in the step a second"):
        pos.record(np.array([3, 2, 3]), 1)  # a repeat inside one step
    assert pos.done.tolist() == [True, True, False, False] and pos.steps == 1  # the refused step left no mark
    pos.record(np.array([2, 3]), 1)
    assert pos.done.all() and pos.steps == 2


def test_a_position_past_the_epochs_end_is_refused():
    pos = EpochPosition.start(0, 6)
    run(pos, "k", chunked(3))
    state = pos.to_state() | {"steps": 5}
    it, skip, _ = EpochPosition.from_state(state, 6).resume(lambda base: "k", chunked(3))
    with pytest.raises(PositionError, match=r"epoch 0 step 5 is past the epoch's end \(its plan has 2 steps\)"):
        list(it)


def test_a_position_whose_steps_trained_other_samples_is_refused():
    pos = EpochPosition.start(0, 6)
    run(pos, "k", chunked(3), steps=1)
    it, _, _ = EpochPosition.from_state(pos.to_state(), 6).resume(lambda base: "k", lambda ids: chunked(3)(ids[::-1]))
    with pytest.raises(PositionError, match=r"step 1: the plan's first 1 steps trained other samples"):
        next(it)


@pytest.mark.parametrize("change, needle", [
    ({"num_samples": 7}, "covers 7 samples, this dataset has 6: resume with the dataset"),
    ({"format": 1}, "format (1) is not 2"),
    ({"done": b"\x00\x00"}, "done (2 bytes) is not a bitmap of the dataset's 6 samples"),
    ({"done": b"\xff"}, "done marks samples beyond the dataset's 6"),
    ({"base": b"\xfc", "done": b"\x00"}, "samples of its plan's base are not done"),
    ({"steps": -1}, "field 'steps' is -1, not an int >= 0"),
    ({"epoch": "0"}, "field 'epoch' is '0', not an int >= 0"),
    ({"key": None}, "field 'key' is None, not a str"),
])
def test_a_damaged_or_foreign_position_is_refused_with_one_line(change, needle):
    pos = EpochPosition.start(0, 6)
    with pytest.raises(PositionError) as info:
        EpochPosition.from_state(pos.to_state() | change, 6)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_segment_key_covers_data_done_samples_and_inputs():
    base = np.zeros(4, dtype=bool)
    k = segment_key("data", base, ["table", "w2"])
    assert k == segment_key("data", base.copy(), ["table", "w2"])
    assert k != segment_key("data", base, ["table", "w3"])
    assert k != segment_key("other data", base, ["table", "w2"])
    done = base.copy()
    done[1] = True
    assert k != segment_key("data", done, ["table", "w2"])
    assert segment_key("d", base, ["ab", "c"]) != segment_key("d", base, ["a", "bc"])


def test_plans_of_the_samples_left_are_mapped_back_to_dataset_ids():
    from dcp.config import DCPConfig, PlanningConfig
    from dcp.planner import analytic_table_for, plan_epoch
    from dcp.runtime.position import plan_inputs, remapped

    config = DCPConfig(planning=PlanningConfig(mem_capacity_gib=0.05, sp_sizes=(1, 2), ranks_per_node=2))
    table = analytic_table_for(config, 2, sp_sizes=(1, 2))
    lengths = [100 + 37 * i % 900 for i in range(40)]
    left = np.array([i for i in range(40) if i % 3])  # a third of the epoch is done
    plans = list(remapped(plan_epoch([lengths[i] for i in left], table, config, 2), left))
    trained = sorted(i for p in plans for i in p.sample_ids)
    assert trained == left.tolist()  # each sample left exactly once, under its dataset id
    assert all(int(n) == lengths[i] for p in plans for i, n in zip(p.sample_ids, p.seq_len_array, strict=True))
    a, b = plan_inputs(table, config, 2, "1"), plan_inputs(table, config, 4, "1")
    assert a != b and a == plan_inputs(table, config, 2, "1") and a != plan_inputs(None, config, 2, "1")


def test_the_plan_key_holds_the_advanced_fields_that_change_plans_and_no_other():
    import dataclasses

    from dcp.config import DCPConfig, PlanningConfig
    from dcp.config_advanced import PLANNING_FIELDS
    from dcp.runtime.position import plan_inputs

    config = DCPConfig(planning=PlanningConfig(sp_sizes=(1, 2)))
    base = plan_inputs(None, config, 2, "1")
    for name, value in (("bucket_sp_size", 2), ("default_batch", "method"), ("micro_batch_tokens", "off"),
                        ("lookahead_samples", 64), ("packed_token_budget", 4096), ("grad_sync_s", 0.5)):
        assert name in PLANNING_FIELDS
        changed = config.replace(advanced=dataclasses.replace(config.advanced, **{name: value}))
        assert plan_inputs(None, changed, 2, "1") != base, name
    for name, value in (("strict_cache", True), ("peer_timeout_s", 60.0), ("stats_every", 1)):
        assert name not in PLANNING_FIELDS  # a run's checks and diagnostics: its plans are the same
        same = config.replace(advanced=dataclasses.replace(config.advanced, **{name: value}))
        assert plan_inputs(None, same, 2, "1") == base, name


def test_checked_steps_are_marked_and_saved():
    pos = EpochPosition.start(0, 10)
    pos.record_checked(np.array([1, 4]))
    pos.record_checked(np.array([0, 7]))
    assert pos.steps == 2 and np.flatnonzero(pos.done).tolist() == [0, 1, 4, 7]
    state = pos.to_state()  # a checkpoint holds every finished step
    assert np.flatnonzero(EpochPosition.from_state(state, 10).done).tolist() == [0, 1, 4, 7]
