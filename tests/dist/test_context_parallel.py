"""Context-parallel attention on gloo: layouts (ulysses x context) 1x2, 2x2 and 1x4 against one process
attending over the whole sequence (fp32, tight tolerance): outputs and the gradients of q, k and v, for
causal and full attention, packed documents, lengths not divisible by 2 * sp_size, and grouped-query K/V
(8 query, 2 K/V heads) sent unexpanded. The bytes each rank hands to the all-to-all and the all-gather
equal dcp.planner.layout's count exactly. The reference Transformer-1D runs the 1x2 and 2x2 layouts with
the same loss and gradients as one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist

TOL = dict(rtol=1e-5, atol=1e-6)
DOCS = ((5, 6), (7,))  # row 0: two packed documents; row 1: one; 11 tokens: not a multiple of 2 * p


def _counting():
    """Wrap all_to_all_single and the all-gather to record the bytes each call is handed (forward calls)."""
    sent = {"a2a": [], "gather": []}
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    inner_a2a, inner_gather = dist.all_to_all_single, getattr(dist, name)

    def a2a(out, inp, *args, **kwargs):
        sent["a2a"].append(inp.numel() * inp.element_size())
        return inner_a2a(out, inp, *args, **kwargs)

    def gather(out, inp, *args, **kwargs):
        sent["gather"].append(inp.numel() * inp.element_size())
        return inner_gather(out, inp, *args, **kwargs)

    def restore():
        dist.all_to_all_single = inner_a2a
        setattr(dist, name, inner_gather)

    dist.all_to_all_single = a2a
    setattr(dist, name, gather)
    return sent, restore


def _check(ctx, heads: int, kv_heads: int, causal: bool) -> None:
    from dcp.planner.layout import context_bytes, ulysses_bytes
    from dcp.runtime.attention import local_attention
    from dcp.runtime.context_parallel import take_shard
    from dcp.runtime.ulysses import ulysses_attention

    gen = torch.Generator().manual_seed(heads + kv_heads + causal)
    padded, d, b = ctx.padded_len(max(map(sum, DOCS))), 4, len(DOCS)
    assert padded % (2 * ctx.sp_size) == 0 and padded >= 11
    q, up = (torch.randn(b, padded, heads, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(b, padded, kv_heads, d, generator=gen) for _ in range(2))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    rep = heads // kv_heads
    ref = local_attention(full[0], full[1].repeat_interleave(rep, dim=2), full[2].repeat_interleave(rep, dim=2),
                          causal=causal, doc_lens=DOCS, backend="sdpa")
    (ref * up).sum().backward()

    ranges = ctx.shard_ranges(max(map(sum, DOCS)))
    shard = [take_shard(t, ranges).clone().requires_grad_() for t in (q, k, v)]
    sent, restore = _counting()
    try:
        out = ulysses_attention(*shard, ctx, causal=causal, doc_lens=DOCS)
    finally:
        restore()
    (out * take_shard(up, ranges)).sum().backward()
    torch.testing.assert_close(out, take_shard(ref.detach(), ranges), **TOL)
    for s, f in zip(shard, full, strict=True):
        torch.testing.assert_close(s.grad, take_shard(f.grad, ranges), **TOL)
    # Bytes: the forward's q/k/v and output all-to-alls (Ulysses) and one K/V all-gather (context).
    u, c = ctx.ulysses_size, ctx.context_size
    qkv, o = ulysses_bytes(b * padded // ctx.sp_size, heads, kv_heads, d, u, 4)
    assert sent["a2a"] == ([qkv, o] if u > 1 else []), (sent, qkv, o)
    assert sent["gather"] == [context_bytes(b * padded // c, heads, kv_heads, d, u, c, 4)], sent


def _check_t1d(ctx) -> None:
    """The reference Transformer-1D under a context layout == one process: loss and every parameter's gradient
    (summed over the group), for two samples of 2p+1 and 3p tokens packed into one padded row of documents."""
    from dcp.data import collate_tokens
    from dcp.models import build_model
    from dcp.runtime.context import SPContext

    gen = torch.Generator().manual_seed(7)
    p = ctx.sp_size
    batch = collate_tokens([torch.randint(0, 256, (n,), generator=gen) for n in (2 * p + 1, 3 * p)])
    ref_model = build_model("t1d-tiny")
    ref_loss, ref_count = ref_model(batch, SPContext.single(attention="sdpa"))
    ref_loss.backward()
    model = build_model("t1d-tiny")
    loss, count = model(batch, ctx)
    loss.backward()
    totals = torch.stack([loss.detach(), count.to(loss.dtype)])
    dist.all_reduce(totals, group=ctx.group)
    torch.testing.assert_close(totals[0], ref_loss.detach(), **TOL)
    assert int(totals[1]) == int(ref_count)
    for (name, param), ref in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        grad = param.grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        torch.testing.assert_close(grad, ref.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def _all_cases(ctx) -> None:
    for heads, kv_heads in ((8, 2), (4, 4)):
        for causal in (True, False):
            _check(ctx, heads, kv_heads, causal)
    _check_t1d(ctx)


def _two(rank: int, world_size: int) -> None:
    from dcp.runtime.context import SPContext

    _all_cases(SPContext(group=dist.group.WORLD, sp_size=2, sp_rank=rank, attention="sdpa", context_size=2,
                         context_group=dist.group.WORLD))


def _four(rank: int, world_size: int) -> None:
    from dcp.planner.plan import GroupPlan
    from dcp.runtime.context import SPContext
    from dcp.runtime.registry import SPGroupRegistry

    # 2x2 from the registry: Ulysses pairs {0,1}, {2,3} (its size-2 blocks), context pairs {0,2}, {1,3}
    registry = SPGroupRegistry(4, 4, [1, 2, 4], context_sizes={4: 2})
    assert registry.creation == "members" and registry.context_blocks == [(4, (0, 2)), (4, (1, 3))]
    assert len(registry._context) == 1 and len(registry._groups) == 3  # one group per size, one context group
    ctx = registry.context(GroupPlan(first_rank=0, sp_size=4, recompute_layers=0, micro_batches=()), rank,
                           attention="sdpa")
    assert (ctx.ulysses_size, ctx.context_size, ctx.context_rank) == (2, 2, rank // 2)
    _all_cases(ctx)
    world = dist.group.WORLD
    _check(SPContext(group=world, sp_size=4, sp_rank=rank, attention="sdpa", context_size=4, context_group=world),
           8, 2, True)


def test_context_parallel_1x2():
    run_distributed(_two, 2)


def test_context_parallel_2x2_and_1x4():
    run_distributed(_four, 4)


def _profile_cp(rank: int, world_size: int, cache_dir: str) -> tuple[int, list]:
    import dcp.runtime.ulysses as uly
    from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig
    from dcp.models import build_model
    from dcp.profiler import load_or_profile
    from dcp.runtime.registry import SPGroupRegistry

    calls = []
    inner = uly.context_attention

    def counting(*args, **kwargs):
        calls.append(kwargs["context"])
        return inner(*args, **kwargs)

    uly.context_attention = counting
    model = build_model("t1d-tiny")
    config = DCPConfig(model=model.config.shape(),
                       profiling=ProfilingConfig(seq_group_edges=(64, 128), max_micro_batch_size=2, cache_dir=cache_dir),
                       advanced=AdvancedConfig(warmup_iters=0, measure_iters=1),
                       planning=PlanningConfig(sp_sizes=(1, 2), ranks_per_node=2))
    registry = SPGroupRegistry(world_size, 2, (1, 2), context_sizes={2: 2})  # SP 2 as 1 x 2
    table, _ = load_or_profile(model, config, world_size, registry, progress=False)
    return len(calls), sorted({(r.sp_size, r.seq_len) for r in table.rows if r.feasible})


def test_the_profiler_measures_an_sp_size_in_its_context_layout(tmp_path):
    """The dual-layer profiler takes each candidate's SPContext from the registry: SP 2 registered as 1x2 is
    measured through the context-parallel attention on both ranks."""
    out = run_distributed(_profile_cp, 2, str(tmp_path), timeout_s=150.0)
    assert all(n > 0 for n, _ in out), out
    assert out[0][1] == out[1][1] and (2, 128) in out[0][1]


def _profile_past_heads(rank: int, world_size: int, cache_dir: str) -> list:
    from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig
    from dcp.models import build_model
    from dcp.profiler import load_or_profile
    from dcp.runtime.registry import SPGroupRegistry

    model = build_model("t1d-tiny", num_heads=2)  # SP 4 is past its 2 heads: layout 2x2
    config = DCPConfig(model=model.config.shape(),
                       profiling=ProfilingConfig(seq_group_edges=(64, 512), max_micro_batch_size=2, cache_dir=cache_dir),
                       advanced=AdvancedConfig(warmup_iters=0, measure_iters=1),
                       planning=PlanningConfig(sp_sizes=(1, 2, 4), ranks_per_node=4, mem_capacity_gib=0.0062))
    registry = SPGroupRegistry.for_config(config, world_size, (1, 2, 4))
    table, _ = load_or_profile(model, config, world_size, registry, progress=False)
    return sorted((r.sp_size, r.seq_len, r.micro_batch_size) for r in table.rows if r.feasible)


def test_the_profiler_measures_a_size_past_the_heads_only_for_what_no_smaller_size_holds(tmp_path):
    """SP 4 on a 2-head model (2 x 2): the 512-token seq_group fits at b = 1 on no smaller size within the
    capacity, so it is measured at SP 4; the 64-token one fits at SP 1 and is not profiled past the heads."""
    out = run_distributed(_profile_past_heads, 4, str(tmp_path), timeout_s=240.0)
    assert all(rows == out[0] for rows in out), out
    past = [row for row in out[0] if row[0] == 4]
    assert past and {seq_len for _, seq_len, _ in past} == {512}, out[0]
    assert (2, 512, 1) not in out[0] and (1, 64, 1) in out[0], out[0]
