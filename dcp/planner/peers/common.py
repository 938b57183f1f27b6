"""What both peers share: the fixed token budget per step, memory capacities, pricing and StepPlan building.

Both peers run on dcp's own cost model: a 1D pack of documents (one row of documents, document-masked
attention) is priced by ``TimeLookup.pack_time_s`` from its real lengths with the per-micro-batch overhead
paid once, and its memory is that of one sequence of the pack's total tokens at b = 1 (the row of the
seq_group whose bound holds the total), which is how ``dcp.sim.cluster`` checks a packed micro-batch. A 2D
(video) micro-batch holds samples of one shape and one seq_group, priced by ``TimeLookup.lengths_time_s``
and bounded in memory by its seq_group's row at the smallest profiled b >= its size, as DCP's are.

An optimizer step of a peer may run in several *phases* (FlexSP's phases, Megatron's scheduling rounds): a
phase is a fixed layout of SP groups over all ranks, and the next phase starts when every rank has finished
(a new layout needs every rank). A phase is one StepPlan; the phases of a step share its step index and the
simulator runs them one after another with one gradient sync per step (``dcp.sim.cluster``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dcp.config import gib
from dcp.planner.cost import micro_batch_mem_bytes
from dcp.planner.placement import node_bounds
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.step_tokens import cut_by_tokens
from dcp.planner.stream import PlanningError, TimeLookup
from dcp.planner.table import ProfileTable


def cut_steps(lengths: np.ndarray, target_tokens: float,
              bounds: tuple[float, float] = (0.5, 2.0)) -> list[tuple[int, int]]:
    """Consecutive [start, end) ranges of the stream (lengths in stream order), one per optimizer step of about
    ``target_tokens`` (``dcp.planner.step_tokens.cut_by_tokens``: about total / target steps of an equal share, every
    step within the bounds unless one sample alone is larger)."""
    if not target_tokens > 0:
        raise PlanningError(f"tokens per step ({target_tokens}) must be > 0: pass a positive token budget")
    return cut_by_tokens(np.asarray(lengths, dtype=np.int64).tolist(), target_tokens, bounds)


@dataclass(slots=True)
class PeerCost:
    """Capacities and prices of one (table, memory capacity, SP sizes, world size) for the peers."""

    table: ProfileTable
    mem_capacity_bytes: float
    sp_sizes: tuple[int, ...]
    """Allowed SP sizes (<= world size), ascending."""
    two_d: bool
    """True for video data (one shape per micro-batch, run one micro-batch at a time)."""
    times: TimeLookup = field(init=False)
    _cap: dict = field(init=False, default_factory=dict)
    _bfit: dict = field(init=False, default_factory=dict)
    _fit: dict = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.times = TimeLookup(self.table)

    @property
    def num_layers(self) -> int:
        return self.table.num_layers

    def _row(self, group: int, p: int, b: int):
        return next((r for r in self.table.rows_for(group) if r.sp_size == p and r.micro_batch_size >= b), None)

    def fits(self, group: int, p: int, r: int, b: int = 1) -> bool:
        key = (group, p, r, b)
        got = self._fit.get(key)
        if got is None:
            row = self._row(group, p, b)
            got = self._fit[key] = (row is not None and row.feasible
                                    and micro_batch_mem_bytes(row, r) <= self.mem_capacity_bytes)
        return got

    def capacity_tokens(self, p: int, r: int) -> int:
        """Most tokens one sequence (a 1D pack) may hold on p ranks at recompute r: the largest seq_group bound
        whose b = 1 row fits memory (0: none)."""
        key = (p, r)
        if key not in self._cap:
            edges = self.table.seq_group_edges
            self._cap[key] = max((edges[g] for g in range(len(edges)) if self.fits(g, p, r)), default=0)
        return self._cap[key]

    def max_batch(self, group: int, p: int, r: int) -> int:
        """2D: the largest profiled b of a seq_group that fits memory at (p, r) (0: none)."""
        key = (group, p, r)
        if key not in self._bfit:
            rows = [row for row in self.table.rows_for(group) if row.sp_size == p and row.feasible
                    and micro_batch_mem_bytes(row, r) <= self.mem_capacity_bytes]
            self._bfit[key] = max((row.micro_batch_size for row in rows), default=0)
        return self._bfit[key]

    def group_of(self, n: int) -> int:
        return int(np.searchsorted(np.asarray(self.table.seq_group_edges), n, side="left"))

    def smallest_fit(self, n: int, r: int, at_least: int = 1) -> int:
        """Smallest allowed p >= at_least on which a sequence of n tokens fits memory at r (0: none)."""
        for p in self.sp_sizes:
            if p >= at_least and (self.fits(self.group_of(n), p, r) if self.two_d else self.capacity_tokens(p, r) >= n):
                return p
        return 0

    def seq_times(self, lens: np.ndarray, p: int, r: int) -> np.ndarray:
        """Time of every sequence run alone (b = 1) on p ranks at recompute r, from its real length (inf where its
        seq_group has no row at p that fits memory even with full recompute)."""
        lens = np.asarray(lens, dtype=np.int64)
        out = np.zeros(len(lens))
        groups = np.searchsorted(np.asarray(self.table.seq_group_edges), lens, side="left")
        for g in np.unique(groups).tolist():
            sel = groups == g
            if not self.fits(g, p, self.num_layers):  # no feasible row at p: the sequence never runs there
                out[sel] = np.inf
                continue
            n = lens[sel].astype(np.float64)
            out[sel] = self.times.lengths_times_s(g, p, r, 1, n, n * n)
        return out

    def overhead_s(self, p: int, r: int) -> float:
        """The per-micro-batch part of a pack's time (a 1-token pack): paid once per pack."""
        return self.times.pack_time_s(p, r, [1])

    def micro_batches(self, ids: Sequence[int], lens: Sequence[int], shapes: np.ndarray | None, p: int,
                      r: int, cap_tokens: int = 0) -> list[MicroBatch]:
        """The micro-batches one SP group runs for these samples: 1D, packs of at most capacity_tokens(p, r)
        tokens (and ``cap_tokens`` when > 0), first fit, longest first; 2D, one shape per micro-batch in chunks
        of the largest b that fits (and holds at most ``cap_tokens`` tokens when > 0, at least one sample)."""
        if not self.two_d:
            cap = self.capacity_tokens(p, r)
            cap = min(cap, cap_tokens) if cap_tokens > 0 else cap
            packs: list[list[int]] = []
            room: list[int] = []
            for j in sorted(range(len(ids)), key=lambda j: -lens[j]):
                k = next((k for k, left in enumerate(room) if left >= lens[j]), -1)
                if k < 0:
                    packs.append([])
                    room.append(cap)
                    k = len(packs) - 1
                packs[k].append(j)
                room[k] -= lens[j]
            out = []
            for pk in packs:
                pk.sort()
                ln = [lens[j] for j in pk]
                t = self.times.pack_time_s(p, r, ln)
                out.append(MicroBatch(tuple(ids[j] for j in pk), tuple(ln), -1, t))
            return out
        by_shape: dict[tuple[int, int], list[int]] = {}
        for j in range(len(ids)):
            by_shape.setdefault(tuple(shapes[j].tolist()), []).append(j)
        out = []
        for shape in sorted(by_shape):
            js = by_shape[shape]
            g = self.group_of(shape[0] * shape[1])
            b = max(1, self.max_batch(g, p, r))
            if cap_tokens > 0:
                b = max(1, min(b, cap_tokens // (shape[0] * shape[1])))
            for lo in range(0, len(js), b):
                chunk = js[lo : lo + b]
                ln = [lens[j] for j in chunk]
                t = self.times.lengths_time_s(g, p, r, ln)
                out.append(MicroBatch(tuple(ids[j] for j in chunk), tuple(ln), g, t))
        return out


def aligned_start(free: list[bool], p: int, ranks_per_node: int) -> int | None:
    """Lowest free aligned block of p ranks (``dcp.planner.placement``'s rule: inside one node at a node-local
    multiple of p, or whole nodes at a global multiple of p when p exceeds a node); None: none is free."""
    W = len(free)
    if p <= ranks_per_node:
        for ns, ne in node_bounds(W, ranks_per_node):
            for s in range(ns, ne - p + 1, p):
                if all(free[s : s + p]):
                    return s
        return None
    for s in range(0, W - p + 1, p):
        if all(free[s : s + p]):
            return s
    return None


def phase_plan(epoch: int, step: int, world_size: int, method: str,
               groups: Sequence[tuple[int, int, int, Sequence[MicroBatch]]]) -> StepPlan:
    """A phase as a StepPlan: (first rank, p, r, micro-batches) per group; ranks no group covers idle as
    one-rank groups."""
    covered = [False] * world_size
    out = []
    for first, p, r, mbs in groups:
        out.append(GroupPlan(first, p, r, tuple(mbs)))
        covered[first : first + p] = [True] * p
    out += [GroupPlan(k, 1, 0, ()) for k in range(world_size) if not covered[k]]
    out.sort(key=lambda g: g.first_rank)
    return StepPlan(epoch, step, world_size, method, out)


def check_fits(cost: PeerCost, lengths: np.ndarray, r: int, world_size: int) -> None:
    """PlanningError naming the longest sample when no allowed SP size holds it at recompute r."""
    longest = int(lengths.max(initial=0))
    if longest and not cost.smallest_fit(longest, r):
        i = int(np.argmax(lengths))
        raise PlanningError(
            f"sample {i} ({longest} tokens) fits no sp_size in {list(cost.sp_sizes)} (<= world_size {world_size}) "
            f"within {gib(cost.mem_capacity_bytes)} at recompute {r}: raise planning.mem_capacity_gib, "
            "allow larger planning.sp_sizes or more ranks"
        )


def power_of_two_at_least(x: float) -> int:
    return 1 if x <= 1 else 2 ** math.ceil(math.log2(x) - 1e-12)
