"""A collated micro-batch whose tokens differ from the lengths it was planned with is refused, naming the sample:
the planner's memory and time figures come from dataset.lengths() (one process, the real planner)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.api import set_manager
from dcp.planner import CPU_SMALL, analytic_table
from dcp.runtime.data import SyntheticTokenDataset
from dcp.runtime.exchange import DataMismatchError
from tests.dist._runtime_cases import planner_setup


class UnderReported(SyntheticTokenDataset):
    """lengths() says sample 5 is 3 tokens shorter than what it collates to."""

    def lengths(self):
        out = list(super().lengths())
        out[5] -= 3
        return out


def _manager(dataset_cls):
    model, data, config, _ = planner_setup(1)
    config = config.replace(planning=dataclasses.replace(config.planning, mem_capacity_gib=0.05))
    data = dataset_cls(list(data.lengths()), vocab_size=model.config.vocab_size, seed=3)
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=(1, 2), max_micro_batch_size=4,
                           world_size=1, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    return set_manager(model, data, config, table=table, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_an_under_reporting_dataset_is_refused_naming_the_sample():
    mgr = _manager(UnderReported)
    with pytest.raises(DataMismatchError, match=r"sample 5 collated to (\d+) tokens, lengths\(\) said \d+.*lengths\(\)"):
        for batch in mgr.get_data_iter():
            mgr.train_micro_batch(batch)


def test_a_truthful_dataset_trains_its_epoch():
    mgr = _manager(SyntheticTokenDataset)
    seen = sum(len(batch.sample_ids) for batch in mgr.get_data_iter() if mgr.train_micro_batch(batch) is not None)
    assert seen == len(mgr.dataset) and mgr.epoch == 1
