"""Bucket and packed parallel baselines: same StepPlan output, their own invariants and error paths."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_planner_assemble import EDGES, MODEL, check_plans, lengths_for, make

from dcp.planner import EpochPlanner, PlanningError, micro_batch_time_s, plan_epoch
from dcp.planner.baselines import bucket_batch_sizes, fixed_sp_size, packed_token_budget


def _with(cfg, packed_token_budget=None, bucket_sp_size=None, **kw):
    advanced = {k: v for k, v in (("packed_token_budget", packed_token_budget), ("bucket_sp_size", bucket_sp_size))
                if v is not None}
    return dataclasses.replace(cfg, planning=dataclasses.replace(cfg.planning, **kw),
                               advanced=dataclasses.replace(cfg.advanced, **advanced))


@pytest.mark.parametrize(("world", "rpn"), [(8, 8), (12, 8), (6, 4), (5, 2)])
def test_bucket_invariants(world, rpn):
    cfg, table = make(world, method="bucket", rpn=rpn)
    lengths = lengths_for(400, seed=world)
    pl = EpochPlanner(lengths, table, cfg, world)
    plans = list(pl)
    check_plans(plans, lengths, cfg, world)
    p = pl.baseline_sp_size
    L = MODEL.num_layers
    for plan in plans:
        busy = [g for g in plan.groups if g.micro_batches]
        assert all(g.sp_size == p and g.ga_steps == 1 and g.recompute_layers == L for g in busy)
        for g in busy:
            (mb,) = g.micro_batches
            assert mb.size <= pl.batch_sizes[mb.seq_group]
    # Every step but the last is full: one micro-batch per aligned block of p ranks.
    slots = sum(1 for g in plans[0].groups if g.sp_size == p)
    assert all(sum(1 for g in pl_.groups if g.micro_batches) == slots for pl_ in plans[:-1])
    # Batch sizes: larger for short groups, never slower than the longest group's b=1 reference.
    sizes = [pl.batch_sizes[g] for g in sorted(pl.batch_sizes)]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1


def test_bucket_sp_size_is_smallest_that_fits_longest():
    cfg, table = make(8, method="bucket", cap_mib=12)
    groups = np.searchsorted(EDGES, lengths_for(200))
    cap = cfg.planning.mem_capacity_bytes
    p = fixed_sp_size(
        table,
        sp_sizes=(1, 2, 4, 8),
        bucket_sp_size=0,
        world_size=8,
        longest_group=int(groups.max()),
        mem_capacity_bytes=cap,
    )
    assert p > 1
    smaller = [q for q in (1, 2, 4, 8) if q < p]
    with pytest.raises(PlanningError, match="no sp_size in"):
        fixed_sp_size(
            table, sp_sizes=smaller, bucket_sp_size=0, world_size=8, longest_group=4, mem_capacity_bytes=cap
        )
    assert (
        fixed_sp_size(
            table, sp_sizes=(1, 2), bucket_sp_size=2, world_size=8, longest_group=4, mem_capacity_bytes=cap
        )
        == 2
    )
    with pytest.raises(PlanningError, match=r"bucket_sp_size \(8\) exceeds world_size \(4\)"):
        fixed_sp_size(
            table, sp_sizes=(8,), bucket_sp_size=8, world_size=4, longest_group=4, mem_capacity_bytes=cap
        )
    ref = micro_batch_time_s(
        next(r for r in table.rows_for(4) if (r.sp_size, r.micro_batch_size) == (p, 1)), 4
    )
    b = bucket_batch_sizes(table, p, [0, 2, 4], cap)
    for g, size in b.items():
        row = next(r for r in table.rows_for(g) if (r.sp_size, r.micro_batch_size) == (p, size))
        assert micro_batch_time_s(row, 4) <= ref * (1 + 1e-12)


def test_bucket_fixed_sp_from_config():
    cfg, table = make(8, method="bucket")
    cfg = _with(cfg, bucket_sp_size=4)
    pl = EpochPlanner(lengths_for(100), table, cfg, 8)
    plans = list(pl)
    assert all(g.sp_size == 4 for p in plans for g in p.groups if g.micro_batches)


@pytest.mark.parametrize(("world", "rpn"), [(8, 8), (12, 4), (6, 8)])
def test_packed_invariants(world, rpn):
    cfg, table = make(world, method="packed", rpn=rpn)
    lengths = lengths_for(300, seed=world)
    pl = EpochPlanner(lengths, table, cfg, world)
    plans = list(pl)
    check_plans_packed(plans, lengths, world)
    budget = packed_token_budget(table, pl.baseline_sp_size, cfg.planning.mem_capacity_bytes, 0)
    order = []
    for plan in plans:
        for g in plan.groups:
            assert g.ga_steps <= 1 and (not g.micro_batches or g.sp_size == pl.baseline_sp_size)
            for mb in g.micro_batches:
                assert mb.seq_group == -1 and mb.tokens <= budget and mb.time_s > 0
                order.extend(mb.sample_ids)
    # Packs follow the stream order exactly.
    from dcp.planner.stream import shuffled_order

    assert order == shuffled_order(len(lengths), cfg.planning.seed, 0).tolist()


def check_plans_packed(plans, lengths, world):
    ids = sorted(i for p in plans for i in p.sample_ids)
    assert ids == list(range(len(lengths)))
    assert all(sum(g.sp_size for g in p.groups) == world for p in plans)


def test_packed_time_is_one_row_of_documents_in_1d_and_per_sample_in_2d():
    from dcp.planner.stream import TimeLookup

    cfg, table = make(4, method="packed")
    cfg = _with(cfg, packed_token_budget=10_000, bucket_sp_size=1)
    times = TimeLookup(table)
    # 1D: the pack runs as one sequence of documents, priced from its real lengths with the overhead once
    for lens in ([100, 100], [384, 384], [384, 100, 30]):
        plans = plan_epoch(lens, table, cfg, 4)
        (mb,) = [mb for g in plans[0].groups for mb in g.micro_batches]
        assert mb.size == len(lens) and mb.time_s == pytest.approx(times.pack_time_s(1, 4, lens))
        # one forward of the whole row costs less than running the documents one by one
        assert mb.time_s < sum(times.lengths_time_s(int(table.group_of(n)), 1, 4, [n]) for n in lens)
    # 2D (shapes given): the samples run one by one, each at its own length, the constant part T_C once
    plans = plan_epoch([100, 100], table, cfg, 4, shapes=[(1, 100), (2, 50)])
    (mb,) = [mb for g in plans[0].groups for mb in g.micro_batches]
    row = next(r for r in table.rows_for(0) if (r.sp_size, r.micro_batch_size) == (1, 1))
    t_100 = times.lengths_time_s(0, 1, 4, [100])
    assert t_100 <= micro_batch_time_s(row, 4) and mb.time_s == pytest.approx(2 * t_100 - row.t_const_s)


def test_packed_errors():
    cfg, table = make(4, method="packed")
    with pytest.raises(
        PlanningError, match=r"sample 1 has 3000 tokens, more than advanced.packed_token_budget \(1000\)"
    ):
        plan_epoch([10, 3000], table, _with(cfg, packed_token_budget=1000), 4)
    with pytest.raises(PlanningError, match="no packing token budget"):
        packed_token_budget(table, 1, 1.0, 0)


def test_baselines_empty_epoch():
    cfg, table = make(4, method="bucket")
    assert plan_epoch([], table, cfg, 4) == []
    assert plan_epoch([], table, _with(cfg, method="packed"), 4) == []


@pytest.mark.parametrize(("world", "rpn"), [(8, 8), (6, 4)])
def test_bucket_search_is_the_rule_at_its_best_reference(world, rpn):
    """bucket-search plans like bucket (one p, ga 1, full recompute, exactly once) with the batch sizes of the
    reference time that maximises predicted throughput: never below Open-Sora's rule on the same data."""
    lengths = np.random.default_rng(world).lognormal(5.5, 1.2, 1500).clip(1, 4096).astype(int)
    tput = {}
    for method in ("bucket", "bucket-search"):
        cfg, table = make(world, method=method, rpn=rpn, cap_mib=48)
        pl = EpochPlanner(lengths, table, cfg, world)
        plans = list(pl)
        check_plans(plans, lengths, cfg, world)
        assert all(g.ga_steps == 1 and g.recompute_layers == MODEL.num_layers
                   for p in plans for g in p.groups if g.micro_batches)
        tput[method] = sum(p.tokens for p in plans) / sum(p.step_time_s for p in plans)
        if method == "bucket-search":
            # its sizes are the rule's for some reference time: monotone in the seq_group
            sizes = [pl.batch_sizes[g] for g in sorted(pl.batch_sizes)]
            assert sizes == sorted(sizes, reverse=True)
    assert tput["bucket-search"] >= tput["bucket"] * (1 - 1e-9)
