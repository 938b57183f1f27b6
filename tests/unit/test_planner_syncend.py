"""Sync-aware group ends (dcp.planner.syncend, advanced.grad_sync_s): the planner's sync rule is the simulator's,
the rewrite is off without a known sync (and with deepspeed, 2D data or from 512 ranks), and where on it keeps
every step's samples and memory and never ends a step later under the simulator's pricing."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import AdvancedConfig, ConfigError, ModelShapeConfig
from dcp.planner import plan_epoch
from dcp.planner.analytic import grad_sync_time_s
from dcp.planner.source import epoch_input
from dcp.planner.stream import TimeLookup
from dcp.planner.syncend import SyncEnd, measured_sync_s, sync_end_s
from dcp.planner.table import ProfileTable
from dcp.sim.cluster import DDP_BUCKET_BYTES, exposed_sync_groups_s, row_lookup, step_cost

W = 32


@cache
def _text(ds: str = "text", method: str = "dcp-intra"):
    """A small epoch at bench peers' setup (t1d-5b on 32 simulated H200, global batch, token packs)."""
    from dcp.bench.peers import dataset_setup, method_config

    lengths, sc, table, target = dataset_setup(ds, W, 0, num_samples=4000)
    off = method_config(sc, method, 0, target)
    on = method_config(sc, method, 0, target, W)
    return lengths.tokens, sc, table, off, on


@settings(max_examples=80, deadline=None)
@given(groups=st.lists(st.tuples(st.floats(0.5, 5.0), st.floats(0.0, 1.0)), min_size=1, max_size=12),
       sync=st.floats(0.01, 1.0), buckets=st.integers(1, 50))
def test_the_planners_sync_end_is_the_simulators(groups, sync, buckets):
    ends = np.asarray([e for e, _ in groups])
    backs = np.asarray([min(b, e) for e, b in groups])
    grad_bytes = buckets * DDP_BUCKET_BYTES
    sim = float(ends.max()) + exposed_sync_groups_s(sync, ends, backs, grad_bytes)
    planner = max(sync_end_s(float(e), float(b), sync, buckets) for e, b in zip(ends, backs, strict=True))
    assert planner == pytest.approx(sim, rel=1e-9, abs=1e-12)


def test_grad_sync_s_must_be_non_negative():
    assert AdvancedConfig().grad_sync_s == 0.0
    with pytest.raises(ConfigError, match=r"advanced\.grad_sync_s.*-0\.5.*>= 0"):
        AdvancedConfig(grad_sync_s=-0.5)


def test_off_without_a_sync_with_deepspeed_on_2d_data_and_from_512_ranks():
    lengths, _, table, off, on = _text()
    assert SyncEnd.of(epoch_input(lengths, table, off, W), TimeLookup(table)) is None
    assert SyncEnd.of(epoch_input(lengths, table, on, W), TimeLookup(table)) is not None
    deepspeed = on.replace(runtime=dataclasses.replace(on.runtime, engine="deepspeed"))
    assert SyncEnd.of(epoch_input(lengths, table, deepspeed, W), TimeLookup(table)) is None
    shapes = [(1, int(n)) for n in lengths]
    assert SyncEnd.of(epoch_input(lengths, table, on, W, shapes=shapes), TimeLookup(table)) is None
    assert SyncEnd.of(epoch_input(lengths, table, on, 512), TimeLookup(table)) is None
    # a model whose gradients fit one ddp bucket: its all-reduce starts after every backward, nothing to hide
    tiny = on.replace(model=ModelShapeConfig(num_heads=48, hidden_size=96))
    assert tiny.model.num_params * tiny.model.param_bytes < DDP_BUCKET_BYTES
    assert SyncEnd.of(epoch_input(lengths, table, tiny, W), TimeLookup(table)) is None
    # off: exactly the plans of a config without the field
    base = off.replace(advanced=dataclasses.replace(off.advanced, grad_sync_s=0.0))
    assert [p.digest() for p in plan_epoch(lengths, table, base, W)] == \
        [p.digest() for p in plan_epoch(lengths, table, off, W)]


def _with_meta(table, **meta):
    return ProfileTable(table.rows, dataclasses.replace(table.meta, **meta))


def test_a_profile_measured_at_this_world_size_gives_the_sync_when_the_config_does_not():
    """0 in the config: the profiler's figure (dcp.profiler.update, agreed over the job's ranks) of a table profiled
    for these ranks with the ddp engine; a figure in the config wins; another world size or engine gives none."""
    lengths, _, table, off, on = _text()

    def sync_of(tab, cfg=off):
        end = SyncEnd.of(epoch_input(lengths, tab, cfg, W), TimeLookup(tab))
        return None if end is None else end.sync_s

    measured = _with_meta(table, world_size=W, extra={**table.meta.extra, "grad_sync_s": 0.25, "update_engine": "ddp"})
    assert measured_sync_s(measured, W) == 0.25 and sync_of(measured) == 0.25
    assert sync_of(measured, on) == pytest.approx(on.advanced.grad_sync_s)  # the config's figure first
    assert measured_sync_s(measured, 2 * W) == 0.0
    assert sync_of(_with_meta(measured, world_size=2 * W)) is None  # profiled for another job
    assert sync_of(_with_meta(measured, extra={**measured.meta.extra, "update_engine": "deepspeed"})) is None
    assert sync_of(_with_meta(measured, extra={**measured.meta.extra, "grad_sync_s": 0.0})) is None  # one rank's
    assert sync_of(_with_meta(measured, extra={})) is None  # analytic tables hold none
    # planning with the measured figure is planning with the same figure in the config
    told = off.replace(advanced=dataclasses.replace(off.advanced, grad_sync_s=0.25))
    assert [p.digest() for p in plan_epoch(lengths, measured, off, W)] == \
        [p.digest() for p in plan_epoch(lengths, measured, told, W)]


def _costs(plans, sc, table, cfg):
    rows = row_lookup(table)
    sync = grad_sync_time_s(cfg.model, sc.hardware, W)
    grad_bytes = cfg.model.num_params * cfg.model.param_bytes
    return [step_cost(p, None, rows, sync_s=sync, optimizer_s=0.0, edges=table.seq_group_edges,
                      overlap_grad_bytes=grad_bytes) for p in plans]


@pytest.mark.parametrize(("ds", "method"), [("text", "dcp-intra"), ("text", "dcp-inter"), ("t1d-long", "dcp-inter")])
def test_each_step_keeps_its_samples_and_memory_and_ends_no_later(ds, method):
    """(t1d-long, dcp-inter: samples moved to a group of another p, the donor's rest priced at its own p.)"""
    lengths, sc, table, off, on = _text(ds, method)
    assert on.advanced.grad_sync_s == pytest.approx(grad_sync_time_s(sc.model, sc.hardware, W))
    before, after = plan_epoch(lengths, table, off, W), plan_epoch(lengths, table, on, W)
    assert len(before) == len(after)
    changed = 0
    for b, a, cb, ca in zip(before, after, _costs(before, sc, table, off), _costs(after, sc, table, on), strict=True):
        # the same samples in the same groups' ranks; only which micro-batch of a group of a p holds them moves
        assert sorted(a.sample_id_array.tolist()) == sorted(b.sample_id_array.tolist())
        assert a.tokens == b.tokens and np.array_equal(a.first_rank, b.first_rank)
        assert np.array_equal(a.sp_size, b.sp_size)
        assert ca.peak_mem_bytes <= on.planning.mem_capacity_bytes
        assert ca.step_time_s <= cb.step_time_s + 1e-9
        if a.digest() != b.digest():
            changed += 1
            assert ca.step_time_s < cb.step_time_s
        # a group's r is at least each of its micro-batches' (a runtime applying the group's r still fits)
        if a.mb_recompute_layers is not None:
            assert np.all(a.mb_recompute_layers <= np.repeat(a.recompute_layers, a.ga_steps))
        assert np.all(a.mb_time_s > 0) and np.all(a.mb_size > 0) and np.all(a.mb_seq_group >= 0)
    assert changed > 0  # short token packs at p = 1 expose the sync here: the rewrite acts
    # a truth table re-times each micro-batch at its seq_group's row of b >= its samples: one exists for every one
    rows, times = row_lookup(table), TimeLookup(table)
    for a in after:
        step_cost(a, times, rows, sync_s=0.1, optimizer_s=0.0, edges=table.seq_group_edges)
