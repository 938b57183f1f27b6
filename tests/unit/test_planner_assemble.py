"""Step assembly (DCP-inter, DCP-intra): exactly-once, rank cover, nodes, g bounds, determinism, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import AdvancedConfig, DCPConfig, ModelShapeConfig, PlanningConfig, ProfilingConfig
from dcp.planner import CPU_SMALL, EpochPlanner, PlanningError, analytic_table, plan_epoch
from dcp.planner.placement import aligned_slots, node_bounds, place_largest_first
from dcp.planner.stream import shuffled_order
from dcp.planner.tokens import token_runs

MODEL = ModelShapeConfig(name="tiny", num_layers=4, hidden_size=64, num_heads=8, vocab_size=256)
EDGES = (256, 512, 1024, 2048, 4096)


def make(
    world: int,
    *,
    method: str = "dcp-intra",
    rpn: int = 8,
    sp=(1, 2, 4, 8),
    cap_mib: float = 24.0,
    gmin: int = 1,
    gmax: int = 4,
    lookahead: int = 0,
    seed: int = 0,
    max_b: int = 8,
    default_batch: str = "method",
    micro_batch_tokens: str = "off",
):
    """A small config and table; ``default_batch`` "method" (each method's own step sizes) for the tests of the
    step mechanics (Gmin, Gmax, the window), "data" for the default global batch; ``micro_batch_tokens`` "off"
    (b-sample micro-batches, what these tests measure) unless a test asks for the default "auto"."""
    cfg = DCPConfig(
        model=MODEL,
        profiling=ProfilingConfig(seq_group_edges=EDGES, max_micro_batch_size=max_b),
        planning=PlanningConfig(
            method=method,
            ranks_per_node=rpn,
            sp_sizes=sp,
            mem_capacity_gib=cap_mib / 1024,
            gmin=gmin,
            gmax=gmax,
            seed=seed,
        ),
        advanced=AdvancedConfig(lookahead_samples=lookahead, default_batch=default_batch,
                                micro_batch_tokens=micro_batch_tokens),
    )
    table = analytic_table(
        MODEL,
        EDGES,
        sp_sizes=sp,
        max_micro_batch_size=max_b,
        world_size=world,
        hardware=CPU_SMALL,
        mem_capacity_bytes=cfg.planning.mem_capacity_bytes,
    )
    return cfg, table


def lengths_for(n: int, seed: int = 0, hi: int = 4096) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, hi + 1, n)


def check_plans(plans, lengths, cfg, world, planner=None):
    rpn = cfg.planning.ranks_per_node
    n = len(lengths)
    ids = [i for p in plans for i in p.sample_ids]
    assert sorted(ids) == list(range(n)), "every sample exactly once"
    assert [p.step for p in plans] == list(range(len(plans)))
    edges = (0, *cfg.profiling.seq_group_edges)
    for plan in plans:
        assert plan.world_size == world and plan.method == cfg.planning.method
        assert sum(g.sp_size for g in plan.groups) == world
        assert [g.first_rank for g in plan.groups] == sorted(g.first_rank for g in plan.groups)
        for g in plan.groups:
            if g.sp_size <= rpn:
                assert g.first_rank // rpn == (g.first_rank + g.sp_size - 1) // rpn, "group crosses a node"
                assert (g.first_rank % rpn) % g.sp_size == 0, "group not aligned inside its node"
            else:
                assert g.first_rank % g.sp_size == 0
            assert g.sp_size in cfg.planning.sp_sizes or not g.micro_batches
            for mb in g.micro_batches:
                assert mb.time_s > 0 and mb.size >= 1
                assert all(edges[mb.seq_group] < s <= edges[mb.seq_group + 1] for s in mb.seq_lens)
                assert list(mb.seq_lens) == [int(lengths[i]) for i in mb.sample_ids]
        assert plan.samples > 0
    if planner is not None and cfg.planning.gmin == 1:
        for plan in plans:
            # The paper's Gmax: the step lasts at most Gmax x its longest micro-batch.
            longest = max(mb.time_s for g in plan.groups for mb in g.micro_batches)
            assert plan.step_time_s <= cfg.planning.gmax * longest * (1 + 1e-9), "Gmax bound"


def test_dcp_intra_small_world():
    cfg, table = make(8)
    lengths = lengths_for(600)
    pl = EpochPlanner(lengths, table, cfg, 8)
    plans = list(pl)
    check_plans(plans, lengths, cfg, 8, pl)
    assert plans[0].method == "dcp-intra"
    assert any(g.sp_size > 1 for p in plans for g in p.groups)  # long sequences get SP
    assert any(g.ga_steps > 1 for p in plans for g in p.groups)  # short groups accumulate


@pytest.mark.parametrize(("world", "rpn"), [(6, 8), (12, 8), (24, 4), (5, 2), (3, 8), (1, 8), (10, 4)])
@pytest.mark.parametrize("method", ["dcp-inter", "dcp-intra"])
def test_non_power_of_two_worlds(world, rpn, method):
    cfg, table = make(world, rpn=rpn, method=method)
    lengths = lengths_for(300, seed=world)
    pl = EpochPlanner(lengths, table, cfg, world)
    check_plans(list(pl), lengths, cfg, world, pl)


def test_groups_larger_than_a_node():
    # 2 ranks per node, long sequences need p = 4 or 8: groups span nodes and start at multiples of p.
    cfg, table = make(12, rpn=2, cap_mib=12)
    lengths = lengths_for(200, seed=3)
    pl = EpochPlanner(lengths, table, cfg, 12)
    plans = list(pl)
    check_plans(plans, lengths, cfg, 12, pl)
    assert any(g.sp_size > 2 and g.micro_batches for p in plans for g in p.groups)


@settings(max_examples=25, deadline=None)
@given(
    world=st.integers(1, 20),
    rpn=st.sampled_from([1, 2, 3, 4, 8]),
    n=st.integers(1, 120),
    seed=st.integers(0, 5),
    method=st.sampled_from(["dcp-inter", "dcp-intra"]),
    gmax=st.integers(1, 4),
    lookahead=st.sampled_from([0, 1, 7, 50]),
)
def test_invariants_property(world, rpn, n, seed, method, gmax, lookahead):
    cfg, table = make(world, rpn=rpn, method=method, gmax=gmax, lookahead=lookahead, seed=seed)
    lengths = lengths_for(n, seed=seed)
    pl = EpochPlanner(lengths, table, cfg, world)
    plans = list(pl)
    check_plans(plans, lengths, cfg, world, pl)
    check_window(plans, lengths, cfg, pl)


def test_determinism_and_epoch_shuffle():
    cfg, table = make(12, rpn=4)
    lengths = lengths_for(400)
    a = [p.digest() for p in plan_epoch(lengths, table, cfg, 12)]
    b = [p.digest() for p in plan_epoch(list(lengths), table, cfg, 12)]
    assert a == b
    c = [p.digest() for p in plan_epoch(lengths, table, cfg, 12, epoch=1)]
    assert a != c
    assert list(shuffled_order(10, 0, 0)) == list(shuffled_order(10, 0, 0))
    assert list(shuffled_order(10, 0, 0)) != list(shuffled_order(10, 0, 1))


def _stream_positions(cfg, n, epoch=0):
    order = shuffled_order(n, cfg.planning.seed, epoch)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    return pos


def check_window(plans, lengths, cfg, pl):
    """Rebuild the micro-batches (b samples of a seq_group in stream order, released at the position of the
    b-th; partial ones after the stream) and check that every micro-batch a step uses was released within
    the look-ahead of the earliest micro-batch not yet consumed."""
    pos = _stream_positions(cfg, len(lengths), pl.epoch)
    groups = np.searchsorted(EDGES, lengths)
    n = len(lengths)
    mb_of, ready = np.zeros(n, dtype=np.int64), []
    budgets = pl.arrays.mbq.token_budget if pl.arrays is not None else {}
    for sg, setting in pl.settings.items():
        members = np.flatnonzero(groups == sg)
        members = members[np.argsort(pos[members])]
        b = setting.micro_batch_size
        # token-packed seq_groups (advanced.micro_batch_tokens): greedy packs by tokens, the last one flushed
        starts = (token_runs(lengths[members], budgets[sg]) if sg in budgets
                  else np.arange(0, len(members), b)).tolist()
        for i, e in zip(starts, [*starts[1:], len(members)], strict=True):
            chunk = members[i:e]
            full = e < len(members) if sg in budgets else len(chunk) == b
            mb_of[chunk] = len(ready)
            ready.append(int(pos[chunk[-1]]) if full else n + int(pos[chunk[0]]))
    ready = np.asarray(ready)
    used = np.zeros(len(ready), dtype=bool)
    for p in plans:
        mbs = np.unique(mb_of[list(p.sample_ids)])
        anchor = int(ready[~used].min())
        if anchor + pl.lookahead_samples < n:  # once the window reaches the stream's end, all that is left is in it
            assert int(ready[mbs].max()) < anchor + pl.lookahead_samples, "beyond the look-ahead window"
        used[mbs] = True


@pytest.mark.parametrize("lookahead", [0, 16, 100])
def test_bounded_lookahead_and_micro_batches_in_stream_order(lookahead):
    world = 12
    cfg, table = make(world, rpn=4, lookahead=lookahead)
    lengths = lengths_for(500, seed=7)
    pl = EpochPlanner(lengths, table, cfg, world)
    plans = list(pl)
    pos = _stream_positions(cfg, len(lengths))
    # Packing may reorder micro-batches inside the window (longest first), never the samples of one
    # micro-batch, and a group runs its micro-batches in release order.
    for p in plans:
        for g in p.groups:
            for mb in g.micro_batches:
                assert pos[list(mb.sample_ids)].tolist() == sorted(pos[list(mb.sample_ids)].tolist())
    look = pl.lookahead_samples
    assert look == lookahead if lookahead else look >= 32 * world
    check_window(plans, lengths, cfg, pl)


def test_gmin_scales_ga():
    # Two seq_groups with micro-batch times 1.0 and 0.7 on W = 2 (p = 1 only). Gmax = 4 caps a step at 4.0 s:
    # a group holds at most 4 of the 1.0 s or 5 of the 0.7 s micro-batches. Gmin = 8 (the paper's rule, which
    # wins over Gmax) must stretch the step until some group runs >= 8 micro-batches.
    from dcp.planner import ProfileRow, ProfileTable, TableMeta

    rows = [
        ProfileRow(0, 100, 1, 1, 0.1, 0.2, 1.0, 1.0, 0.7, 10.0, 1),
        ProfileRow(1, 200, 1, 1, 0.1, 0.2, 1.0, 1.0, 0.4, 10.0, 1),
    ]
    table = ProfileTable(rows, TableMeta(model="m", hardware="h", dtype="float32", world_size=2,
                                         seq_group_edges=(100, 200)))
    lengths = np.array([50, 150] * 200)

    def first_step(gmin: int, gmax: int):
        cfg = DCPConfig(model=MODEL, profiling=ProfilingConfig(seq_group_edges=(100, 200)),
                        planning=PlanningConfig(ranks_per_node=2, sp_sizes=(1,), gmin=gmin, gmax=gmax),
                        advanced=AdvancedConfig(lookahead_samples=400, default_batch="method"))
        plans = plan_epoch(lengths, table, cfg, 2)
        check_plans(plans, lengths, cfg, 2)
        return plans[0]

    short = first_step(1, 4)
    assert max(g.ga_steps for g in short.groups) <= 5 and short.step_time_s <= 4.0 + 1e-9
    long = first_step(8, 8)
    assert max(g.ga_steps for g in long.groups) >= 8
    assert long.idle_ratio_gpu < 0.2


def test_partial_last_step_and_idle_groups():
    cfg, table = make(16)
    lengths = np.full(3, 100)  # 3 short samples: one partial micro-batch, most ranks idle
    plans = plan_epoch(lengths, table, cfg, 16)
    check_plans(plans, lengths, cfg, 16)
    assert len(plans) == 1
    idle = [g for g in plans[0].groups if not g.micro_batches]
    assert idle and all(g.sp_size == 1 for g in idle)
    assert plans[0].idle_ratio_gpu > 0.5
    assert plan_epoch([], table, cfg, 16) == []


def test_too_long_sample_error_names_it():
    cfg, table = make(4)
    lengths = [100, 5000, 200, 7000]
    with pytest.raises(PlanningError) as e:
        plan_epoch(lengths, table, cfg, 4)
    msg = str(e.value)
    assert "sample 1 has 5000 tokens" in msg and "4096" in msg and "seq_group edge >= 7000" in msg
    assert "mem_capacity" in msg and "sp_sizes" in msg


def test_bad_lengths_and_world():
    cfg, table = make(4)
    with pytest.raises(PlanningError, match="sample 1 has length 0"):
        plan_epoch([5, 0], table, cfg, 4)
    with pytest.raises(PlanningError, match=r"world_size \(0\)"):
        plan_epoch([5], table, cfg, 0)


def test_seq_group_without_fitting_setting():
    cfg, table = make(2, sp=(1, 2), cap_mib=6)  # the longest groups fit nowhere at p <= 2
    with pytest.raises(
        PlanningError,
        match=r"seq_group \d \(<= \d+ tokens; 1 samples, e.g. sample 1\) has no "
        r"setting that fits.*raise planning.mem_capacity_gib",
    ):
        plan_epoch([10, 4000], table, cfg, 2)


def test_intra_beats_or_equals_inter_predicted_throughput():
    lengths = lengths_for(1500, seed=2)
    tput = {}
    for method in ("dcp-inter", "dcp-intra"):
        cfg, table = make(16, method=method, cap_mib=48)
        plans = plan_epoch(lengths, table, cfg, 16)
        tput[method] = sum(p.tokens for p in plans) / sum(p.step_time_s for p in plans)
        if method == "dcp-inter":
            assert all(
                g.recompute_layers == MODEL.num_layers for p in plans for g in p.groups if g.micro_batches
            )
    assert tput["dcp-intra"] >= tput["dcp-inter"]


def test_placement_helpers():
    assert node_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    starts, free = place_largest_first([4, 2, 1], 6, 8)  # one partial node of 6 ranks
    assert starts == [0, 4, None] and free == []
    starts, free = place_largest_first([4, 4, 1], 6, 3)  # p > node: multiples of p on free nodes only
    assert starts == [0, None, 4] and free == [(5, 6)]
    starts, free = place_largest_first([4, 2, 2, 1], 8, 8)
    assert starts == [0, 4, 6, None] and free == []
    starts, free = place_largest_first([4, 1], 8, 8)
    assert starts == [0, 4] and free == [(5, 8)]
    starts, free = place_largest_first([8, 4], 12, 2)  # cross-node groups at multiples of p
    assert starts == [0, 8] and free == []
    assert aligned_slots(4, 12, 6) == [0, 6]
    assert aligned_slots(2, 5, 8) == [0, 2]
    with pytest.raises(ValueError, match="non-increasing"):
        place_largest_first([1, 2], 4, 4)


def test_filler_uses_smaller_p_in_chunks():
    # One seq_group whose best setting is p = 4, b = 2; at p = 2 only b = 1 fits memory. With W = 6 (one
    # node of 6), every step places one p = 4 group and fills ranks 4-5 with a p = 2 group that runs each
    # 2-sample micro-batch as two 1-sample chunks (6.2 s, within the step target 3 x 2.5 s that Gmax = 3 allows).
    from dcp.planner import ProfileRow, ProfileTable, TableMeta

    def r(b, p, t_f, feasible=True):
        return ProfileRow(0, 1000, b, p, t_f, 2 * t_f, 10.0 * b / p, 1.0, 0.1, 10.0, 2, feasible)

    # tokens per GPU-second: p=4,b=2: 2000/(4*2.5) = 200; p=4,b=1: 1000/(4*1.6) = 156; p=2,b=1: 161.
    rows = [r(1, 4, 0.25), r(2, 4, 0.4), r(1, 2, 0.5), r(2, 2, 1.0, feasible=False)]
    table = ProfileTable(
        rows, TableMeta(model="m", hardware="h", dtype="float32", world_size=6, seq_group_edges=(1000,))
    )
    cfg = DCPConfig(model=MODEL, planning=PlanningConfig(ranks_per_node=8, sp_sizes=(2, 4), gmax=3,
                                                         samples_per_step=24))
    lengths = np.full(40, 900)
    pl = EpochPlanner(lengths, table, cfg, 6)
    plans = list(pl)
    ids = sorted(i for p in plans for i in p.sample_ids)
    assert ids == list(range(40))
    first = plans[0]
    assert [(g.first_rank, g.sp_size) for g in first.groups] == [(0, 4), (4, 2)]
    filler = first.groups[1]
    assert filler.micro_batches and all(mb.size == 1 for mb in filler.micro_batches)
    assert first.groups[0].micro_batches[0].size == 2
    # The filler's two chunks of one 2-sample micro-batch cost twice a 1-sample micro-batch at p = 2.
    one = 2 * (1.0 / 2 + 2.0 / 2) + 0.1
    assert filler.micro_batches[0].time_s == pytest.approx(one)


def test_head_joins_a_larger_group_on_long_tail():
    """t1d-long at 32 H200: when the head's kind has too little work in the window to fill its own group, the
    head joins a larger-p group (its ranks go to a second group of the longest kind); it runs there with a
    setting whose memory fits (a b that holds it) at that setting's own r (``StepPlan.mb_recompute_layers``: at
    most the group's), timed there."""
    from dcp.data_dists import load_lengths
    from dcp.planner.stream import TimeLookup
    from dcp.sim.scenario import paper_config, paper_table, scenario

    sc = scenario("t1d-5b", "h200")
    lengths = np.asarray(load_lengths("t1d-long", num_samples=3000, seed=0).tokens)
    cfg, table = paper_config(sc, "dcp-intra"), paper_table(sc, 32)
    cfg = cfg.replace(planning=dataclasses.replace(cfg.planning, samples_per_step=128))  # 4 per rank
    planner = EpochPlanner(lengths, table, cfg, 32)
    plans = list(planner)
    check_plans(plans, lengths, cfg, 32, planner)
    times = TimeLookup(table)
    joined = 0
    for plan in plans:
        for g in plan.groups:
            for mb in g.micro_batches:
                if g.sp_size > planner.settings[mb.seq_group].sp_size:
                    joined += 1
                    s = planner.arrays.by_sp[mb.seq_group][g.sp_size]
                    assert s.micro_batch_size >= mb.size and s.recompute_layers == g.recompute_of(mb)
                    assert g.recompute_of(mb) <= g.recompute_layers
                    want = times.lengths_time_s(mb.seq_group, g.sp_size, g.recompute_of(mb), mb.seq_lens)
                    assert mb.time_s == pytest.approx(want)
    assert joined >= 1


def test_gmax_holds_when_placement_drops_the_longest_group():
    # 6 ranks in nodes of 3: the longest micro-batch's p = 4 group and the head's p = 2 group do not both
    # fit, the larger is dropped, and the head's group must not keep the T* sized on the dropped one
    # (hypothesis found it: a step of 0.170 s against Gmax x longest = 0.094 s)
    cfg, table = make(6, rpn=3, method="dcp-intra", gmax=1, lookahead=0, seed=0)
    lengths = lengths_for(5, seed=0)
    pl = EpochPlanner(lengths, table, cfg, 6)
    check_plans(list(pl), lengths, cfg, 6, pl)
