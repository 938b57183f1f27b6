"""The layout of an SP size: (ulysses, context), and the bytes each axis moves per attention.

A micro-batch's SP group of p ranks is laid out as ``ulysses x context`` (p = u * c): ranks
``first + ci * u .. first + ci * u + u - 1`` form Ulysses group ``ci`` (contiguous, so they share a node
first), and the ranks with the same index ``ui`` inside their Ulysses group form a context group (stride u).
The sequence is cut into 2c chunks; context rank ci holds chunks ci and 2c-1-ci (causal load balance), and
Ulysses rank ui holds the ui-th contiguous piece of those two chunks put together.

One layout per SP size, a function of the model's heads: ``u = gcd(p, H_kv)``, ``c = p / u`` (for a size
past the heads, a multiple of H_kv: ``u = H_kv``). Ulysses is
preferred as far as it holds whole K/V heads, because its all-to-all moves ``~ (2 + 2 H_kv/H) n h d / p``
per rank (falling with p) while the context all-gather moves the K/V of the whole sequence shard,
``2 b s (H_kv/H) h d / u * (c-1)/c`` (not falling with c); past H_kv, Ulysses would have to send
repeated K/V heads (H/H_kv times the bytes) over larger, slower groups, so context parallelism takes over.
With H_kv = H (no grouped-query attention) every SP size dividing H is plain Ulysses (c = 1).

All counts are bytes per rank per attention, forward; backward moves the same (all-to-all's inverse; the
all-gather's reduce-scatter of dK, dV). They equal what ``dcp.runtime.ulysses`` and
``dcp.runtime.context_parallel`` send (tests/dist/test_context_parallel.py counts them).
"""

from __future__ import annotations

import math


class LayoutError(ValueError):
    """An SP size with no layout for the model's heads; the message names the value, the rule and a fix."""


def sp_layout(sp_size: int, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
    """(ulysses, context) of ``sp_size`` ranks for a model of ``num_heads`` query and ``num_kv_heads`` K/V heads."""
    if sp_size < 1:
        raise LayoutError(f"sp_size ({sp_size}) must be >= 1: pass the ranks sharing one sequence")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise LayoutError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads}): pass the model's "
                          "key/value head count")
    if num_heads % sp_size:
        if sp_size > num_heads and sp_size % num_kv_heads == 0:  # past the heads: all K/V heads, then context
            return num_kv_heads, sp_size // num_kv_heads
        raise LayoutError(f"sp_size ({sp_size}) does not divide num_heads ({num_heads}) nor is a multiple of "
                          f"num_kv_heads ({num_kv_heads}) above it: use a divisor of the heads or such a multiple")
    u = math.gcd(sp_size, num_kv_heads)
    return u, sp_size // u


def layout_name(ulysses: int, context: int) -> str:
    """'UxC', as reports write a layout (e.g. '8x2')."""
    return f"{ulysses}x{context}"


def ulysses_bytes(tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, ulysses: int,
                  dtype_bytes: int) -> tuple[int, int]:
    """(q/k/v exchange, output exchange): bytes one rank sends into the Ulysses all-to-alls of one attention
    forward, holding ``tokens`` tokens (its own share, before the exchange). K/V go unexpanded when
    ``ulysses`` divides ``num_kv_heads`` (the runtime repeats them after the exchange), else repeated to H
    first. Includes the piece a rank keeps for itself (what all_to_all_single is handed)."""
    if ulysses <= 1:
        return 0, 0
    kv = num_kv_heads if num_kv_heads % ulysses == 0 else num_heads
    return tokens * (num_heads + 2 * kv) * head_dim * dtype_bytes, tokens * num_heads * head_dim * dtype_bytes


def context_bytes(tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, ulysses: int, context: int,
                  dtype_bytes: int) -> int:
    """Bytes one rank contributes to the K/V all-gather of one attention forward: its ``tokens`` (the context
    rank's sequence shard, after the Ulysses exchange) of its ``H_kv / u`` K and V heads, unexpanded."""
    if context <= 1:
        return 0
    return 2 * tokens * (num_kv_heads // ulysses) * head_dim * dtype_bytes


def _transfer_s(nbytes: float, size: int, span: int, hardware: object) -> float:
    """One collective over ``size`` ranks spread over ``span`` consecutive ranks: latency + ``nbytes * (size-1) /
    size`` over the intra-node bandwidth when the span fits in a node, else the inter-node one (the cost
    model's all-to-all rule, ``dcp.planner.analytic.all_to_all_time_s``, for a group that need not be
    contiguous)."""
    if size <= 1:
        return 0.0
    fits = span <= hardware.ranks_per_node  # type: ignore[attr-defined]
    bw = hardware.intra_node_bw_bytes_per_s if fits else hardware.inter_node_bw_bytes_per_s  # type: ignore[attr-defined]
    return hardware.collective_latency_s + nbytes * (size - 1) / size / bw  # type: ignore[attr-defined]


def layout_comm_s(model: object, micro_batch_size: int, seq_len: int, sp_size: int, hardware: object, *,
                  dtype_bytes: int, attentions: int = 1, kv_heads: int | None = None,
                  layout: tuple[int, int] | None = None) -> float:
    """Seconds of communication per layer forward (backward moves the same) of one micro-batch on ``sp_size``
    ranks laid out as ``sp_layout``: the Ulysses all-to-alls (q/k/v in, output back; priced as
    ``A2A_PER_ATTENTION`` = 4 collectives' latency, as before the context axis, so a model without grouped
    K/V prices exactly as plain Ulysses) and the context axis's K/V all-gather, not overlapped with
    attention (the runtime gathers before it attends). ``kv_heads`` overrides the model's (2D attention
    has no grouped K/V: pass its head count); ``layout`` (u, c) prices another layout of ``sp_size`` than
    ``sp_layout``'s (a benchmark's comparison)."""
    h, heads = model.hidden_size, model.num_heads  # type: ignore[attr-defined]
    kv = kv_heads or model.kv_heads  # type: ignore[attr-defined]
    u, c = layout or sp_layout(sp_size, heads, kv)
    hd = h // heads
    tokens = micro_batch_size * seq_len / sp_size
    qkv, out = ulysses_bytes(1, heads, kv, hd, u, dtype_bytes)
    t = 0.0
    if u > 1:
        # 4 latencies and the bytes of the q/k/v and output exchanges over the u contiguous ranks
        t += 4 * _transfer_s(tokens * (qkv + out) / 4, u, u, hardware)
    if c > 1:
        gather = context_bytes(1, heads, kv, hd, u, c, dtype_bytes) * micro_batch_size * seq_len / c
        # all-gather: each rank receives (c-1) contributions; the group spans the whole SP block
        t += _transfer_s(gather * c, c, sp_size, hardware)
    return attentions * t


def layout_saved_bytes(model: object, micro_batch_size: int, seq_len: int, sp_size: int, *, dtype_bytes: int,
                       kv_heads: int | None = None) -> float:
    """Bytes per rank per layer the context axis adds to what a layer keeps for backward: the gathered K/V of
    the whole sequence for the rank's heads, minus its own share (already counted); 0 without a context axis."""
    heads = model.num_heads  # type: ignore[attr-defined]
    kv = kv_heads or model.kv_heads  # type: ignore[attr-defined]
    u, c = sp_layout(sp_size, heads, kv)
    if c == 1:
        return 0.0
    hd = model.hidden_size // heads  # type: ignore[attr-defined]
    return 2.0 * micro_batch_size * seq_len * (kv // u) * hd * dtype_bytes * (c - 1) / c


def context_slowdown(model: object, sp_size: int, hardware: object, attention: str = "1d") -> float:
    """How much longer attention takes on ``sp_size`` ranks than its FLOPs / p at one call's rate: 1 / the
    hardware's ``context_attention_efficiency`` where the layout has a context axis (1D attention only), else 1."""
    if attention != "1d" or sp_layout(sp_size, model.num_heads, model.kv_heads)[1] == 1:  # type: ignore[attr-defined]
        return 1.0
    return 1.0 / hardware.context_attention_efficiency  # type: ignore[attr-defined]
