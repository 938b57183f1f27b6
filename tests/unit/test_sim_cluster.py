"""Simulator invariants on the real planner: bounds, idle ratios, scaling, truth-table re-timing."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.data_dists import load_distribution
from dcp.named_models import T1D_5B, T2D_1B2
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.sim.cluster import SimulationError, ideal_tokens_per_s, simulate, step_cost
from dcp.sim.hardware import H100, H200
from dcp.sim.scenario import ScenarioError, paper_config, paper_table, scenario

METHODS = ("bucket", "packed", "dcp-inter", "dcp-intra")


def _stated(cfg, **planning):
    return cfg.replace(planning=dataclasses.replace(cfg.planning, **planning))


def _config(sc, method, world_size):
    cfg = paper_config(sc, method)
    return cfg  # the planner's default look-ahead, as `dcp simulate` uses


@pytest.fixture(scope="module")
def t1d():
    sc = scenario("t1d-5b", "h200")
    return sc, {w: paper_table(sc, w) for w in (8, 16)}


@pytest.fixture(scope="module")
def long_lengths():
    return load_distribution("t1d-long", num_samples=1500, seed=0)


@pytest.mark.parametrize("method", METHODS)
def test_invariants(t1d, long_lengths, method):
    sc, tables = t1d
    r = simulate(long_lengths, tables[8], _config(sc, method, 8), 8, hardware=sc.hardware)
    assert r.num_samples == len(long_lengths) and r.tokens == sum(long_lengths)
    assert 0 < r.tokens_per_s <= r.ideal_tokens_per_s * (1 + 1e-9)
    assert 0 < r.ideal_fraction <= 1 + 1e-9
    assert 0 <= r.idle_ratio <= 1 and 0 <= r.idle_ratio_batch <= 1
    assert r.mem_violations == 0 and 0 < r.peak_mem_bytes <= sc.hardware.mem_capacity_bytes
    assert r.total_time_s == pytest.approx(r.compute_time_s + r.sync_time_s)
    assert r.sync_time_s > 0
    assert len(r.idle_ratio_per_rank) == 8 and all(0 <= x <= 1 for x in r.idle_ratio_per_rank)
    assert sum(r.idle_ratio_per_rank) / 8 == pytest.approx(r.idle_ratio)


def test_more_gpus_more_throughput_for_dcp(t1d, long_lengths):
    sc, tables = t1d
    for method in ("dcp-inter", "dcp-intra"):
        small = simulate(long_lengths, tables[8], _config(sc, method, 8), 8, hardware=sc.hardware)
        big = simulate(long_lengths, tables[16], _config(sc, method, 16), 16, hardware=sc.hardware)
        assert big.tokens_per_s > small.tokens_per_s


def test_bucket_idles_more_than_dcp_on_skewed_data(t1d, long_lengths):
    # at 4 samples per rank a step: at the default batch (6 steps of these 1,500 samples) bucket's slots hold
    # enough micro-batches to idle 1.2%, DCP-inter 4.1% and DCP-intra 0.03% (tokens/s 19,930 / 19,579 / 21,550)
    sc, tables = t1d
    res = {m: simulate(long_lengths, tables[8], _stated(_config(sc, m, 8), samples_per_step=32), 8,
                       hardware=sc.hardware) for m in METHODS}
    assert res["bucket"].idle_ratio > res["dcp-inter"].idle_ratio
    assert res["bucket"].idle_ratio > res["dcp-intra"].idle_ratio
    assert res["dcp-intra"].tokens_per_s > res["bucket"].tokens_per_s


def test_truth_table_retimes_micro_batches(t1d, long_lengths):
    sc, tables = t1d
    table = tables[8]
    slow = table.with_rows(dataclasses.replace(r, t_f_s=2 * r.t_f_s, t_b_s=2 * r.t_b_s, t_const_s=2 * r.t_const_s)
                           for r in table.rows)
    cfg = _config(sc, "dcp-inter", 8)
    base = simulate(long_lengths[:400], table, cfg, 8, hardware=None)
    twice = simulate(long_lengths[:400], table, cfg, 8, hardware=None, truth_table=slow)
    assert base.sync_time_s == 0
    assert twice.compute_time_s == pytest.approx(2 * base.compute_time_s)
    assert twice.ideal_tokens_per_s == pytest.approx(base.ideal_tokens_per_s / 2)


def test_step_cost_by_hand():
    mb = lambda t: MicroBatch((0,), (10,), -1, t)  # noqa: E731 - packed-style micro-batch keeps its own time
    plan = StepPlan(0, 0, 4, "dcp-inter", (
        GroupPlan(0, 2, 0, (mb(1.0), mb(2.0))),
        GroupPlan(2, 1, 0, (mb(1.0),)),
        GroupPlan(3, 1, 0, ()),
    ))
    st = step_cost(plan, None, {}, sync_s=0.5, optimizer_s=0.25)
    assert st.compute_time_s == 3.0 and st.step_time_s == 3.75
    assert st.idle_gpu_s == pytest.approx(2 * 0 + 1 * 2 + 1 * 3)
    assert st.idle_ratio_batch == pytest.approx((0 + 2 / 3) / 2)
    assert st.tokens == 30 and st.samples == 3
    assert st.group_idle_s == ((0, 2, 0.0), (2, 1, 2.0), (3, 1, 3.0))
    # fsdp2-zero3: the ranks go through the step's 2 slots together, each slot as long as its slowest micro-batch
    # or its 3 rounds (1.5 x the all-reduce's price) when those are longer; the first layer's gather is exposed
    zero3 = step_cost(plan, None, {}, sync_s=0.5, optimizer_s=0.25, engine="fsdp2-zero3")
    assert zero3.compute_time_s == 1.0 + 2.0 and zero3.sync_time_s == pytest.approx(2 * 0.75 / 3)
    slow_net = step_cost(plan, None, {}, sync_s=2.0, optimizer_s=0.25, engine="fsdp2-zero3")
    assert slow_net.compute_time_s == 3.0 + 3.0 and slow_net.group_idle_s[2] == (3, 1, 6.0)
    # groups of equal totals in other orders: each slot waits for the slower of the two (2 + 2, not 3)
    crossed = StepPlan(0, 0, 2, "dcp-inter", (GroupPlan(0, 1, 0, (mb(1.0), mb(2.0))),
                                              GroupPlan(1, 1, 0, (mb(2.0), mb(1.0)))))
    assert step_cost(crossed, None, {}, sync_s=0.5, optimizer_s=0.0, engine="fsdp2-zero3").compute_time_s == 4.0


def test_ideal_bound_of_uniform_lengths(t1d):
    from dcp.planner.intra import best_settings

    sc, tables = t1d
    cfg = _config(sc, "dcp-intra", 8)
    best = best_settings(tables[8], mem_capacity_bytes=cfg.planning.mem_capacity_bytes, sp_sizes=sc.sp_sizes,
                         world_size=8, ranks_per_node=8, dynamic_recompute=True)[3]
    assert ideal_tokens_per_s([8192] * 50, tables[8], cfg, 8) == pytest.approx(8 * best.tokens_per_gpu_s)


def test_errors(t1d):
    sc, tables = t1d
    cfg = _config(sc, "dcp-intra", 8)
    with pytest.raises(SimulationError, match="world_size"):
        simulate([1024], tables[8], cfg, 0, hardware=None)
    with pytest.raises(SimulationError, match="at least one sample"):
        simulate([], tables[8], cfg, 8, hardware=None)
    with pytest.raises(ScenarioError, match="t1d-5b"):
        scenario("gpt", "h200")
    with pytest.raises(ScenarioError, match="h100"):
        scenario("t1d-5b", "a100")


def test_paper_shapes_and_hardware():
    from dcp.planner.analytic import layer_linear_params

    assert abs(T1D_5B.num_params / 5e9 - 1) < 0.05
    assert abs(T2D_1B2.num_layers * layer_linear_params(T2D_1B2, "2d") / 1.2e9 - 1) < 0.05
    assert (T1D_5B.num_layers, T1D_5B.hidden_size, T1D_5B.num_heads) == (42, 3072, 48)
    assert (T2D_1B2.num_layers, T2D_1B2.hidden_size, T2D_1B2.num_heads) == (28, 1152, 16)
    assert H100.matmul_flops_per_s == H200.matmul_flops_per_s == 766.6e12  # the calibration file's GEMM ceiling
    assert H100.mem_capacity_bytes == H200.mem_capacity_bytes == 80 * 1024**3
    assert H200.mem_bandwidth_bytes_per_s > H100.mem_bandwidth_bytes_per_s
    assert H200.intra_node_bw_bytes_per_s > H200.inter_node_bw_bytes_per_s and H200.ranks_per_node == 8


def test_2d_table_profiles_video_groups():
    sc = scenario("t2d-1.2b", "h100")
    table = paper_table(sc, 8)
    assert table.max_len >= 204 * 3600
    frames = table.meta.extra["frames_per_sample"]
    assert all(isinstance(f, int) and f >= 1 for f in frames)


def test_stronger_bucket_picks_the_faster_bucket_baseline():
    from types import SimpleNamespace

    from dcp.sim.cluster import stronger_bucket

    fast, slow = SimpleNamespace(tokens_per_s=2.0), SimpleNamespace(tokens_per_s=1.0)
    assert stronger_bucket({"bucket": slow, "bucket-search": fast, "dcp-intra": fast}) == "bucket-search"
    assert stronger_bucket({"bucket": fast, "bucket-search": slow}) == "bucket"
    assert stronger_bucket({"dcp-intra": fast}) is None


def test_exposed_sync_by_hand():
    from dcp.sim.cluster import DDP_BUCKET_BYTES, exposed_sync_s

    g = 100 * DDP_BUCKET_BYTES  # 100 buckets: the last is 1 % of the sync
    assert exposed_sync_s(0.5, 0.0, g) == 0.5  # nothing to hide behind
    assert exposed_sync_s(0.5, 0.2, g) == pytest.approx(0.3)  # the rest after the overlap
    assert exposed_sync_s(0.5, 9.0, g) == pytest.approx(0.005)  # the last bucket starts after backward
    assert exposed_sync_s(0.5, 9.0, DDP_BUCKET_BYTES / 2) == 0.5  # one bucket: no overlap possible


def test_step_cost_overlaps_the_sync_with_every_busy_groups_last_backward():
    from dcp.planner.table import ProfileRow
    from dcp.sim.cluster import DDP_BUCKET_BYTES, backward_share

    row = ProfileRow(seq_group=0, seq_len=64, micro_batch_size=1, sp_size=1, t_f_s=1.0, t_b_s=2.0, m_act_bytes=1.0,
                     m_inp_bytes=1.0, t_const_s=0.0, m_const_bytes=1.0, num_layers=4)
    assert backward_share(row, 0) == pytest.approx(2 / 3)
    assert backward_share(row, 4) == pytest.approx(3 / 4)  # recompute runs in backward
    mb = lambda t: MicroBatch((0,), (10,), 0, t)  # noqa: E731
    plan = StepPlan(0, 0, 2, "dcp-intra", (GroupPlan(0, 1, 0, (mb(1.0), mb(0.6))), GroupPlan(1, 1, 0, (mb(0.9),))))
    rows = {(0, 1): [row]}
    plain = step_cost(plan, None, rows, sync_s=0.5, optimizer_s=0.0)
    over = step_cost(plan, None, rows, sync_s=0.5, optimizer_s=0.0, overlap_grad_bytes=1000 * DDP_BUCKET_BYTES)
    assert plain.sync_time_s == 0.5
    # the slowest group (1.6 s) ends with a 0.6 s micro-batch, 2/3 of it backward: 0.4 s of the sync is hidden,
    # less the first of its 1000 buckets' wait (its gradients come ready over that backward, 0.4 ms each)
    assert over.sync_time_s == pytest.approx(0.1 + 0.4 / 1000) and over.compute_time_s == plain.compute_time_s
    # a group ending 0.05 s earlier after a 0.05 s micro-batch (its backward 1/30 s) holds the early buckets back:
    # its first bucket is ready at 1.55 - 1/30 s, so the sync ends ~0.417 s after the step's compute, not 0.1
    late = StepPlan(0, 0, 2, "dcp-intra", (GroupPlan(0, 1, 0, (mb(1.0), mb(0.6))),
                                           GroupPlan(1, 1, 0, (mb(1.5), mb(0.05)))))
    got = step_cost(late, None, rows, sync_s=0.5, optimizer_s=0.0, overlap_grad_bytes=1000 * DDP_BUCKET_BYTES)
    assert got.sync_time_s == pytest.approx(1.55 - 0.05 * 2 / 3 * (1 - 1 / 1000) + 0.5 - 1.6, abs=1e-9)
    assert got.sync_time_s > 0.41


def test_fsdp2_hides_its_rounds_under_the_first_forward_and_the_last_backward(t1d, long_lengths):
    from dcp.planner.analytic import grad_sync_time_s

    sc, tables = t1d
    cfg = _config(sc, "dcp-intra", 8)
    cfg = cfg.replace(runtime=dataclasses.replace(cfg.runtime, engine="fsdp2"))
    res, steps = simulate(long_lengths[:400], tables[8], cfg, 8, hardware=sc.hardware, return_steps=True)
    whole = grad_sync_time_s(cfg.model, sc.hardware, 8)  # an all-reduce's price: the two rounds, none hidden
    layers = tables[8].rows[0].num_layers
    for st in steps:  # each round exposed at most in full, and at least its first (or last) layer's share
        assert 2 * whole / 2 / layers <= st.sync_time_s + 1e-12 <= whole + 1e-9
    assert sum(st.sync_time_s for st in steps) < 0.5 * whole * len(steps)  # most of it hidden here
