"""ZeRO-3 slots: a step's micro-batches arranged so that every group's k-th micro-batch is alike.

Under ``runtime.engine = "fsdp2-zero3"`` each layer's parameters are gathered over all ranks for every
micro-batch, so the ranks go through a step's micro-batch slots together: slot k lasts as long as the slowest
k-th micro-batch of any group, and a group with fewer micro-batches waits through the others' slots
(``zero3_step_s``). The planner balances each group's total time; ``Lockstep`` then arranges
each step's micro-batches for the lockstep, in two moves:

1. ``deal_slots``: per SP size, that size's micro-batches are re-dealt over its groups, longest first, each to
   the group holding the fewest so far (then the least time): the groups of one size end with counts within
   one of each other and their k-th micro-batches of about the same length. A micro-batch keeps its samples,
   its p and its r; only its group (of the same p) changes.
2. Slots alike across SP sizes (1D data): groups of one p can hold many short micro-batches (one long sample
   each at a large p) while groups of another hold a few long ones (packs at p = 1, bounded by memory), so most
   slots leave most ranks waiting. ``_cells`` deals the step's samples anew into k slots of every group (its
   cells; groups keep their ranks and p), longest first, each into the least-loaded cell of the p where it
   adds the fewest GPU-seconds without passing the slot length (the step's work over W and k), each cell priced
   from its real lengths at the least r that fits memory (as the simulator bounds it). Tried at SLOT_TRIES slot
   counts, then around the best and at the SLOT_SLACK lengths; each group runs its micro-batches longest first. The arrangement of least
   ZeRO-3 step time (``zero3_step_s``) is kept, the dealt plan included, so the planner's own pricing never
   loses. 2D micro-batches hold one shape each: dealt only.

What it earns (priced, the default batch, 1k-128k tokens log-uniform, ``experiments/dense8b.toml`` on 64 x H100
under ``--engine fsdp2-zero3``): dealt only 0.657 of the ideal bound, merging each group's own micro-batches
0.752, dealing the samples into cells 0.930; ``experiments/dense70b.toml`` (256 x H100) 0.521 / 0.579 / 0.747.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dcp.memory import gather_rounds
from dcp.planner.cost import memory_row, min_recompute_layers, row_lookup
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.source import EpochInput
from dcp.planner.stream import TimeLookup
from dcp.planner.syncend import measured_sync_s

__all__ = ["Lockstep", "deal_slots", "lockstep_s", "zero3_step_s"]

SLOT_TRIES = 8
"""Slot counts k tried first per step, spread over 2 .. the dealt plan's largest count + 1; then the counts
halfway to the best one's neighbours, and the best at the longer SLOT_SLACK lengths."""

SLOT_SLACK = (1.0, 1.1)
"""Slot lengths tried per k: the step's work over W and k, times these."""


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


def zero3_step_s(slot_times: Sequence[Sequence[float]], sync_s: float, num_layers: int) -> tuple[float, float]:
    """(compute, exposed collectives) of a ZeRO-3 step (``fsdp2-zero3``), from each group's micro-batch times
    in order (``slot_times[g][k]``) and the price of one all-reduce of the gradients (``sync_s``: 2 rounds of
    parameter-sized traffic). Every rank runs the step's largest ga_steps in slots; per slot and layer it
    all-gathers in forward and backward and reduce-scatters in backward (3 rounds per slot,
    ``dcp.memory.gather_rounds``), and a layer's collective completes only once every rank issued it, so the
    ranks move through a slot together: a slot lasts its slowest micro-batch (padding slots: none), or its 3
    rounds when those take longer (FSDP prefetches the next layer's gather during this layer's compute), plus
    its first layer's gather, which nothing hides (exposed). The simulator prices a step with it; the planner
    compares its arrangements with it."""
    slots = max((len(t) for t in slot_times), default=0)
    if slots == 0:
        return 0.0, 0.0
    rounds_s = gather_rounds("fsdp2-zero3", 1) * sync_s / 2
    compute = sum(max(max((t[k] for t in slot_times if k < len(t)), default=0.0), rounds_s) for k in range(slots))
    return compute, slots * rounds_s / (3 * max(1, num_layers))


def lockstep_s(groups: Sequence[Sequence[MicroBatch]], sync_s: float = 0.0, num_layers: int = 1) -> float:
    """A ZeRO-3 step's time from its groups' micro-batches (``zero3_step_s``, compute and exposed gathers);
    with ``sync_s`` 0 (unknown), the sum over slots of the slowest k-th micro-batch."""
    return sum(zero3_step_s([[mb.time_s for mb in mbs] for mbs in groups], sync_s, num_layers))


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
    edges: tuple[int, ...]
    """The table's seq_group bounds (a micro-batch's seq_group is its longest sample's)."""
    sync_s: float = 0.0
    """One all-reduce of the gradients as told or measured (``advanced.grad_sync_s``); 0: unknown (the rows'
    floors still price each micro-batch's gathers)."""
    num_layers: int = 1

    @classmethod
    def of(cls, inp: EpochInput, times: TimeLookup) -> Lockstep | None:
        """The rewrite of this epoch, or None where the engine does not run its ranks in lockstep."""
        if inp.config.runtime.engine != "fsdp2-zero3":
            return None
        return cls(times=times, rows=row_lookup(inp.table), mem_capacity_bytes=inp.config.planning.mem_capacity_bytes,
                   full_recompute=inp.method != "dcp-intra", one_d=inp.shapes is None,
                   edges=tuple(inp.table.seq_group_edges),
                   sync_s=inp.config.advanced.grad_sync_s or measured_sync_s(inp.table, inp.world_size),
                   num_layers=inp.table.num_layers)

    def __call__(self, plan: StepPlan) -> StepPlan:
        dealt = deal_slots(plan)
        if not self.one_d:
            return dealt
        best, best_s = dealt, lockstep_s([g.micro_batches for g in dealt.groups], self.sync_s, self.num_layers)
        top = max(g.ga_steps for g in dealt.groups)
        memo: dict = {}  # memory rows' r and the length models' anchors, for this step only
        spread = sorted({round(2 + (top - 1) * i / max(1, SLOT_TRIES - 1)) for i in range(SLOT_TRIES)})
        tried: dict[tuple[int, float], float] = {}

        def attempt(k: int, slack: float) -> None:
            nonlocal best, best_s
            if k < 1 or (k, slack) in tried:
                return
            cand = self._cells(dealt, k, slack, memo)
            tried[(k, slack)] = s = (math.inf if cand is None else
                                     lockstep_s([g.micro_batches for g in cand.groups], self.sync_s, self.num_layers))
            if s < best_s:
                best, best_s = cand, s

        for k in spread:  # coarse: the slot counts at the step's own length
            attempt(k, SLOT_SLACK[0])
        k_best = min((k for k, _ in tried), key=lambda k: tried[(k, SLOT_SLACK[0])], default=top)
        half = max(1, (spread[1] - spread[0]) // 2) if len(spread) > 1 else 1
        for k, slack in ((k_best - half, SLOT_SLACK[0]), (k_best + half, SLOT_SLACK[0]),
                         *((k_best, x) for x in SLOT_SLACK[1:])):  # fine: beside the best, and longer slots
            attempt(k, slack)
        return best

    def _cells(self, plan: StepPlan, k: int, slack: float, memo: dict) -> StepPlan | None:
        """The step's samples dealt anew into k slots of every group (its cells), longest first, each into the
        least-loaded cell of the p where it adds the fewest GPU-seconds without passing the slot length (the
        step's work over W and k, times ``slack``; past it, the p where it passes least); None where a sample
        fits no cell's memory. Groups keep their ranks and p; a cell is one micro-batch."""
        slot = sum(g.sp_size * g.time_s for g in plan.groups) / plan.world_size / k * slack
        # a cell: ids, lengths, time, r, seq_group, and its count, tokens, squares and longest for pricing
        cells: list[list] = [[[], [], 0.0, 0, 0, 0, 0, 0, 0] for g in plan.groups for _ in range(k)]
        heaps: dict[int, list[tuple[float, int]]] = {}
        for ci in range(len(cells)):
            heaps.setdefault(plan.groups[ci // k].sp_size, []).append((0.0, ci))
        samples = sorted(((i, n) for g in plan.groups for mb in g.micro_batches
                          for i, n in zip(mb.sample_ids, mb.seq_lens, strict=True)), key=lambda x: -x[1])
        for sid, n in samples:
            best = None
            for p, heap in heaps.items():
                c = cells[heap[0][1]]
                lo = min(n, c[1][-1]) if c[1] else n  # samples come longest first: the cell's last is its shortest
                price = self._price_of(c[5] + 1, c[6] + n, c[7] + n * n, lo, max(n, c[8]), p, memo)
                if price is not None:
                    over = max(0.0, price[0] - slot)
                    key = (over > 0, over, p * (price[0] - c[2]), -price[0])
                    if best is None or key < best[0]:
                        best = (key, p, price)
            if best is None:
                return None
            _, p, price = best
            ci = heaps[p][0][1]
            c = cells[ci]
            c[0].append(sid)
            c[1].append(n)
            c[2:5] = price
            c[5], c[6], c[7], c[8] = c[5] + 1, c[6] + n, c[7] + n * n, max(n, c[8])
            heapq.heapreplace(heaps[p], (price[0], ci))
        groups = [sorted((MicroBatch(tuple(c[0]), tuple(c[1]), c[4], c[2], c[3])
                          for c in cells[gi * k:(gi + 1) * k] if c[0]), key=lambda m: -m.time_s)
                  for gi in range(len(plan.groups))]
        return _with(plan, groups)

    def _price(self, lens: list[int], p: int, memo: dict) -> tuple[float, int, int] | None:
        """(time, r, seq_group) of one micro-batch of these lengths at p: its seq_group the longest's, its r the
        least that fits memory (the simulator's bound, ``cost.memory_row``), its time from its real lengths
        (``TimeLookup.lengths_time_s``); None where no profiled row holds it or it does not fit."""
        return self._price_of(len(lens), sum(lens), sum(n * n for n in lens), min(lens), max(lens), p, memo)

    def _price_of(self, count: int, tokens: int, squares: int, lo: int, hi: int, p: int,
                  memo: dict) -> tuple[float, int, int] | None:
        """``_price`` from a micro-batch's sample count, token sum, sum of squares, shortest and longest."""
        group = bisect.bisect_left(self.edges, hi)
        cand = self.rows.get((group, p), [])
        if not cand or cand[-1].micro_batch_size < count:
            return None
        row = memory_row(cand, count, tokens, lo == hi)
        if row is None:
            return None
        r = memo.get(id(row), -1)
        if r == -1:
            r = memo[id(row)] = min_recompute_layers(row, self.mem_capacity_bytes)
        if r is None:
            return None
        r = row.num_layers if self.full_recompute else r
        key = (group, p, r, count)
        if key not in memo:
            memo[key] = self.times.anchor(group, p, r, count)
        t_row, a, b1, b2, at_row = memo[key]
        if not math.isfinite(t_row) or at_row <= 0:
            return t_row, r, group
        return t_row * (a + b1 * float(tokens) + b2 * float(squares)) / at_row, r, group
