"""Per seq_group runtime settings (b, p, r): DCP-intra (Algorithm 1) and DCP-inter's fixed-recompute form.

For every profiled candidate (b, p) of a seq_group the planner computes the recompute r it must use:

- DCP-intra (``dynamic_recompute=True``): the minimal r in 0..L whose memory (Eq. 6) fits the capacity.
  The paper's pseudo-code loops r from 1 and breaks on the first fit; we read it as "minimal recompute
  that fits" (r = 0 allowed), see DESIGN.md section 3.
- DCP-inter (``dynamic_recompute=False``): r = L (full checkpointing) for every candidate; only rows that
  fit at r = L are usable.

It then keeps the candidate with the best per-GPU throughput ``b * s / (p * T)`` (Eq. 1). Ties go to
the smaller p (less communication, more groups), then the larger b, then the smaller r, so the choice is
deterministic. Because DCP-intra's r is never larger than L and time grows with r, DCP-intra's best
throughput is always >= DCP-inter's for the same table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dcp.planner.cost import micro_batch_mem_bytes, micro_batch_time_s, min_recompute_layers
from dcp.planner.table import ProfileRow, ProfileTable
from dcp.planner.tuning import BATCH_STRETCH


@dataclass(frozen=True, slots=True)
class Setting:
    """Runtime settings of one micro-batch kind: seq_group, b, p, r and its predicted cost."""

    seq_group: int
    """Index of the seq_group (position in the table's seq_group_edges)."""
    seq_len: int
    """Tokens per sample of the profiled row (the seq_group's upper bound)."""
    micro_batch_size: int
    """b: samples per micro-batch."""
    sp_size: int
    """p: ranks sharing each sequence."""
    recompute_layers: int
    """r: layers that recompute their forward in backward (r = L: full recompute)."""
    time_s: float
    """Predicted time of one micro-batch (Eq. 4) at this r."""
    mem_bytes: float
    """Predicted memory per rank (Eq. 6) at this r."""

    @property
    def tokens_per_gpu_s(self) -> float:
        """Eq. 1: tokens processed per GPU-second, ``b * seq_len / (p * time_s)``."""
        return self.micro_batch_size * self.seq_len / (self.sp_size * self.time_s)


def setting_for_row(row: ProfileRow, *, mem_capacity_bytes: float, dynamic_recompute: bool) -> Setting | None:
    """The setting a row gives under the capacity (None if it does not fit even at r = L)."""
    r_min = min_recompute_layers(row, mem_capacity_bytes)
    if r_min is None:
        return None
    r = r_min if dynamic_recompute else row.num_layers
    t = micro_batch_time_s(row, r)
    if not t > 0:
        raise ValueError(
            f"profile row (seq_group {row.seq_group}, b {row.micro_batch_size}, p {row.sp_size}) predicts a "
            f"non-positive time ({t}): t_f_s, t_b_s and t_const_s must be >= 0 with a positive sum; "
            "re-profile or fix the table"
        )
    return Setting(
        seq_group=row.seq_group,
        seq_len=row.seq_len,
        micro_batch_size=row.micro_batch_size,
        sp_size=row.sp_size,
        recompute_layers=r,
        time_s=t,
        mem_bytes=micro_batch_mem_bytes(row, r),
    )


def _rank_key(s: Setting) -> tuple[float, int, int, int]:
    return (-s.tokens_per_gpu_s, s.sp_size, -s.micro_batch_size, s.recompute_layers)


def candidate_settings(
    table: ProfileTable,
    *,
    mem_capacity_bytes: float,
    sp_sizes: Iterable[int],
    world_size: int,
    ranks_per_node: int,
    dynamic_recompute: bool,
) -> dict[int, list[Setting]]:
    """Per seq_group, the setting of every profiled (b, p) that fits (p <= world_size, p in sp_sizes)."""
    if world_size < 1:
        raise ValueError(f"world_size ({world_size}) must be >= 1: pass the number of ranks")
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node ({ranks_per_node}) must be >= 1: pass the ranks of one node")
    # Every p <= world_size can be placed: p <= ranks_per_node fits inside a node (or the whole, smaller,
    # world); p > ranks_per_node spans whole nodes starting at a multiple of p.
    allowed = {p for p in sp_sizes if 1 <= p <= world_size}
    out: dict[int, list[Setting]] = {}
    for g in range(len(table.seq_group_edges)):
        cands = []
        for row in table.rows_for(g):
            if row.sp_size not in allowed:
                continue
            s = setting_for_row(
                row, mem_capacity_bytes=mem_capacity_bytes, dynamic_recompute=dynamic_recompute
            )
            if s is not None:
                cands.append(s)
        if cands:
            out[g] = cands
    return out


def best_settings(
    table: ProfileTable,
    *,
    mem_capacity_bytes: float,
    sp_sizes: Iterable[int],
    world_size: int,
    ranks_per_node: int,
    dynamic_recompute: bool,
) -> dict[int, Setting]:
    """Per seq_group, the throughput-optimal (b, p, r). seq_groups with no fitting row are absent."""
    cands = candidate_settings(
        table,
        mem_capacity_bytes=mem_capacity_bytes,
        sp_sizes=sp_sizes,
        world_size=world_size,
        ranks_per_node=ranks_per_node,
        dynamic_recompute=dynamic_recompute,
    )
    return {g: min(c, key=_rank_key) for g, c in cands.items()}


def settings_by_sp(
    table: ProfileTable,
    *,
    mem_capacity_bytes: float,
    sp_sizes: Iterable[int],
    world_size: int,
    ranks_per_node: int,
    dynamic_recompute: bool,
) -> dict[int, dict[int, Setting]]:
    """Per seq_group, per feasible p (ascending), the best (b, r) at that p; used to fill leftover ranks."""
    cands = candidate_settings(
        table,
        mem_capacity_bytes=mem_capacity_bytes,
        sp_sizes=sp_sizes,
        world_size=world_size,
        ranks_per_node=ranks_per_node,
        dynamic_recompute=dynamic_recompute,
    )
    out: dict[int, dict[int, Setting]] = {}
    for g, c in cands.items():
        by_p: dict[int, Setting] = {}
        for s in sorted(c, key=_rank_key):
            by_p.setdefault(s.sp_size, s)
        out[g] = {p: by_p[p] for p in sorted(by_p)}
    return out


def batch_settings(
    table: ProfileTable,
    best: dict[int, Setting],
    step_time_s: float,
    *,
    mem_capacity_bytes: float,
    sp_sizes: Iterable[int],
    world_size: int,
    ranks_per_node: int,
    dynamic_recompute: bool,
) -> dict[int, Setting]:
    """Per seq_group in ``best``, the setting for steps of about ``step_time_s`` (a user's global batch,
    planning.tokens_per_step): the least GPU-seconds per token counting, besides its own work (p x T), the
    world's wait when one micro-batch outlasts the step (W x (T - step)). A micro-batch that fits the step
    (within ``BATCH_STRETCH``) keeps Eq. 1's choice; a longer one gets a smaller b, or more ranks (as Megatron's dynamic CP raises a
    long sequence's CP size), where that costs less than the wait."""
    cands = candidate_settings(table, mem_capacity_bytes=mem_capacity_bytes, sp_sizes=sp_sizes, world_size=world_size,
                               ranks_per_node=ranks_per_node, dynamic_recompute=dynamic_recompute)

    def cost(s: Setting) -> tuple:
        wait = world_size * max(0.0, s.time_s - step_time_s)
        return ((s.sp_size * s.time_s + wait) / (s.micro_batch_size * s.seq_len), *_rank_key(s))

    out = {}
    for g, primary in best.items():
        if primary.time_s <= step_time_s:
            out[g] = primary
        elif primary.time_s <= BATCH_STRETCH * step_time_s:  # a smaller b of the same kind (p, r) only
            out[g] = min((s for s in cands[g] if (s.sp_size, s.recompute_layers) ==
                          (primary.sp_size, primary.recompute_layers)), key=cost)
        else:
            out[g] = min(cands[g], key=cost)
    return out
