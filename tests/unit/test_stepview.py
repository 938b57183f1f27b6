"""The per-rank view of a step (dcp.runtime.stepview): what the plan-ahead thread prepares is what the training
thread computed from the plan before (remapped ids, group, digest, N_step, tokens, the samples trained), and a
plan that would train a sample twice in the epoch is refused before its step runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dcp.planner import EpochPlanner, plan_epoch
from dcp.planner.ahead import PlanAhead
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.position import EpochPosition, PositionError, remapped
from dcp.runtime.stepview import RankStep, StepViews, rank_steps
from dcp.runtime.weighting import step_normaliser
from tests.unit.test_planner_assemble import lengths_for, make

W = 12


def _views(rank: int, counts: np.ndarray, mode: str, **kw) -> StepViews:
    return StepViews(rank=rank, world_size=W, target_counts=counts, loss_weighting=mode, **kw)


@pytest.mark.parametrize("mode", ["tokens", "samples"])
def test_the_view_is_what_the_training_thread_computed_from_the_plan(mode):
    cfg, table = make(W, rpn=4)
    lengths = lengths_for(500, seed=5)
    counts = np.asarray(lengths, dtype=np.int64) - 1
    # a resumed epoch's rest: the samples not yet trained, planned as a dataset of their own
    ids = np.flatnonzero(np.arange(len(lengths)) % 3 != 0)
    sub = [int(lengths[i]) for i in ids]
    old = list(remapped(plan_epoch(sub, table, cfg, W), ids))
    assert len(old) > 1
    for rank in (0, 5, W - 1):
        views = _views(rank, counts, mode, ids=ids)
        got = [views(p) for p in plan_epoch(sub, table, cfg, W)]
        assert [v.plan for v in got] == old  # the same plans, their ids the dataset's
        for v, plan in zip(got, old, strict=True):
            assert v.group == plan.group_of(rank)
            assert v.digest == plan.digest()
            assert v.n_step == step_normaliser(plan, counts, mode)
            assert v.tokens == plan.tokens
            assert v.trained.tolist() == sorted(plan.sample_ids)
            assert v.sample_id_array is v.trained  # what a resume's skipped steps mark: the checked samples
            assert (v.epoch, v.step, v.world_size) == (plan.epoch, plan.step, plan.world_size)
            assert (v.idle_ratio, v.summary) == (plan.idle_ratio_gpu, plan.summary())  # the step's stats


def test_the_whole_dataset_in_order_is_not_remapped():
    """A fresh epoch's ids are 0..n-1: the views keep each plan as it is (no remap), with the same results."""
    cfg, table = make(W, rpn=4)
    lengths = lengths_for(200, seed=3)
    counts = np.asarray(lengths, dtype=np.int64) - 1
    plans = plan_epoch(list(lengths), table, cfg, W)
    whole = _views(2, counts, "tokens", ids=np.arange(len(lengths)))
    plain = _views(2, counts, "tokens")
    assert whole.ids is None
    for plan in plans:
        a, b = whole(plan), plain(plan)
        assert a.plan is plan and (a.group, a.digest, a.n_step) == (b.group, b.digest, b.n_step)
        assert np.array_equal(a.trained, b.trained)
    # a subset, or the same ids in another order, is still remapped
    assert _views(2, counts, "tokens", ids=np.arange(len(lengths))[::-1].copy()).ids is not None
    assert _views(2, counts, "tokens", ids=np.arange(len(lengths) - 1)).ids is not None


def test_recording_the_views_marks_what_recording_the_plans_marked():
    cfg, table = make(W, rpn=4)
    lengths = lengths_for(300, seed=2)
    plans = plan_epoch(list(lengths), table, cfg, W)
    old, new = EpochPosition.start(0, len(lengths)), EpochPosition.start(0, len(lengths))
    views = _views(3, np.asarray(lengths), "tokens", done=new.done)
    for plan in plans:
        old.record(plan.sample_id_array, plan.step)
        new.record_checked(views(plan).trained)
        assert np.array_equal(old.done, new.done) and old.steps == new.steps
    assert new.done.all()


def _step(step: int, *ids: int, world: int = 1, lengths=None) -> StepPlan:
    mbs = tuple(MicroBatch(sample_ids=(i,), seq_lens=(4 if lengths is None else int(lengths[i]),), seq_group=0)
                for i in ids)
    return StepPlan(epoch=0, step=step, world_size=world, method="dcp-intra",
                    groups=(GroupPlan(first_rank=0, sp_size=world, recompute_layers=0, micro_batches=mbs),))


def _one_rank(n: int, **kw) -> StepViews:
    return StepViews(rank=0, world_size=1, target_counts=np.full(n, 3), loss_weighting="tokens", **kw)


def test_a_sample_planned_twice_in_the_epoch_is_refused_before_its_step():
    views = _one_rank(6)
    views(_step(0, 0, 1))
    with pytest.raises(PositionError, match=r"epoch 0 step 1 plans samples \[1\] a second time in this epoch"):
        views(_step(1, 1, 2))
    with pytest.raises(PositionError, match="step 1 plans samples a sample twice in the step a second time"):
        views(_step(1, 3, 2, 3))
    assert views(_step(1, 2, 3)).trained.tolist() == [2, 3]  # a refused plan left no mark


def test_samples_trained_before_the_views_and_remapped_ids_count():
    done = np.array([False, True, False, False])
    with pytest.raises(PositionError, match=r"plans samples \[1\] a second time"):
        _one_rank(4, done=done)(_step(0, 0, 1))
    assert not done[0]  # the views keep their own copy: the position is marked only as steps finish
    # over the sub-dataset ids [2, 5, 7]: the repeat is named by its dataset id
    views = _one_rank(8, ids=np.array([2, 5, 7]))
    assert views(_step(0, 0, 2)).plan.sample_ids == (2, 7)
    with pytest.raises(PositionError, match=r"plans samples \[7\] a second time"):
        views(_step(1, 2))


def test_a_sample_id_outside_the_dataset_is_refused():
    with pytest.raises(PositionError, match=r"epoch 0 step 0 plans sample ids outside \[0, 3\) \(from 1 to 3\)"):
        _one_rank(3)(_step(0, 1, 3))


def test_a_plan_of_another_world_size_gets_no_group():
    view = _one_rank(4)(_step(0, 0, 1, world=2))
    assert view.group is None and view.trained is None and view.plan.world_size == 2


def test_rank_steps_prepares_plain_plans_and_passes_views_through():
    views = _one_rank(4)
    ready = _one_rank(4)(_step(0, 0))
    got = list(rank_steps([ready, _step(1, 1)], views))
    assert got[0] is ready and isinstance(got[1], RankStep) and got[1].plan.sample_ids == (1,)


def test_plan_ahead_prepares_each_plan_on_its_thread_and_raises_its_errors_in_order():
    cfg, table = make(W, rpn=4)
    lengths = lengths_for(200, seed=1)
    threads = []

    def prepare(plan):
        threads.append(threading.current_thread().name)
        if plan.step == 2:
            raise PositionError("step 2 is refused")
        return plan.step

    with PlanAhead(EpochPlanner(list(lengths), table, cfg, W), depth=2, prepare=prepare) as ahead:
        assert [next(ahead), next(ahead)] == [0, 1]
        with pytest.raises(PositionError, match="step 2 is refused"):
            next(ahead)
    assert set(threads) == {"dcp-plan-ahead"}


def test_the_manager_prepares_get_data_iters_plans_per_rank():
    from tests.unit.test_resume_exactly_once import manager, train

    mgr = manager()
    train(mgr, max_steps=1)
    ids = mgr._loop.position.remaining()  # the rest of the epoch, as a resume with another table plans it
    plain = list(mgr.epoch_plans(0, ids))
    views = list(mgr.epoch_plans(0, ids, per_rank=True))
    assert [v.plan for v in views] == plain and all(isinstance(v, RankStep) for v in views)
    assert [v.group for v in views] == [p.group_of(0) for p in plain]
    assert [v.n_step for v in views] == [step_normaliser(p, mgr._target_counts_np, "tokens") for p in plain]


@pytest.mark.parametrize("prefetch", ["off", "on"])
def test_a_custom_plan_source_that_repeats_a_sample_is_refused_before_the_step_trains_it(prefetch):
    """With prefetching the bad plan is pulled during step 1's last micro-batch; it is raised where the loop
    without prefetching meets it, after step 1's sync (which ranks idle in step 1 wait in), not before."""
    import dataclasses

    import torch

    from dcp.api import set_manager
    from tests.unit.test_resume_exactly_once import setup

    model, dataset, config, _ = setup()
    config = config.replace(advanced=dataclasses.replace(config.advanced, prefetch=prefetch))
    n = dataset.lengths()  # a plan source plans with the data's lengths (the loop checks each collated batch)
    plans = [_step(0, 0, 1, lengths=n), _step(1, 2, lengths=n), _step(2, 1, 3, lengths=n)]
    mgr = set_manager(model, dataset, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans)
    trained = []
    with pytest.raises(PositionError, match=r"epoch 0 step 2 plans samples \[1\] a second time"):
        for batch in mgr.get_data_iter():
            trained.append(batch.sample_ids)
            mgr.train_micro_batch(batch)
    assert trained == [(0,), (1,), (2,)] and mgr.global_step == 2  # step 2 never ran
