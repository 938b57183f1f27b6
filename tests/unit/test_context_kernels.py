"""``attend_gathered``: every context rank's queries over the gathered K/V, one process, against one process's
attention over the whole sequence (fp32): packed documents that cross chunk edges, a chunk of padding only, a
row of padding only, causal and full attention, grouped-query K/V unexpanded."""

from __future__ import annotations

import pytest
import torch

from dcp.runtime.attention import local_attention
from dcp.runtime.context import balanced_chunks
from dcp.runtime.context_parallel import attend_gathered, take_shard

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("context", [1, 2, 4])
def test_every_rank_over_the_gathered_kv_equals_one_process(causal, context):
    padded, heads, kv_heads, d = 48, 4, 2, 8
    # row 0: documents crossing chunk edges, the last chunks padding only; row 1: one short document; row 2: none
    docs = ((3, 9, 1, 7, 4), (5,), ())
    gen = torch.Generator().manual_seed(context + causal)
    q, up = (torch.randn(3, padded, heads, d, generator=gen) for _ in range(2))
    k, v = (torch.randn(3, padded, kv_heads, d, generator=gen) for _ in range(2))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = local_attention(full[0], *(t.repeat_interleave(heads // kv_heads, dim=2) for t in full[1:]), causal=causal,
                          doc_lens=docs, backend="sdpa")
    (ref * up).sum().backward()

    kg, vg = (t.clone().requires_grad_() for t in (k, v))  # the gathered K/V every rank reads
    qs = []
    for rank in range(context):
        ranges = balanced_chunks(padded, context, rank) if context > 1 else ((0, padded),)
        qr = take_shard(q, ranges).clone().requires_grad_()
        out = attend_gathered(qr, kg, vg, context=context, context_rank=rank, causal=causal, doc_lens=docs)
        torch.testing.assert_close(out, take_shard(ref.detach(), ranges), **TOL)
        (out * take_shard(up, ranges)).sum().backward()
        torch.testing.assert_close(qr.grad, take_shard(full[0].grad, ranges), **TOL)
        qs.append(qr)
    # the K/V gradients summed over the ranks (what the all-gather's reduce-scatter makes of them)
    torch.testing.assert_close(kg.grad, full[1].grad, **TOL)
    torch.testing.assert_close(vg.grad, full[2].grad, **TOL)
    assert not kg.grad[1, 5:].any() and not kg.grad[2].any()  # padding keys are never read


def test_a_micro_batch_of_padding_only_gives_zeros_with_gradients():
    q = torch.randn(1, 8, 2, 4, requires_grad=True)
    k, v = (torch.randn(1, 16, 2, 4, requires_grad=True) for _ in range(2))
    out = attend_gathered(q, k, v, context=2, context_rank=1, causal=True, doc_lens=((),))
    assert not out.any()
    out.sum().backward()
    assert not q.grad.any() and not k.grad.any()
