"""Context parallelism (CP): the sequence sharded over a context group, K/V all-gathered for attention.

Ulysses shards heads, so its SP size stops at the K/V heads of a grouped-query model (8 for Llama-3). The
context axis shards the sequence instead: a micro-batch's SP group of p = u * c ranks runs Ulysses inside
groups of u ranks and context parallelism across the c of them (``dcp.planner.layout``: which ranks form
which group, and why u = gcd(p, H_kv)).

**Causal load balance.** The padded sequence is cut into 2c chunks of L tokens; context rank i holds chunks
i and 2c-1-i (front and back), so every context rank's queries see the same number of causal keys (a rank
holding only the end of the sequence would do 2c-1 times the work of the one holding its start).
Sequences are padded to a multiple of 2 c u tokens (``SPContext.padded_len``); a rank holds the ranges
``SPContext.shard_ranges`` gives (``take_shard`` cuts them out). Padding is masked, never dropped.

**All-gather of K/V, not a ring.** Each context rank gathers the K and V of the whole sequence for its own
heads (``all_gather_single``; its backward reduce-scatters dK, dV), then attends its 2L queries over them,
one SDPA call per chunk and document (below). This is Llama 3's long-context scheme. Chosen over ring
attention with P2P because (1) it is exact by construction: one softmax over all keys, no online-softmax
merge of partial results, so outputs and gradients equal one process's to fp32 rounding; (2) with GQA the
gathered K/V are small: ``2 (H_kv/u) d`` per token against ``(H/u) d`` of queries, half of it for Llama-3 (8 of 32 heads);
(3) packed documents and causal load balance need no per-step mask bookkeeping (a ring must skip or mask
each of its c blocks per document and merge c partial softmaxes, in forward and backward). The price was
measured, not assumed (``dcp bench layouts``, 2 gloo ranks on this project's 2-core CPU, median of 8):
moving one rank's K/V block (fp32, 2 K/V heads of 64) took 8.7 ms as one all-gather against 4.6 ms as a
ring's P2P step at 8192 tokens, and 5.8 ms against 2.6 ms at 4096. So gloo's
all-gather is slower than the ring's exchanges, and a ring would also overlap its steps with the blocks'
attention. With GQA the K/V are a small share of the layer's traffic (``2 H_kv/H`` of the Ulysses
exchange's q bytes), which is why exactness won here; a ring with overlap is the next step where the
exposed all-gather shows in measured step times (the cost model prices it exposed,
``dcp.planner.analytic``). A rank holds the whole sequence's K/V of its heads (``2 s (H_kv/u) d`` elements per layer), and
SDPA keeps them for the layer's backward.

**No masks.** ``doc_lens`` (host ints, as for ``dcp.runtime.attention``) describe the full padded sequence.
Each of the rank's two chunks runs one SDPA call per document it meets: the chunk's queries of that document
over the document's keys up to the chunk's last query of it (all of the document's keys when not causal),
under SDPA's lower-right causal bias, so SDPA keeps its fused kernels (flash / memory-efficient on CUDA) and
memory stays linear in the length. Padded queries get exact zeros, never computed; padding keys are never
read. K/V heads stay unexpanded: SDPA's ``enable_gqa`` maps each query head to its K/V head. (A dense
``b x 2L x s`` mask, the earlier path for packed rows, ran 10x slower a rank than one call over the sequence
on an H200: docs/benchmarks.md.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from dcp.runtime.attention import check_doc_lens
from dcp.runtime.context import balanced_chunks

__all__ = ["attend_gathered", "context_attention", "take_shard"]


def take_shard(x: torch.Tensor, ranges: Sequence[tuple[int, int]], dim: int = 1) -> torch.Tensor:
    """The part of ``x`` (padded along ``dim``) this rank holds: its ``SPContext.shard_ranges``, concatenated."""
    pieces = [x.narrow(dim, a, b - a) for a, b in ranges]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)


class _GatherSeq(torch.autograd.Function):
    """All-gather along a new leading dim; backward reduce-scatters the gradient (each rank gets the sum, over
    the group, of the gradients of its own piece). NCCL runs reduce_scatter_tensor; gloo, which has none,
    runs an all-to-all of the gradient pieces and sums them (the same bytes per rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        _collective("all_gather_single", "all_gather_into_tensor")(out, x, group=group)
        return out.view(-1, *x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "gloo":
            recv = torch.empty_like(grad)
            dist.all_to_all_single(recv, grad, group=ctx.group)
            return recv.sum(dim=0), None
        out = grad.new_empty(grad.shape[1:])
        _collective("reduce_scatter_single", "reduce_scatter_tensor")(out, grad.flatten(0, 1), group=ctx.group)
        return out, None


def _collective(name: str, old_name: str) -> Any:
    """torch.distributed's collective ``name``, or its older name in a torch that predates it."""
    return getattr(dist, name, None) or getattr(dist, old_name)


def _gather_kv(k: torch.Tensor, v: torch.Tensor, group: Any, context: int, padded: int) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """K and V of the whole padded sequence in position order: one differentiable all-gather of both."""
    parts = _GatherSeq.apply(torch.stack((k, v)), group)  # [c, 2, b, 2L, hk, d]: rank j holds chunks j, 2c-1-j
    chunk = padded // (2 * context)
    ordered: list[torch.Tensor] = [parts[0]] * (2 * context)
    for j in range(context):
        ordered[j], ordered[2 * context - 1 - j] = parts[j, :, :, :chunk], parts[j, :, :, chunk:]
    kv = torch.cat(ordered, dim=2)
    return kv[0], kv[1]


@torch.compiler.disable  # host-int masks and collectives stay eager in a compiled block
def context_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Any,
    context: int,
    context_rank: int,
    causal: bool,
    doc_lens: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Attention of this context rank's queries over the whole sequence's keys.

    q: [b, 2L, H_loc, d], k, v: [b, 2L, H_kv_loc, d] (unexpanded; H_kv_loc divides H_loc): this context rank's
    chunks i and 2c-1-i put together, for its heads. ``doc_lens`` describes the full padded sequence of
    2L * c tokens (None: every row one document of that length). Returns [b, 2L, H_loc, d].
    """
    _, s_local, hq, _ = q.shape
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or hq % k.shape[2]:
        raise ValueError(f"q ({tuple(q.shape)}), k ({tuple(k.shape)}), v ({tuple(v.shape)}) must be [b, s, H, d] and "
                         "[b, s, H_kv, d] with H_kv dividing H: pass this rank's heads, K/V unexpanded")
    if s_local % 2 and context > 1:
        raise ValueError(f"local sequence ({s_local}) is not two equal chunks: pad with SPContext.padded_len")
    padded = s_local * context
    if context > 1:
        k, v = _gather_kv(k, v, group, context, padded)
    return attend_gathered(q, k, v, context=context, context_rank=context_rank, causal=causal, doc_lens=doc_lens)


def attend_gathered(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, context: int, context_rank: int,
                    causal: bool, doc_lens: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
    """The kernels of ``context_attention`` after its all-gather: this context rank's queries q [b, 2L, H_loc, d]
    over k, v [b, 2L * c, H_kv_loc, d] of the whole padded sequence in position order. One process can run
    every context rank's part with it (``dcp bench gpu --only cp`` does, on one GPU)."""
    b, s_local, hq, _ = q.shape
    padded = s_local * context
    if k.shape != v.shape or k.shape[:2] != (b, padded) or hq % k.shape[2]:
        raise ValueError(f"k ({tuple(k.shape)}) and v ({tuple(v.shape)}) must be [b, {padded}, H_kv, d] with H_kv "
                         f"dividing q's {hq} heads: pass the gathered K/V of the whole sequence")
    docs = ((padded,),) * b if doc_lens is None else check_doc_lens(doc_lens, b, padded, "doc_lens (full sequence)")
    chunks = balanced_chunks(padded, context, context_rank) if context > 1 else ((0, padded),)
    gqa = hq != k.shape[2]
    rows, computed = [], False
    for r, row in enumerate(docs):
        pieces, local = [], 0  # local: where the chunk's first query sits in this rank's q
        for a, e in chunks:
            filled = a
            for lo, hi, (k0, k1) in _document_spans(row, a, e, causal):
                # the chunk's queries [lo, hi) of one document over that document's keys [k0, k1)
                qs = q[r:r + 1, local + lo - a:local + hi - a]
                pieces.append(_sdpa(qs, k[r:r + 1, k0:k1], v[r:r + 1, k0:k1], causal, gqa))
                filled, computed = hi, True
            if filled < e:  # padding: exact zeros, never computed
                pieces.append(q.new_zeros(1, e - filled, *q.shape[2:]))
            local += e - a
        rows.append(torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0])
    if not computed:  # nothing but padding: zeros that keep q, k, v in the graph
        return q * 0 + (k.sum() + v.sum()) * 0
    return torch.cat(rows, dim=0) if len(rows) > 1 else rows[0]


def _document_spans(row: Sequence[int], a: int, e: int, causal: bool) -> list[tuple[int, int, tuple[int, int]]]:
    """(query start, query end, (key start, key end)) in global positions for each document of ``row`` that
    meets the chunk [a, e): causal queries read their document's keys up to the chunk's last query of it,
    non-causal ones the whole document."""
    spans, start = [], 0
    for n in row:
        lo, hi = max(a, start), min(e, start + n)
        if lo < hi:
            spans.append((lo, hi, (start, hi if causal else start + n)))
        start += n
    return spans


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool) -> torch.Tensor:
    """SDPA on [b, s, h, d] slices; K/V heads unexpanded when ``gqa``. Causal with fewer queries than keys is
    lower-right (the queries are the keys' last ones), which SDPA runs on its fused kernels."""
    mask = causal_lower_right(q.shape[1], k.shape[1]) if causal else None
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         enable_gqa=gqa)
    return out.transpose(1, 2)
