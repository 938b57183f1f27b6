"""``dcp.set_manager``'s derived defaults for a model of the package (not HF): the profile fitted to the data's
lengths (the HF path's :func:`fit_profiling`), an explicit setting kept, and the default-optimizer line logged
once per job (rank 0), not by every rank."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dcp.api import set_manager
from dcp.config import DCPConfig, ProfilingConfig
from dcp.integrations.hf_defaults import edges_for, micro_batch_cap
from dcp.models import build_model
from dcp.runtime.data import SyntheticTokenDataset

LENGTHS = [40, 256, 97, 180, 33, 255, 128, 64]  # the README snippet's kind of data: every sample <= 256 tokens


def _manager(config=None, lengths=LENGTHS):
    model = build_model("t1d-tiny")
    data = SyntheticTokenDataset(lengths, vocab_size=model.config.vocab_size)
    return set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_default_profile_is_fitted_to_the_data_lengths():
    prof = _manager().config.profiling
    # before: the library default (512, 1024, 2048, 4096): a first run profiled lengths no sample has
    assert prof.seq_group_edges == edges_for(LENGTHS) == (64, 128, 256)
    assert prof.max_micro_batch_size == micro_batch_cap(prof.seq_group_edges) == 8


def test_default_profile_reaches_the_longest_sample():
    prof = _manager(lengths=[300, 6000, 1000]).config.profiling
    assert prof.seq_group_edges == (1024, 2048, 4096, 8192)  # the default stopped at 4096, below the data
    assert prof.max_micro_batch_size == micro_batch_cap((1024, 2048, 4096, 8192)) == 8


def test_explicit_profile_settings_are_kept():
    shape = build_model("t1d-tiny").config.shape()
    mine = DCPConfig(model=shape, profiling=ProfilingConfig(seq_group_edges=(512, 1024), max_micro_batch_size=2))
    prof = _manager(mine).config.profiling
    assert prof.seq_group_edges == (512, 1024) and prof.max_micro_batch_size == 2
    # edges set, cap left at its default: the cap is fitted to the user's edges
    edges_only = DCPConfig(model=shape, profiling=ProfilingConfig(seq_group_edges=(2048, 4096)))
    prof = _manager(edges_only).config.profiling
    assert prof.seq_group_edges == (2048, 4096) and prof.max_micro_batch_size == micro_batch_cap((2048, 4096)) == 2


FAKE_RANK = """
import logging, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from dcp.api import set_manager
from dcp.config import DCPConfig, ProfilingConfig
from dcp.models import build_model
from dcp.runtime.data import SyntheticTokenDataset
rank = int(sys.argv[1])
dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("dcp").addHandler(handler)
model = build_model("t1d-tiny")
# the profile set explicitly: nothing to fit, so no cache lookup (a collective the fake backend carries no data for)
config = DCPConfig(model=model.config.shape(), profiling=ProfilingConfig(seq_group_edges=(64,), max_micro_batch_size=2))
set_manager(model, SyntheticTokenDataset([64, 32, 48, 16], vocab_size=model.config.vocab_size), config)
print(sum("no optimizer given" in line for line in lines))
"""


@pytest.mark.parametrize("rank, count", [(0, 1), (1, 0)])
def test_default_optimizer_line_is_logged_by_rank_0_only(rank, count):
    out = subprocess.run([sys.executable, "-c", FAKE_RANK, str(rank)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) == count  # before: 1 on every rank
    assert "Set timeout is now only supported" not in out.stderr  # no timeout set on a fake world: no warning


def test_a_given_table_keeps_the_edges_it_was_made_with():
    """Fitting is for a run that profiles: a table passed in was priced at the config's edges, so they stay
    (a refit config would disagree with the table the planner prices from)."""
    from dcp.planner import CPU_SMALL, analytic_table

    model = build_model("t1d-tiny")
    data = SyntheticTokenDataset(LENGTHS, vocab_size=model.config.vocab_size)
    config = DCPConfig(model=model.config.shape())
    edges = config.profiling.seq_group_edges
    table = analytic_table(config.model, edges, sp_sizes=(1,), max_micro_batch_size=8, world_size=1,
                           hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    assert mgr.config.profiling.seq_group_edges == edges == ProfilingConfig().seq_group_edges


def test_a_table_cached_for_the_default_profile_is_used_not_refitted(tmp_path, monkeypatch):
    """`dcp profile` has no dataset to fit to: its table is cached under the default edges. A later
    set_manager(model, dataset) keeps the default edges when that table is in the cache (it found no table
    after the fit was added and silently re-profiled, or refused under advanced.strict_cache)."""
    import dataclasses

    from dcp.planner import analytic_table_for
    from dcp.planner.table import ProfileTable
    from dcp.profiler import cache
    from dcp.profiler.dual_layer import cache_key_for

    monkeypatch.chdir(tmp_path)
    model = build_model("t1d-tiny")
    config = DCPConfig(model=model.config.shape())
    key = cache_key_for(model, config, 1)
    table = analytic_table_for(config, 1)
    meta = dataclasses.replace(table.meta, model=key.model, hardware=key.hardware, dtype=key.dtype,
                               world_size=key.world_size, version=key.version)
    cache.store(cache.with_key(ProfileTable(table.rows, meta), key), config.profiling.cache_dir, key)
    mgr = _manager(config)
    assert mgr.config.profiling.seq_group_edges == ProfilingConfig().seq_group_edges
    assert not mgr.need_profile()  # the cached table is this run's
