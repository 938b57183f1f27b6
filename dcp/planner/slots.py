"""ZeRO-3 slots: a step's micro-batches arranged so that every group's k-th micro-batch is alike.

Under ``runtime.engine = "fsdp2-zero3"`` each layer's parameters are gathered over all ranks for every
micro-batch, so the ranks go through a step's micro-batch slots together: slot k lasts as long as the slowest
k-th micro-batch of any group, and a group with fewer micro-batches waits through the others' slots
(``dcp.sim.cluster.zero3_step_s``). The planner balances each group's total time; ``Lockstep`` then arranges
each step's micro-batches for the lockstep, in two moves:

1. ``deal_slots``: per SP size, that size's micro-batches are re-dealt over its groups, longest first, each to
   the group holding the fewest so far (then the least time): the groups of one size end with counts within
   one of each other and their k-th micro-batches of about the same length. A micro-batch keeps its samples,
   its p and its r; only its group (of the same p) changes.
2. Common slot count (1D data): groups of one p can hold many short micro-batches (one long sample each at
   a large p) while groups of another hold a few long ones (packs at p = 1, bounded by memory), so most slots
   leave most ranks waiting. For a few slot counts K (the counts the groups hold), every group with more than
   K micro-batches merges them into K, longest first, each into the shortest of its K whose merged
   micro-batch still fits memory (its own r, from the memory row as the simulator bounds it; a new one where
   none fits). Each group then runs its micro-batches longest first. The arrangement whose lockstep time (sum
   over slots of the slowest) is least is kept, the dealt plan included, so the planner's own pricing never
   loses.

What it earns (priced, ``experiments/dense8b.toml`` under ``--engine fsdp2-zero3``: 64 x H100, 1,000 samples of
1k-128k tokens log-uniform, the default batch): 0.657 -> 0.752 of the ideal bound with the filler pricing of
the same change (``experiments/dense70b.toml``, 256 x H100: 0.521 -> 0.579).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from dcp.planner.cost import memory_row, min_recompute_layers, row_lookup
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.source import EpochInput
from dcp.planner.stream import TimeLookup

__all__ = ["Lockstep", "deal_slots", "lockstep_s"]

SLOT_COUNTS_TRIED = 6
"""Slot counts K tried per step (the largest distinct counts the dealt groups hold): each try re-chunks only
the groups holding more than K micro-batches."""


def deal_slots(plan: StepPlan) -> StepPlan:
    """``plan`` with each SP size's micro-batches dealt over that size's groups (see the module docstring)."""
    groups = list(plan.groups)
    by_size: dict[int, list[int]] = {}
    for gi, g in enumerate(groups):
        by_size.setdefault(g.sp_size, []).append(gi)
    dealt: list[list] = [[] for _ in groups]
    for members in by_size.values():
        mbs = [mb._replace(recompute_layers=groups[gi].recompute_of(mb))
               for gi in members for mb in groups[gi].micro_batches]
        heap = [(0, 0.0, gi) for gi in members]  # (micro-batches so far, their time, group): the fewest, then least
        for mb in sorted(mbs, key=lambda m: -m.time_s):
            count, load, gi = heap[0]
            dealt[gi].append(mb)
            heapq.heapreplace(heap, (count + 1, load + mb.time_s, gi))
    return _with(plan, dealt)


def lockstep_s(groups: Sequence[Sequence[MicroBatch]]) -> float:
    """Sum over slots of the slowest k-th micro-batch: a ZeRO-3 step's compute, its collectives aside."""
    slots = max((len(mbs) for mbs in groups), default=0)
    return sum(max(mbs[k].time_s for mbs in groups if k < len(mbs)) for k in range(slots))


def _with(plan: StepPlan, groups: Sequence[Sequence[MicroBatch]]) -> StepPlan:
    """``plan``'s groups (ranks and p) with these micro-batches, each at its own r; a group's r the most of them."""
    out = [GroupPlan(g.first_rank, g.sp_size, max((m.recompute_layers for m in ms), default=g.recompute_layers),
                     tuple(ms)) for g, ms in zip(plan.groups, groups, strict=True)]
    return StepPlan(plan.epoch, plan.step, plan.world_size, plan.method, out)


@dataclass(frozen=True)
class Lockstep:
    """The step rewrite of ``fsdp2-zero3`` (module docstring); ``Lockstep.of`` builds it for an epoch."""

    times: TimeLookup
    rows: dict
    mem_capacity_bytes: float
    full_recompute: bool
    """DCP-inter and the other methods run every micro-batch at r = L."""
    one_d: bool
    """1D data: micro-batches may merge into one row of documents (2D ones hold one shape: dealt only)."""

    @classmethod
    def of(cls, inp: EpochInput, times: TimeLookup) -> Lockstep | None:
        """The rewrite of this epoch, or None where the engine does not run its ranks in lockstep."""
        if inp.config.runtime.engine != "fsdp2-zero3":
            return None
        return cls(times=times, rows=row_lookup(inp.table), mem_capacity_bytes=inp.config.planning.mem_capacity_bytes,
                   full_recompute=inp.method != "dcp-intra", one_d=inp.shapes is None)

    def __call__(self, plan: StepPlan) -> StepPlan:
        dealt = deal_slots(plan)
        if not self.one_d:
            return dealt
        groups = [list(g.micro_batches) for g in dealt.groups]
        best, best_s = groups, lockstep_s(groups)
        counts = sorted({len(mbs) for mbs in groups if mbs}, reverse=True)
        for k in counts[1:SLOT_COUNTS_TRIED + 1]:
            cand = [self._into(mbs, g.sp_size, k) if len(mbs) > k else mbs
                    for g, mbs in zip(dealt.groups, groups, strict=True)]
            s = lockstep_s(cand)
            if s < best_s:
                best, best_s = cand, s
        return dealt if best is groups else _with(dealt, best)

    def _into(self, mbs: list[MicroBatch], p: int, k: int) -> list[MicroBatch]:
        """``mbs`` (of one group at p) merged into k micro-batches where memory allows, longest first."""
        bins: list[MicroBatch] = []
        for mb in sorted(mbs, key=lambda m: -m.time_s):
            if len(bins) < k or mb.seq_group < 0:
                bins.append(mb)
                continue
            for i in sorted(range(len(bins)), key=lambda i: bins[i].time_s):
                merged = self._merge(bins[i], mb, p)
                if merged is not None:
                    bins[i] = merged
                    break
            else:
                bins.append(mb)
        return sorted(bins, key=lambda m: -m.time_s)

    def _merge(self, a: MicroBatch, b: MicroBatch, p: int) -> MicroBatch | None:
        """One micro-batch of ``a``'s and ``b``'s samples at p (its seq_group the longer's, its r the least
        that fits memory), or None where no profiled row holds it or it does not fit."""
        if a.seq_group < 0 or b.seq_group < 0:
            return None
        group = max(a.seq_group, b.seq_group)
        lens = a.seq_lens + b.seq_lens
        cand = self.rows.get((group, p), [])
        if not cand or cand[-1].micro_batch_size < len(lens):
            return None
        row = memory_row(cand, len(lens), sum(lens), min(lens) == max(lens))
        r = None if row is None else min_recompute_layers(row, self.mem_capacity_bytes)
        if r is None:
            return None
        r = row.num_layers if self.full_recompute else r
        return MicroBatch(a.sample_ids + b.sample_ids, lens, group, self.times.lengths_time_s(group, p, r, lens), r)
