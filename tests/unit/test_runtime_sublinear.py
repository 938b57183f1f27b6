"""The manager at scale, on one rank: nothing beyond the first step's plan is computed before it
runs (no second planning pass for the epoch check), and the next micro-batch is collated ahead on a
background thread without changing a single batch or gradient."""

from __future__ import annotations

import pytest
import torch

from dcp.api import set_manager
from dcp.config import AdvancedConfig, DCPConfig, RuntimeConfig
from dcp.models import T1DConfig, Transformer1D
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.data import SyntheticTokenDataset
from dcp.runtime.prefetch import BatchPrefetcher

LENGTHS = [6, 9, 4, 7, 5, 8, 3, 10, 6, 5, 7, 4]  # the plans below train each sample at most once


def _plans(per_step: int, steps: int, lens: list[int]) -> list[StepPlan]:
    out = []
    for s in range(steps):
        ids = [(s * per_step + k) % len(lens) for k in range(per_step)]
        mbs = tuple(MicroBatch(sample_ids=(i,), seq_lens=(lens[i],), seq_group=0) for i in ids)
        out.append(StepPlan(epoch=0, step=s, world_size=1, method="dcp-intra",
                            groups=(GroupPlan(first_rank=0, sp_size=1, recompute_layers=0, micro_batches=mbs),)))
    return out


def _manager(plans_of_epoch, *, prefetch: bool = True, log_every: int = 10):
    prefetch = "on" if prefetch else "off"
    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset(LENGTHS, vocab_size=model.config.vocab_size)
    config = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(log_every=log_every),
                       advanced=AdvancedConfig(prefetch=prefetch))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=plans_of_epoch)
    return mgr, model


class _Counting:
    """A plan source that counts the plans pulled from it."""

    def __init__(self, plans: list[StepPlan]) -> None:
        self.plans, self.pulled = plans, 0

    def __call__(self, epoch: int):
        for plan in self.plans:
            self.pulled += 1
            yield plan


@pytest.mark.parametrize(("per_step", "prefetch", "pulled"), [(2, True, 1), (2, False, 1), (1, False, 1),
                                                                (1, True, 2)])
def test_nothing_beyond_the_first_plan_is_planned_before_the_first_step(per_step, prefetch, pulled):
    # Before: the epoch check planned the whole epoch (here 6 steps) and then planned it again to run it.
    source = _Counting(_plans(per_step, 6, LENGTHS))
    mgr, _ = _manager(source, prefetch=prefetch)
    batches = mgr.get_data_iter()
    first = next(batches)
    # step 0's plan; with prefetching and one micro-batch in step 0, also step 1's (its first micro-batch
    # is collated while step 0's trains)
    assert source.pulled == pulled
    mgr.train_micro_batch(first)
    for batch in batches:
        mgr.train_micro_batch(batch)
    assert source.pulled == 6 and mgr.global_step == 6
    assert mgr._exchange.exchanges == 1 + 1  # the first step's check and the end of the epoch (log_every 10)


def _run(prefetch: bool):
    mgr, model = _manager(lambda e: _plans(3, 4, LENGTHS), prefetch=prefetch, log_every=1)
    seen = []
    for batch in mgr.get_data_iter():
        seen.append((batch.sample_ids, batch.inputs.clone(), batch.targets.clone()))
        mgr.train_micro_batch(batch)
    return seen, [p.detach().clone() for p in model.parameters()], [s.loss for s in mgr.step_stats], mgr


def test_prefetching_changes_no_batch_and_no_update():
    seen_on, params_on, losses_on, mgr_on = _run(True)
    seen_off, params_off, losses_off, mgr_off = _run(False)
    assert mgr_on._loop.prefetched == len(seen_on) - 1  # every micro-batch but the epoch's first came ahead
    assert mgr_off._loop.prefetched == 0
    assert [s[0] for s in seen_on] == [s[0] for s in seen_off]
    for (_, x_on, y_on), (_, x_off, y_off) in zip(seen_on, seen_off, strict=True):
        assert torch.equal(x_on, x_off) and torch.equal(y_on, y_off)
    assert losses_on == losses_off
    for a, b in zip(params_on, params_off, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Broken(SyntheticTokenDataset):
    def __getitem__(self, index):
        if index == 3:
            raise KeyError(f"sample {index} is unreadable")
        return super().__getitem__(index)


def test_a_collation_error_on_the_prefetch_thread_surfaces_in_the_loop():
    data = _Broken(LENGTHS, vocab_size=16)
    fetch = BatchPrefetcher(data, torch.device("cpu"), enabled=True)
    worker = fetch._thread
    assert worker.name == "dcp-collate" and worker.is_alive()
    try:
        assert fetch.take((0,)).sample_ids == (0,)
        fetch.want([(3,)])
        with pytest.raises(KeyError, match="sample 3 is unreadable"):
            fetch.take((3,))
        fetch.want([(1,)])
        assert fetch.take((2,)).sample_ids == (2,)  # not the one ahead: collated here, in order
        assert fetch.prefetched == 0
        fetch.want([(4,)])
        assert fetch.take((4,)).sample_ids == (4,) and fetch.prefetched == 1
        fetch.want([(5,)])  # in flight when the loop ends: dropped
    finally:
        fetch.close()
    assert not worker.is_alive() and not fetch.enabled
    assert fetch.take((6,)).sample_ids == (6,)  # closed: collated on the calling thread


def test_a_wanted_micro_batch_is_collated_ahead_and_taken_from_the_worker():
    """want([next_ids]) after take(ids) starts collating next_ids while ids' batch trains; without a worker
    ``want`` is ignored and every batch is collated on the calling thread."""
    data = SyntheticTokenDataset(LENGTHS, vocab_size=16)
    fetch = BatchPrefetcher(data, torch.device("cpu"), enabled=True)
    try:
        assert fetch.take((0,)).sample_ids == (0,) and fetch.prefetched == 0
        fetch.want([(1,)])
        assert fetch.take((1,)).sample_ids == (1,) and fetch.prefetched == 1
        fetch.want([(2, 3)])
        assert fetch.take((2, 3)).sample_ids == (2, 3) and fetch.prefetched == 2
        assert fetch.take((4,)).sample_ids == (4,) and fetch.prefetched == 2  # nothing was ahead
    finally:
        fetch.close()
    off = BatchPrefetcher(data, torch.device("cpu"), enabled=False)
    assert off.take((0,)).sample_ids == (0,)
    off.want([(1,)])
    assert off.take((1,)).sample_ids == (1,)
    assert off.prefetched == 0
