"""Every sample exactly once across a resume, and the loop's misuses named, on one process (W = 1)
through the real planner; the multi-process resumes (other world sizes) are tests/dist/test_resume.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.api import set_manager
from dcp.runtime.contracts import ForwardContractError
from dcp.runtime.position import PositionError
from dcp.runtime.step import ManagerError
from tests.dist._runtime_cases import planner_setup


def other_table(table):
    """The same model's table as re-profiled on other nodes: short groups slower, long ones faster."""
    rows = [dataclasses.replace(r, t_f_s=r.t_f_s * (3.0 if r.seq_group < 2 else 0.5),
                                t_b_s=r.t_b_s * (3.0 if r.seq_group < 2 else 0.5)) for r in table.rows]
    return table.with_rows(rows)


def setup():
    """planner_setup's model and data on one rank, with the memory for its longest samples at SP = 1."""
    from dcp.planner import CPU_SMALL, analytic_table

    model, dataset, config, _ = planner_setup(1)
    config = config.replace(planning=dataclasses.replace(config.planning, mem_capacity_gib=0.05, gmax=2,
                                                          samples_per_step=4))  # 6 steps of the 24 samples
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=(1,), max_micro_batch_size=4,
                           world_size=1, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    return model, dataset, config, table


def manager(table_fn=lambda t: t, forward_fn=None, data=None):
    model, dataset, config, table = setup()
    mgr = set_manager(model, data or dataset, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      table=table_fn(table), forward_fn=forward_fn)
    return mgr


def train(mgr, max_steps=None) -> list[list[int]]:
    steps = []
    for batch in mgr.get_data_iter(max_steps=max_steps):
        if not steps or steps[-1][0] != mgr.plan.step or mgr.plan.sample_ids != steps[-1][1]:
            steps.append((mgr.plan.step, mgr.plan.sample_ids))
        mgr.train_micro_batch(batch)
    return [list(ids) for _, ids in steps]


def logged(caplog, capfd) -> str:
    """What the dcp logger printed (it writes to stderr; pytest may capture it as a log record instead)."""
    return caplog.text + capfd.readouterr().err


def test_a_resume_with_another_table_replans_the_rest_and_trains_each_sample_once(caplog, capfd):
    first = manager()
    before = train(first, max_steps=2)
    state = first.state_dict()
    assert state["samples_done"] == sum(len(s) for s in before) and state["epoch"] == 0
    resumed = manager(other_table)
    resumed.load_state_dict(state)
    caplog.set_level("INFO", logger="dcp")
    capfd.readouterr()
    after = train(resumed)
    trained = sorted(i for step in before + after for i in step)
    assert trained == list(range(len(resumed.lengths)))  # each sample exactly once
    err = logged(caplog, capfd)
    done = sum(len(s) for s in before)
    assert resumed.epoch == 1 and f"{done} of 24 samples are trained" in err
    assert f"the other {24 - done} are planned again" in err
    # the interrupted plan's own remainder would have been another order: the resume really re-planned
    uninterrupted = train(manager())
    assert before + after != uninterrupted


def test_a_resume_with_nothing_changed_continues_the_same_plan(caplog, capfd):
    full = train(manager())
    first = manager()
    before = train(first, max_steps=2)
    resumed = manager()
    resumed.load_state_dict(first.state_dict())
    caplog.set_level("INFO", logger="dcp")
    capfd.readouterr()
    after = train(resumed)
    assert before + after == full and "the same plan continues after its 2 finished steps" in logged(caplog, capfd)


def test_a_checkpoint_of_another_dataset_or_past_the_epochs_end_is_refused():
    from dcp.runtime.data import SyntheticTokenDataset

    first = manager()
    train(first, max_steps=1)
    state = first.state_dict()
    lengths = list(first.lengths)
    lengths[0] += 1
    other = manager(data=SyntheticTokenDataset(lengths, vocab_size=first.model.config.vocab_size, seed=3))
    with pytest.raises(PositionError, match="checkpoint was saved on another dataset"):
        other.load_state_dict(state)
    past = manager()
    past.load_state_dict({**state, "position": {**state["position"], "steps": 999}})
    with pytest.raises(PositionError, match=r"epoch 0 step 999 is past the epoch's end \(its plan has \d+ steps\)"):
        train(past)


def test_a_forward_fn_returning_a_mean_is_refused_at_the_first_forward():
    def mean_loss(model, batch, ctx):
        loss, count = model(batch, ctx)
        return loss / count  # the common habit: a mean, no count

    mgr = manager(forward_fn=mean_loss)
    with pytest.raises(ForwardContractError, match=r"returned a 0-dim loss \(a mean\?\) with no token count"):
        train(mgr)


def test_a_second_forward_with_gradients_is_named_and_a_no_grad_one_is_not_counted():
    mgr = manager()
    for batch in mgr.get_data_iter(max_steps=2):
        with torch.no_grad():
            mgr.engine(batch)  # a logging forward: not counted, no error
        mgr.train_micro_batch(batch)
    assert len(mgr.step_stats) >= 1 and all(s.count > 0 for s in mgr.step_stats)
    mgr = manager()
    with pytest.raises(ManagerError, match=r"micro-batch 1/\d+ of epoch 0 step 0 ran its forward twice with "
                                           r"gradients.*one forward and one backward per micro-batch"):
        for batch in mgr.get_data_iter():
            mgr.engine(batch)
            mgr.train_micro_batch(batch)


def test_a_second_get_data_iter_after_a_break_mid_step_says_what_happened():
    mgr = manager()
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch)
        loss = mgr.engine(batch)
        mgr.engine.backward(loss)
        break  # left inside the step, before its engine.step()
    with pytest.raises(ManagerError) as info:
        next(iter(mgr.get_data_iter()))
    msg = str(info.value)
    assert "get_data_iter() was called again after the previous one was left inside epoch 0 step 0" in msg
    assert "get_data_iter(max_steps=N)" in msg and "target_counts" not in msg


def test_a_break_before_any_forward_of_a_step_restarts_it_cleanly():
    mgr = manager()
    for _ in mgr.get_data_iter():
        break  # nothing ran
    trained = train(mgr)
    assert sorted(i for step in trained for i in step) == list(range(len(mgr.lengths)))


def test_a_new_loop_closes_an_earlier_one_still_referenced_before_it_reads_the_dataset():
    """An iterator kept after leaving it before any forward (``it = get_data_iter(); next(it)``) is closed when a
    new get_data_iter() starts: its prefetch thread no longer reads the dataset beside the new loop, and its
    threads end. A loop left after a forward is still refused, and kept."""
    import inspect
    import threading
    import time

    from dcp.runtime.data import SyntheticTokenDataset

    model, dataset, config, table = setup()

    class Counting(SyntheticTokenDataset):
        busy = most = 0
        lock = threading.Lock()

        def __getitem__(self, i):
            with self.lock:
                Counting.busy += 1
                Counting.most = max(Counting.most, Counting.busy)
            try:
                time.sleep(0.01)
                return super().__getitem__(i)
            finally:
                with self.lock:
                    Counting.busy -= 1

    data = Counting(dataset.lengths(), vocab_size=model.config.vocab_size)
    config = config.replace(advanced=dataclasses.replace(config.advanced, prefetch="on"))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    before = set(threading.enumerate())
    old = mgr.get_data_iter()
    next(old)  # left at a step's first micro-batch, before its forward, and kept
    its_threads = [t for t in threading.enumerate() if t not in before]
    assert {t.name for t in its_threads} >= {"dcp-collate"}
    trained = train(mgr)
    assert inspect.getgeneratorstate(old) == inspect.GEN_CLOSED
    assert Counting.most == 1  # one reader at a time: the old loop's prefetch stopped before the new one read
    assert sorted(i for step in trained for i in step) == list(range(len(data)))
    for t in its_threads:
        t.join(timeout=10)
    assert not [t.name for t in its_threads if t.is_alive()]

    kept = mgr.get_data_iter()
    batch = next(kept)
    mgr.optimize_dynamics(batch)
    mgr.engine(batch)  # a forward of the step: its gradients would be partly accumulated
    with pytest.raises(ManagerError, match="left inside epoch 1 step 0"):
        next(mgr.get_data_iter())
    assert inspect.getgeneratorstate(kept) == inspect.GEN_SUSPENDED


def test_set_manager_refuses_a_table_of_another_model():
    from dcp.planner import CPU_SMALL, analytic_table
    from dcp.planner.table import TableError

    model, dataset, config, _ = setup()
    shallow = dataclasses.replace(config.model, num_layers=config.model.num_layers + 2)
    table = analytic_table(shallow, config.profiling.seq_group_edges, sp_sizes=(1,), max_micro_batch_size=4,
                           world_size=1, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    with pytest.raises(TableError, match=rf"has num_layers \({shallow.num_layers}\), but the model .* has "
                                         rf"{config.model.num_layers}: profile this model"):
        set_manager(model, dataset, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    meta = dataclasses.replace(setup()[3].meta, extra={"model_hash": "another-model"})
    from dcp.planner.table import ProfileTable

    with pytest.raises(TableError, match=r"measured for model config hash 'another-model'"):
        set_manager(model, dataset, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    table=ProfileTable(setup()[3].rows, meta))


def test_a_custom_plan_source_cannot_replan_and_says_so():
    from dcp.planner import plan_epoch

    model, dataset, config, table = setup()
    plans = plan_epoch(dataset.lengths(), table, config, 1)
    first = set_manager(model, dataset, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        plans=lambda e: plans)
    train(first, max_steps=1)
    other = config.replace(planning=dataclasses.replace(config.planning, seed=7))  # the plan's inputs changed
    resumed = set_manager(model, dataset, other, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                          plans=lambda e: plans)
    resumed.load_state_dict(first.state_dict())
    with pytest.raises(ManagerError, match=r"a custom plans= source cannot do: resume with the world size"):
        train(resumed)


@pytest.mark.parametrize("state, needle", [
    ([1, 2], "checkpoint state (list) is not a dict"),
    ({"global_step": -1}, "checkpoint global_step (-1) is not an integer >= 0"),
])
def test_a_malformed_checkpoint_state_is_refused(state, needle):
    with pytest.raises(PositionError) as info:
        manager().load_state_dict(state)
    assert needle in str(info.value)
