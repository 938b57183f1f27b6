"""Grouped-query attention under Ulysses on gloo: when the SP size divides the kv heads, k and v cross the
all-to-all unexpanded (fewer bytes) and are repeated after it; the result and every gradient equal the path
that repeats them before the exchange and the one-process reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist

TOL = dict(rtol=1e-5, atol=1e-6)


def _run(ctx, q, k, v, up, expand_first: bool):
    from dcp.runtime.ulysses import ulysses_attention

    rep = q.shape[2] // k.shape[2]
    start, end = ctx.shard(q.shape[1])
    shard = [t[:, start:end].clone().requires_grad_() for t in (q, k, v)]
    qs, ks, vs = shard
    if expand_first:  # the reference path: kv heads repeated up to H before the exchange
        ks, vs = ks.repeat_interleave(rep, dim=2), vs.repeat_interleave(rep, dim=2)
    sent = []
    inner = dist.all_to_all_single

    def counting(out, inp, *args, **kwargs):
        sent.append(inp.numel())
        return inner(out, inp, *args, **kwargs)

    dist.all_to_all_single = counting
    try:
        out = ulysses_attention(qs, ks, vs, ctx, causal=True)
        (out * up[:, start:end]).sum().backward()
    finally:
        dist.all_to_all_single = inner
    return out.detach(), [t.grad for t in shard], sent


def _check(ctx, heads: int, kv_heads: int) -> None:
    from dcp.runtime.attention import local_attention

    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    s_full, d = 4 * ctx.sp_size, 8
    q, up = (torch.randn(2, s_full, heads, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, s_full, kv_heads, d, generator=gen) for _ in range(2))
    out, grads, sent = _run(ctx, q, k, v, up, expand_first=False)
    out_x, grads_x, sent_x = _run(ctx, q, k, v, up, expand_first=True)
    torch.testing.assert_close(out, out_x, **TOL)
    for a, b in zip(grads, grads_x, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    # forward q/k/v exchange, forward output, then the same two backwards: the first and last carry q, k, v
    b, s_local = 2, s_full // ctx.sp_size
    expanded = b * s_local * 3 * heads * d
    assert sent_x[0] == expanded
    want = b * s_local * (heads + 2 * kv_heads) * d if kv_heads % ctx.sp_size == 0 else expanded
    assert sent[0] == want and sent[-1] == want, (sent, want)
    # and both equal one process attending over the whole sequence with kv repeated by hand
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    rep = heads // kv_heads
    ref = local_attention(full[0], full[1].repeat_interleave(rep, dim=2), full[2].repeat_interleave(rep, dim=2),
                          causal=True, key_padding_mask=None, backend="sdpa")
    (ref * up).sum().backward()
    start, end = ctx.shard(s_full)
    torch.testing.assert_close(out, ref[:, start:end].detach(), **TOL)
    for g, f in zip(grads, full, strict=True):
        torch.testing.assert_close(g, f.grad[:, start:end], **TOL)


def _gqa_p2_p4(rank: int, world_size: int) -> None:
    from dcp.runtime.context import SPContext

    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    p2 = SPContext(group=pairs[rank // 2], sp_size=2, sp_rank=rank % 2, attention="sdpa")
    p4 = SPContext(group=dist.group.WORLD, sp_size=4, sp_rank=rank, attention="sdpa")
    _check(p2, heads=8, kv_heads=2)  # 2 divides 2 kv heads: unexpanded, 4x fewer kv bytes
    _check(p2, heads=8, kv_heads=4)
    _check(p4, heads=8, kv_heads=4)  # 4 divides 4: unexpanded
    _check(p4, heads=8, kv_heads=2)  # 4 does not divide 2: expanded before the exchange, as before


def test_gqa_kv_heads_cross_unexpanded_and_match_the_expanded_path():
    run_distributed(_gqa_p2_p4, 4)
