"""Static shapes (bounded shapes, warm-up order) and the loader -> DCP planner adapter."""

from __future__ import annotations

import bisect
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import ConfigError, DCPConfig
from dcp.loaders import (
    Batch,
    LoadBalancedConfig,
    LoaderError,
    StaticShapeConfig,
    choose_boundaries,
    lockstep_steps,
    plan_samples,
    plan_static_shapes,
    step_samples,
)
from dcp.loaders.static_shapes import min_padding_boundaries


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 500), min_size=1, max_size=200),
    max_shapes=st.integers(1, 6),
    world_size=st.integers(1, 5),
    epoch=st.integers(0, 3),
)
def test_bounded_shapes_every_rank_meets_every_shape_first(lengths, max_shapes, world_size, epoch):
    cfg = StaticShapeConfig(max_shapes=max_shapes, max_tokens_per_batch=1024, pad_to_multiple_of=8)
    plan = plan_static_shapes(lengths, cfg, world_size, epoch)
    shapes = plan.shapes
    assert len(shapes) <= max_shapes and len(plan.boundaries) <= max_shapes
    # warm-up: step k gives every rank one micro-batch of the k-th shape, and covers all shapes
    warm = [{b.shape for b in step} for step in plan.steps[: plan.warmup_steps]]
    assert all(len(s) == 1 for s in warm)
    assert set().union(*warm) == shapes
    for rank in range(world_size):
        assert {b.shape for b in plan.for_rank(rank)[: plan.warmup_steps]} == shapes
    seen = []
    for step in plan.steps:
        assert len(step) == world_size
        for b in step:
            assert b.padded_tokens <= 1024 and b.size <= b.rows
            assert all(n <= b.padded_len for n in b.seq_lens) and b.padded_len in plan.boundaries
            seen += b.sample_ids
    assert sorted(seen) == list(range(len(lengths)))


def test_main_phase_steps_share_one_shape_and_epochs_differ():
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(5, 1, 3000), 1, 2048).astype(int).tolist()
    cfg = StaticShapeConfig(max_shapes=6, max_tokens_per_batch=4096)
    plan = plan_static_shapes(lengths, cfg, world_size=4)
    body = plan.steps[plan.warmup_steps :]
    mixed = [s for s in body if len({b.shape for b in s}) > 1]
    assert len(mixed) <= len(plan.boundaries)  # only the leftover steps at the end mix shapes
    assert all(s in body[-len(mixed):] for s in mixed)
    dummies = sum(1 for s in plan.steps for b in s if not b.sample_ids)
    assert dummies <= 4 * len(plan.boundaries)
    other = plan_static_shapes(lengths, cfg, world_size=4, epoch=1)
    assert other.steps != plan.steps and other.boundaries == plan.boundaries
    assert plan_static_shapes(lengths, cfg, world_size=4).steps == plan.steps  # deterministic


def _padding(lengths, edges):
    return sum(edges[bisect.bisect_left(edges, n)] - n for n in lengths)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=25), k=st.integers(1, 4), granule=st.sampled_from([1, 4]))
def test_derived_boundaries_minimise_padding(lengths, k, granule):
    edges = choose_boundaries(lengths, StaticShapeConfig(max_shapes=k, pad_to_multiple_of=granule))
    vals = sorted({-(-n // granule) * granule for n in lengths})
    assert len(edges) <= k and edges[-1] == vals[-1] and all(e % granule == 0 for e in edges)
    brute = min(_padding(lengths, tuple(sorted({*c, vals[-1]})))
                for r in range(k) for c in itertools.combinations(vals[:-1], r))
    assert _padding(lengths, edges) == brute


def test_boundaries_from_many_distinct_lengths_and_explicit_ones():
    lengths = list(range(1, 5001))
    edges = min_padding_boundaries(lengths, 4, 1, max_candidates=64)
    assert len(edges) == 4 and edges[-1] == 5000
    # uniform lengths: K equal buckets pad 1/K as much as one bucket does
    assert _padding(lengths, edges) < 0.26 * _padding(lengths, (5000,))
    lengths = list(range(1, 101))
    explicit = StaticShapeConfig(bucket_boundaries=(64, 128), pad_to_multiple_of=64)
    assert choose_boundaries(lengths, explicit) == (64, 128)
    plan = plan_static_shapes(lengths, explicit, world_size=2)
    assert {b.shape for s in plan.steps for b in s} == {(512, 64), (256, 128)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_shapes": 0}, r"static_shapes\.max_shapes \(0\) must be >= 1"),
        ({"max_tokens_per_batch": 0}, r"static_shapes\.max_tokens_per_batch \(0\) must be >= 1"),
        ({"pad_to_multiple_of": 0}, r"static_shapes\.pad_to_multiple_of \(0\) must be >= 1"),
        ({"seed": -1}, r"static_shapes\.seed \(-1\) must be >= 0"),
        ({"bucket_boundaries": (64, 32)}, r"static_shapes\.bucket_boundaries \(\[64, 32\]\) must be positive and strictly"),
        ({"bucket_boundaries": (8, 16, 24), "max_shapes": 2}, r"has 3 boundaries, more than static_shapes\.max_shapes \(2\)"),
        ({"bucket_boundaries": (8, 20)}, r"contains \[20\], not multiples of pad_to_multiple_of \(8\)"),
        ({"bucket_boundaries": (8, 64), "max_tokens_per_batch": 32}, r"contains \[64\], .*above max_tokens_per_batch \(32\)"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        StaticShapeConfig(**kwargs)


def test_plan_argument_errors():
    with pytest.raises(LoaderError, match=r"max\(lengths\) \(200\) exceeds the last static_shapes\.bucket_boundaries \(128\)"):
        plan_static_shapes([5, 200], StaticShapeConfig(bucket_boundaries=(64, 128)), 1)
    with pytest.raises(LoaderError, match=r"max\(lengths\) \(100\) exceeds static_shapes\.max_tokens_per_batch \(64\)"):
        plan_static_shapes([5, 100], StaticShapeConfig(max_tokens_per_batch=64), 1)
    with pytest.raises(LoaderError, match=r"world_size \(0\) must be >= 1"):
        plan_static_shapes([5], StaticShapeConfig(), 0)


# ----- DCP planner adapter -------------------------------------------------------------------------
def test_loader_step_planned_by_dcp_covers_exactly_its_samples():
    from dcp.planner import CPU_SMALL, analytic_table

    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(6, 0.9, 2000), 16, 4096).astype(int).tolist()
    config = DCPConfig()
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=config.planning.sp_sizes,
                           max_micro_batch_size=8, world_size=4, hardware=CPU_SMALL)
    loader = LoadBalancedConfig(load_balanced_max_tokens_for_batch=8192, load_balanced_batches_per_optimizer_step=2,
                                max_num_steps=2)
    for step in lockstep_steps(lengths, loader, world_size=4):
        samples = step_samples(step)
        plans = plan_samples(samples, table, config, world_size=4)
        planned = [(i, n) for p in plans for g in p.groups for mb in g.micro_batches
                   for i, n in zip(mb.sample_ids, mb.seq_lens, strict=True)]
        assert sorted(planned) == sorted(samples)  # same ids, same lengths, each once
        assert all(p.world_size == 4 for p in plans)


def test_adapter_errors():
    b = Batch((1, 2), (5, 6), 6, 2)
    assert step_samples(b) == [(1, 5), (2, 6)]
    with pytest.raises(LoaderError, match=r"sample id \(1\) appears twice in one loader step"):
        step_samples([b, b])
    with pytest.raises(LoaderError, match=r"samples \(\[\]\) is empty"):
        plan_samples([], None, DCPConfig(), 1)
