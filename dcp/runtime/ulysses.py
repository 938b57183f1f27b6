"""Ulysses sequence parallelism: all-to-all between sequence-sharded and head-sharded layouts.

Each rank of an SP group of size p holds one contiguous chunk of the (padded) sequence, with all heads:
[b, s/p, H, d]. Attention needs the whole sequence, so one all-to-all trades the sequence split for a
head split, [b, s, H/p, d]; each rank attends over the full sequence for its H/p heads (heads are
independent), and a second all-to-all goes back. Communication volume per rank is O(b s H d / p), which
is why short sequences should run with small p (DCP's point) and long ones with large p.

``all_to_all_sp`` is built on ``torch.distributed.all_to_all_single``, which gloo (CPU) and NCCL both
implement; its backward is the inverse all-to-all. The process group is always passed in explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from dcp.runtime.attention import check_doc_lens, local_attention
from dcp.runtime.context import SPContext, pad_to_multiple, shard_range
from dcp.runtime.context_parallel import context_attention

__all__ = ["IMPLS", "all_to_all_sp", "check_heads", "pad_to_multiple", "shard_range", "ulysses_attention"]

IMPLS = ("dcp", "deepspeed")


def _all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    p = dist.get_world_size(group)
    if x.shape[scatter_dim] % p:
        raise ValueError(
            f"all_to_all_sp scatter dim {scatter_dim} has size {x.shape[scatter_dim]}, not divisible by the SP "
            f"group size ({p}): pad the sequence with pad_to_multiple and use a head count divisible by p"
        )
    # Chunk j (along scatter_dim) goes to rank j; what arrives from rank j is rank j's piece of gather_dim.
    send = torch.stack(x.chunk(p, dim=scatter_dim), dim=0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # Ranks hold contiguous chunks in rank order, so concatenating in rank order rebuilds gather_dim.
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAllSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        # The inverse exchange: every rank of the group runs it, in the same order as the forward ones.
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def all_to_all_sp(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Differentiable all-to-all: split ``scatter_dim`` over the group, concatenate ``gather_dim``.

    With ``group`` None (or a group of one rank) it returns ``x`` unchanged.
    """
    if group is None or dist.get_world_size(group) == 1:
        return x
    ndim = x.dim()
    scatter_dim, gather_dim = scatter_dim % ndim, gather_dim % ndim
    if scatter_dim == gather_dim:
        raise ValueError(f"scatter_dim ({scatter_dim}) equals gather_dim ({gather_dim}): pass two different dims")
    return _AllToAllSP.apply(x, group, scatter_dim, gather_dim)


def check_heads(num_heads: int, sp_size: int) -> None:
    """Ulysses shards heads over the group: p must divide the head count."""
    if num_heads % sp_size:
        raise ValueError(
            f"sp_size ({sp_size}) does not divide the number of attention heads ({num_heads}): Ulysses shards "
            "heads across the SP group; choose an SP size that divides the head count"
        )


def _checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: SPContext, *, impl: str,
             doc_lens: Sequence[Sequence[int]] | None, key_padding_mask: torch.Tensor | None) -> tuple[Any, Any, Any]:
    """ulysses_attention's inputs checked on the host before any communication: (k, v, doc_lens), with k and v
    repeated up to the query heads where they cannot cross the exchange unexpanded."""
    if impl not in IMPLS:
        raise ValueError(f"ulysses impl ({impl!r}) is not one of {list(IMPLS)}: pick one of those")
    u, c = ctx.ulysses_size, ctx.context_size
    check_heads(q.shape[2], u)
    if c > 1 and (impl == "deepspeed" or key_padding_mask is not None):
        raise ValueError(f"a context layout ({u}x{c}) runs impl 'dcp' with doc_lens only (not deepspeed's layer or "
                         "a key_padding_mask): pass doc_lens, or use an SP size within the K/V heads")
    if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        # Grouped-query attention: each kv head serves H / H_kv query heads. Ulysses gives rank j the query
        # heads [j H/u, (j+1) H/u), which read exactly the kv heads [j H_kv/u, (j+1) H_kv/u) when u divides
        # H_kv: those are sent as they are and repeated only where attention needs them (H/H_kv times fewer
        # kv bytes on the wire; a context layout gathers and attends them unexpanded). Otherwise (or for
        # deepspeed's layer, which takes equal heads) they are repeated up to H first, so a rank receives
        # exactly the kv heads its query heads read.
        if q.shape[2] % k.shape[2] or k.shape[2] != v.shape[2]:
            raise ValueError(
                f"key/value heads ({k.shape[2]}, {v.shape[2]}) must be equal and divide the query heads "
                f"({q.shape[2]}): pass grouped-query attention tensors [b, s, H_kv, d]"
            )
        if u > 1 and (impl == "deepspeed" or k.shape[2] % u):
            rep = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    if key_padding_mask is not None and key_padding_mask.shape[1] != q.shape[1] * ctx.sp_size:
        raise ValueError(
            f"key_padding_mask length ({key_padding_mask.shape[1]}) != s_local ({q.shape[1]}) * sp_size "
            f"({ctx.sp_size}): pass the mask of the full padded sequence"
        )
    if doc_lens is not None:  # checked here, on the host, before any communication
        doc_lens = check_doc_lens(doc_lens, q.shape[0], q.shape[1] * ctx.sp_size, "doc_lens (full sequence)")

    return k, v, doc_lens


@torch.compiler.disable  # layouts from host ints and SP collectives stay eager in a compiled block
def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: SPContext,
    *,
    causal: bool,
    doc_lens: Sequence[Sequence[int]] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    impl: str = "dcp",
) -> torch.Tensor:
    """Sequence-parallel attention. q, k, v: this rank's chunk [b, s_local, H, d]; returns [b, s_local, H, d].

    ``doc_lens`` (dcp.runtime.attention) describes the FULL padded sequence of s_local * sp_size tokens:
    every rank of the group holds the same host ints from the micro-batch. With a context axis
    (``ctx.context_size`` > 1) the exchange runs inside the Ulysses group and ``context_attention``
    (dcp.runtime.context_parallel) attends across the context group; the rank then holds the ranges
    ``ctx.shard_ranges`` gives. After the first all-to-all a
    rank holds whole sequences of its H/p heads, so it attends inside each document exactly as one
    process would, with no mask and no host read. ``key_padding_mask`` (bool [b, s_local * sp_size]) is
    the dense masked reference path instead.
    """
    k, v, doc_lens = _checked(q, k, v, ctx, impl=impl, doc_lens=doc_lens, key_padding_mask=key_padding_mask)
    u, c = ctx.ulysses_size, ctx.context_size

    def attend(qf: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor) -> torch.Tensor:
        if c > 1:
            return context_attention(qf, kf, vf, group=ctx.context_group, context=c, context_rank=ctx.context_rank,
                                     causal=causal, doc_lens=doc_lens)
        if kf.shape[2] != qf.shape[2]:
            rep = qf.shape[2] // kf.shape[2]
            kf, vf = kf.repeat_interleave(rep, dim=2), vf.repeat_interleave(rep, dim=2)
        return local_attention(qf, kf, vf, causal=causal, doc_lens=doc_lens, key_padding_mask=key_padding_mask,
                               backend=ctx.attention)

    if u == 1:
        return attend(q, k, v)
    if impl == "deepspeed":
        return _deepspeed_attention(q, k, v, ctx, attend)
    if k.shape[2] == q.shape[2]:
        # One exchange for q, k and v together: [b, s/u, 3, H, d] -> [b, s, 3, H/u, d].
        qkv = all_to_all_sp(torch.stack((q, k, v), dim=2), ctx.a2a_group, scatter_dim=3, gather_dim=1)
        out = attend(*qkv.unbind(dim=2))
    else:
        out = attend(*_exchange_grouped(q, k, v, ctx))
    return all_to_all_sp(out, ctx.a2a_group, scatter_dim=1, gather_dim=2)


def _exchange_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      ctx: SPContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One exchange of unexpanded grouped-query heads; returns q, k, v of this rank's heads, kv unexpanded.

    Chunk j of the packed head dim holds rank j's H/u query heads, then its H_kv/u key and value heads:
    [b, s/u, u * (H/u + 2 H_kv/u), d] -> [b, s, H/u + 2 H_kv/u, d].
    """
    u, b, s = ctx.ulysses_size, q.shape[0], q.shape[1]
    hq, hk = q.shape[2] // u, k.shape[2] // u
    packed = torch.cat([t.reshape(b, s, u, -1, t.shape[-1]) for t in (q, k, v)], dim=3).flatten(2, 3)
    mine = all_to_all_sp(packed, ctx.a2a_group, scatter_dim=2, gather_dim=1)
    q, k, v = mine.split([hq, hk, hk], dim=2)
    return q, k, v


def _deepspeed_attention(q, k, v, ctx: SPContext, attend) -> torch.Tensor:
    """DeepSpeed's DistributedAttention with our group; needs deepspeed.comm initialised (see docs/models.md)."""
    import deepspeed.comm as ds_comm
    from deepspeed.sequence.layer import DistributedAttention

    if not ds_comm.is_initialized():
        # Wraps the already-initialised torch.distributed world; creates no new groups.
        ds_comm.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
    # batch-first layout: scatter heads (dim 2), gather the sequence (dim 1).
    layer = DistributedAttention(_Attend(attend), ctx.group, scatter_idx=2, gather_idx=1)
    return layer(q, k, v, 0)


class _Attend(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.fn(q, k, v)
