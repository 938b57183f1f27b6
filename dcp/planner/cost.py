"""The paper's cost model (Eq. 4-6): time and memory of one micro-batch with r recomputed layers.

A profile row holds per-layer figures measured (or modelled) for one (seq_group, b, p) candidate:

- time   ``T(r) = L * (t_f + t_b) + r * t_f + T_C``      (Eq. 4 and 5: r layers run their forward twice)
- memory ``M(r) = (L - r) * m_act + L * m_inp + M_C``    (Eq. 6: recomputed layers keep only their input)

r = L is full activation checkpointing (the usual setting for long sequences); r = 0 keeps every
layer's activations. ``min_recompute_layers`` is the inner loop of Algorithm 1 read as "the smallest r
that fits the memory capacity".
"""

from __future__ import annotations

import math

from dcp.planner.table import ProfileRow, ProfileTable


def _check_r(row: ProfileRow, recompute_layers: int) -> None:
    if not 0 <= recompute_layers <= row.num_layers:
        raise ValueError(
            f"recompute_layers ({recompute_layers}) is outside 0..L (L = {row.num_layers}): "
            "pass a layer count between 0 (no recompute) and num_layers (full recompute)"
        )


def micro_batch_time_s(row: ProfileRow, recompute_layers: int) -> float:
    """Predicted forward+backward time (s) of one micro-batch: ``L*(t_f+t_b) + r*t_f + T_C``."""
    _check_r(row, recompute_layers)
    return row.num_layers * (row.t_f_s + row.t_b_s) + recompute_layers * row.t_f_s + row.t_const_s


def micro_batch_mem_bytes(row: ProfileRow, recompute_layers: int) -> float:
    """Predicted peak memory (bytes per rank): ``(L-r)*m_act + L*m_inp + M_C``."""
    _check_r(row, recompute_layers)
    L = row.num_layers
    return (L - recompute_layers) * row.m_act_bytes + L * row.m_inp_bytes + row.m_const_bytes


def min_recompute_layers(row: ProfileRow, mem_capacity_bytes: float) -> int | None:
    """Smallest r in 0..L whose memory fits ``mem_capacity_bytes``; None if even r = L does not fit.

    Rows marked infeasible (out of memory while profiling) never fit. Memory decreases by m_act per
    recomputed layer, so the answer is a ceiling division, checked against Eq. 6 to be immune to
    floating-point rounding.
    """
    if not row.feasible:
        return None
    L = row.num_layers
    if micro_batch_mem_bytes(row, L) > mem_capacity_bytes:
        return None
    if row.m_act_bytes <= 0:
        return 0
    excess = micro_batch_mem_bytes(row, 0) - mem_capacity_bytes
    r = min(L, max(0, math.ceil(excess / row.m_act_bytes)))
    # Correct possible off-by-one from rounding: r must fit, r - 1 must not.
    while r < L and micro_batch_mem_bytes(row, r) > mem_capacity_bytes:
        r += 1
    while r > 0 and micro_batch_mem_bytes(row, r - 1) <= mem_capacity_bytes:
        r -= 1
    return r


def row_lookup(table: ProfileTable) -> dict[tuple[int, int], list[ProfileRow]]:
    """The table's rows by (seq_group, sp_size), each list sorted by micro-batch size."""
    rows: dict[tuple[int, int], list[ProfileRow]] = {}
    for row in table.rows:
        rows.setdefault((row.seq_group, row.sp_size), []).append(row)
    for rs in rows.values():
        rs.sort(key=lambda r: r.micro_batch_size)
    return rows


def memory_row(cand: list[ProfileRow], size: int, tokens: int, one_length: bool) -> ProfileRow | None:
    """The row of ``cand`` (one seq_group at one p, ascending b) bounding a micro-batch's memory: samples of one
    length at the smallest b >= ``size``; unequal lengths (1D, run as one row of documents, whose activations grow
    with the tokens) at the smallest b whose b x bound holds its ``tokens``, else by size."""
    by_size = next((r for r in cand if r.micro_batch_size >= size), None)
    if by_size is not None and one_length:
        return by_size
    return next((r for r in cand if r.micro_batch_size * r.seq_len >= tokens), None) or by_size
