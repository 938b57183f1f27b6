"""Layouts (ulysses x context): model.num_kv_heads, sp_layout, the bytes and seconds each axis is priced at,
and the ranks' token ranges of a context layout (every padded position held exactly once)."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.config import ConfigError, ModelShapeConfig
from dcp.planner.analytic import CPU_SMALL, analytic_row
from dcp.planner.layout import LayoutError, context_bytes, layout_comm_s, sp_layout, ulysses_bytes
from dcp.sim.hardware import HARDWARE

GQA_8B = ModelShapeConfig(name="gqa-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                          ffn_hidden_size=14336, vocab_size=128256, param_bytes=2)


def test_num_kv_heads_defaults_to_heads_and_must_divide_them():
    assert ModelShapeConfig(num_heads=8).kv_heads == 8
    assert GQA_8B.kv_heads == 8
    with pytest.raises(ConfigError, match=r"model.num_kv_heads \(3\) must divide model.num_heads \(8\)"):
        ModelShapeConfig(num_heads=8, num_kv_heads=3)
    with pytest.raises(ConfigError, match=r"model.num_kv_heads \(-1\)"):
        ModelShapeConfig(num_heads=8, num_kv_heads=-1)


def test_sp_layout_is_ulysses_up_to_the_kv_heads_then_context():
    assert sp_layout(8, 32, 8) == (8, 1)
    assert sp_layout(16, 32, 8) == (8, 2)
    assert sp_layout(32, 32, 8) == (8, 4)
    assert sp_layout(4, 8, 2) == (2, 2)
    assert [sp_layout(p, 8, 8) for p in (1, 2, 4, 8)] == [(1, 1), (2, 1), (4, 1), (8, 1)]
    with pytest.raises(LayoutError, match=r"sp_size \(3\) does not divide num_heads \(8\)"):
        sp_layout(3, 8, 8)
    with pytest.raises(LayoutError, match=r"num_kv_heads \(3\) must divide num_heads \(8\)"):
        sp_layout(2, 8, 3)
    with pytest.raises(LayoutError, match=r"sp_size \(0\) must be >= 1"):
        sp_layout(0, 8, 8)


def test_bytes_per_axis():
    # q (8 heads) + unexpanded k, v (2 heads each), head_dim 4, fp32, 10 tokens
    assert ulysses_bytes(10, 8, 2, 4, 2, 4) == (10 * 12 * 4 * 4, 10 * 8 * 4 * 4)
    assert ulysses_bytes(10, 8, 2, 4, 4, 4) == (10 * 24 * 4 * 4, 10 * 8 * 4 * 4)  # 4 does not divide 2: expanded
    assert ulysses_bytes(10, 8, 2, 4, 1, 4) == (0, 0)
    assert context_bytes(10, 8, 2, 4, 2, 2, 4) == 2 * 10 * 1 * 4 * 4
    assert context_bytes(10, 8, 2, 4, 2, 1, 4) == 0


def test_plain_ulysses_prices_as_before_and_gqa_sends_fewer_bytes():
    hw, m = CPU_SMALL, ModelShapeConfig(num_heads=8, hidden_size=64)
    n, d = 2 * 1024 / 4, 4
    before = 4 * (hw.collective_latency_s + n * 64 * d * 3 / 4 / hw.intra_node_bw_bytes_per_s)
    assert layout_comm_s(m, 2, 1024, 4, hw, dtype_bytes=d) == pytest.approx(before, rel=1e-12)
    gqa = dataclasses.replace(m, num_kv_heads=4)
    bytes_ = n * 64 * d * (2 + 2 * 4 / 8)
    assert layout_comm_s(gqa, 2, 1024, 4, hw, dtype_bytes=d) == pytest.approx(
        4 * hw.collective_latency_s + bytes_ * 3 / 4 / hw.intra_node_bw_bytes_per_s, rel=1e-12)


def test_context_layout_is_priced_with_its_all_gather_and_saved_kv():
    h200 = HARDWARE["h200"]
    s = 1 << 20
    r8 = analytic_row(GQA_8B, 0, s, 1, 8, world_size=64, hardware=h200, dtype_bytes=2)
    r16 = analytic_row(GQA_8B, 0, s, 1, 16, world_size=64, hardware=h200, dtype_bytes=2)
    # (8, 2): Ulysses inside a node over 1/16 of the tokens, one K/V all-gather across the two nodes
    uly = 4 * (h200.collective_latency_s + (s / 16) * 4096 * 2 * 2.5 / 4 * 7 / 8 / h200.intra_node_bw_bytes_per_s)
    gather_from_each = 2 * (s / 2) * 1 * 128 * 2
    gather = h200.collective_latency_s + gather_from_each / h200.inter_node_bw_bytes_per_s
    assert layout_comm_s(GQA_8B, 1, s, 16, h200, dtype_bytes=2) == pytest.approx(uly + gather, rel=1e-12)
    assert r16.m_act_bytes > r8.m_act_bytes / 2  # half the tokens, plus the gathered K/V kept for backward
    assert r16.t_f_s < r8.t_f_s  # at 1M tokens the halved attention outweighs the all-gather


def _shard_cover(padded: int, u: int, c: int) -> list[int]:
    from dcp.runtime.context import layout_shard_ranges

    held = []
    for rank in range(u * c):
        ranges = layout_shard_ranges(padded, u, c, rank)
        assert sum(b - a for a, b in ranges) == padded // (u * c)
        held += [i for a, b in ranges for i in range(a, b)]
    return held


@pytest.mark.parametrize("u,c", [(1, 2), (2, 2), (1, 4), (3, 2), (4, 1), (2, 3)])
def test_every_padded_position_is_held_once(u, c):
    padded = 2 * u * c * 3
    assert sorted(_shard_cover(padded, u, c)) == list(range(padded))


def test_sp_context_rules():
    from dcp.runtime.context import SPContext, SPContextError

    with pytest.raises(SPContextError, match=r"SPContext.context_size \(3\) must be >= 1 and divide sp_size \(4\)"):
        SPContext(group=object(), sp_size=4, sp_rank=0, context_size=3, context_group=object())
    with pytest.raises(SPContextError, match=r"context_group / ulysses_group are required"):
        SPContext(group=object(), sp_size=4, sp_rank=0, context_size=2, context_group=object())
    ctx = SPContext(group=object(), sp_size=4, sp_rank=3, context_size=2, context_group=object(),
                    ulysses_group=object())
    assert (ctx.ulysses_size, ctx.context_rank, ctx.padded_len(11)) == (2, 1, 16)
    # 16 padded tokens in 4 chunks of 4: context rank 1 holds chunks 1 and 2, its Ulysses rank 1 the second
    assert ctx.shard_ranges(11) == ((8, 12),)
    assert ctx.replace(sp_rank=1).shard_ranges(11) == ((12, 16),)
    assert ctx.replace(sp_rank=2).shard_ranges(11) == ((4, 8),)
    with pytest.raises(SPContextError, match=r"SPContext.shard: a context layout"):
        ctx.shard(11)


def test_context_layout_refuses_deepspeed_and_dense_masks():
    import torch

    from dcp.runtime.context import SPContext
    from dcp.runtime.ulysses import ulysses_attention

    ctx = SPContext(group=object(), sp_size=4, sp_rank=0, context_size=2, context_group=object(),
                    ulysses_group=object())
    q = torch.zeros(1, 4, 8, 2)
    with pytest.raises(ValueError, match=r"a context layout \(2x2\) runs impl 'dcp' with doc_lens only"):
        ulysses_attention(q, q, q, ctx, causal=True, impl="deepspeed")
    with pytest.raises(ValueError, match=r"a context layout \(2x2\)"):
        ulysses_attention(q, q, q, ctx, causal=True, key_padding_mask=torch.ones(1, 16, dtype=torch.bool))


def test_simulated_gqa_plan_goes_past_the_kv_heads_for_the_longest_samples():
    from dcp.config import DCPConfig, PlanningConfig, ProfilingConfig
    from dcp.planner.analytic import analytic_table
    from dcp.sim.cli import layouts_report
    from dcp.sim.cluster import simulate

    h200 = HARDWARE["h200"]
    cfg = DCPConfig(model=GQA_8B, profiling=ProfilingConfig(seq_group_edges=(16384, 1 << 20), max_micro_batch_size=4),
                    planning=PlanningConfig(sp_sizes=(1, 2, 4, 8, 16, 32), mem_capacity_gib=130.0))
    table = analytic_table(GQA_8B, cfg.profiling.seq_group_edges, sp_sizes=cfg.planning.sp_sizes,
                           max_micro_batch_size=4, world_size=64, hardware=h200, dtype_bytes=2,
                           mem_capacity_bytes=cfg.planning.mem_capacity_bytes)
    lengths = [1 << 20] * 2 + [8000] * 200
    r = simulate(lengths, table, cfg, 64, hardware=h200)
    report = layouts_report(r, GQA_8B)
    assert r.num_samples == len(lengths) and r.longest_sample_sp > 8
    assert report["max_sp_size"] > 8 and report["longest_sample_sp_size"] == r.longest_sample_sp
    assert sum(report["layouts_used"].values()) == sum(n for _, n in r.micro_batches_by_sp)
    assert any(name.startswith("8x") and not name.endswith("x1") for name in report["layouts_used"])
    # Ulysses alone (SP <= the 8 K/V heads) cannot hold a 1M-token sample in 130 GiB
    uly = analytic_table(GQA_8B, cfg.profiling.seq_group_edges, sp_sizes=(1, 2, 4, 8), max_micro_batch_size=4,
                         world_size=64, hardware=h200, dtype_bytes=2, mem_capacity_bytes=cfg.planning.mem_capacity_bytes)
    assert not any(row.feasible and row.seq_group == 1 for row in uly.rows)


def test_registry_context_groups_and_layouts_from_the_config():
    from dcp.config import DCPConfig, PlanningConfig
    from dcp.runtime.registry import (
        SPGroupRegistry,
        context_groups,
        context_sizes_for,
        local_sync_safe,
        sp_blocks,
    )

    blocks = sp_blocks(16, 8, [1, 2, 4, 8, 16])
    groups = context_groups(blocks, {16: 2, 8: 4})
    # size 8 as 2x4: per block of 8, two context groups of stride 2; size 16 as 8x2: eight of stride 8
    assert groups[:2] == [(8, (0, 2, 4, 6)), (8, (1, 3, 5, 7))] and len(groups) == 4 + 8
    assert groups[4] == (16, (0, 8)) and groups[-1] == (16, (7, 15))
    assert local_sync_safe(blocks, [r for _, r in groups])
    cfg = DCPConfig(model=dataclasses.replace(GQA_8B, num_layers=2), planning=PlanningConfig(
        sp_sizes=(1, 2, 4, 8, 16, 32), mem_capacity_gib=200.0))
    assert context_sizes_for(cfg.model, cfg.planning.sp_sizes) == {16: 2, 32: 4}
    assert context_sizes_for(ModelShapeConfig(num_heads=8), (1, 2, 4, 8)) == {}
    assert SPGroupRegistry.for_config(cfg, 1, [1]).context_sizes == {}  # one process: nothing to shard
    with pytest.raises(ValueError, match=r"context_sizes \(\{4: 3\}\) must divide their SP sizes"):
        SPGroupRegistry(1, 8, [1, 4], context_sizes={4: 3})


def test_bench_layouts_refuses_shapes_without_both_layouts(capsys):
    from dcp.bench import layouts

    assert layouts.main(["--kv-heads", "3", "--heads", "9"]) == 2
    assert "--kv-heads (3) must be even and divide --heads (9)" in capsys.readouterr().out


def test_sp_sizes_past_the_heads_are_context_layouts_of_1d_models():
    from dcp.config import DCPConfig, PlanningConfig

    assert sp_layout(64, 32, 8) == (8, 8) and sp_layout(16, 8, 8) == (8, 2)
    with pytest.raises(LayoutError, match=r"sp_size \(36\) does not divide num_heads \(32\) nor is a multiple"):
        sp_layout(36, 32, 8)
    ok = DCPConfig(model=GQA_8B, planning=PlanningConfig(sp_sizes=(1, 8, 32, 64), mem_capacity_gib=200.0))
    assert ok.planning.sp_sizes[-1] == 64
    with pytest.raises(ConfigError, match=r"contains \[36\], which do not divide model.num_heads \(32\) \(nor, for a "
                                          r"1D model, are multiples of its 8 K/V heads past the heads\)"):
        DCPConfig(model=GQA_8B, planning=PlanningConfig(sp_sizes=(1, 36), mem_capacity_gib=200.0))
    two_d = ModelShapeConfig(num_heads=8, hidden_size=64, attentions_per_layer=2)
    with pytest.raises(ConfigError, match=r"contains \[16\], which do not divide model.num_heads \(8\).*use sizes from \[1\], "
                                          r"divisors of 8$"):
        DCPConfig(model=two_d, planning=PlanningConfig(sp_sizes=(1, 16)))


def test_a_4m_token_sample_plans_only_past_the_heads():
    """A 4M-token sample of the 8B GQA shape fits 130 GiB of an H200 only at SP 64 = 8 x 8 (priced)."""
    from dcp.planner.analytic import analytic_table

    h200 = HARDWARE["h200"]
    cap = 130.0 * 1024**3
    edges = (16384, 1 << 22)

    def feasible(sizes):
        t = analytic_table(GQA_8B, edges, sp_sizes=sizes, max_micro_batch_size=1, world_size=64, hardware=h200,
                           dtype_bytes=2, mem_capacity_bytes=cap)
        return sorted(r.sp_size for r in t.rows if r.seq_group == 1 and r.feasible)

    assert feasible((8, 16, 32)) == [] and feasible((8, 16, 32, 64)) == [64]
    with pytest.raises(ValueError, match=r"sp_sizes \(\[8, 36\]\) contains \[36\]"):
        feasible((8, 36))


def test_a_context_axis_prices_attention_at_the_measured_context_rate():
    """A context rank's attention runs as short-query, long-key calls, measured on an H200 at 0.69-0.74 of one
    call's rate: the model divides attention by context_attention_efficiency where (and only where) the layout
    has a context axis, in the analytic rows and in the rows derived from a one-GPU table."""
    from dcp.planner.analytic import attention_time_s
    from dcp.planner.layout import context_slowdown
    from dcp.sim.derive import derive_row

    h200 = HARDWARE["h200"]
    assert h200.context_attention_efficiency < 1
    assert context_slowdown(GQA_8B, 8, h200) == 1.0  # (8, 1): Ulysses only
    assert context_slowdown(GQA_8B, 16, h200) == pytest.approx(1 / h200.context_attention_efficiency)  # (8, 2)
    assert context_slowdown(GQA_8B, 16, h200, "2d") == 1.0
    s = 1 << 18
    plain = dataclasses.replace(h200, context_attention_efficiency=1.0)
    rows = {hw.context_attention_efficiency: analytic_row(GQA_8B, 0, s, 1, 16, world_size=64, hardware=hw,
                                                          dtype_bytes=2) for hw in (h200, plain)}
    att_f = attention_time_s(GQA_8B, s, 1, 16, h200)[0]
    extra = att_f * (1 / h200.context_attention_efficiency - 1)
    assert rows[h200.context_attention_efficiency].t_f_s - rows[1.0].t_f_s == pytest.approx(extra, rel=1e-9)
    one = analytic_row(GQA_8B, 0, s, 1, 1, world_size=64, hardware=h200, dtype_bytes=2)
    kw = dict(model=GQA_8B, attention="1d", dtype_bytes=2, world_size=64, state_bytes_measured=0.0)
    slow, fast = (derive_row(one, 16, hardware=hw, **kw) for hw in (h200, plain))
    assert slow.t_f_s > fast.t_f_s and slow.t_b_s > fast.t_b_s
    assert derive_row(one, 8, hardware=h200, **kw).t_f_s == derive_row(one, 8, hardware=plain, **kw).t_f_s
    with pytest.raises(ValueError, match="context_attention_efficiency"):
        dataclasses.replace(h200, context_attention_efficiency=0.0)
