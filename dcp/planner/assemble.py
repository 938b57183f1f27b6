"""Step assembly: an epoch's shuffled stream becomes a sequence of StepPlans (DCP-inter and DCP-intra).

Per step:

1. Window. The first unconsumed micro-batch (in readiness order) anchors a look-ahead window of
   ``lookahead_samples`` stream positions (0 in the config: sized from the table, ``default_lookahead``);
   only micro-batches released inside it may join the step.
2. Selection (``EpochPlanner._select``). Walk the window in order; a micro-batch opens an SP group with its
   seq_group's setting (b, p, r) if p fits the ranks still free and its seq_group has window work to keep
   one more group busy for the longest micro-batch chosen so far; a second pass hands still-free ranks to
   any window micro-batch. Skipped micro-batches wait (bounded by the window) or become extra ga_steps.
3. Placement. Groups go on rank blocks largest p first (``placement.place_largest_first``): aligned
   inside one node unless p exceeds a node. A group that cannot be placed waits for the next step.
4. Filling. Every free segment left is filled from its left end with the next window micro-batch of any
   seq_group that has a setting whose p fits the aligned slot (its primary setting or a smaller-p one from
   ``settings_by_sp``; a smaller p may need a smaller b, so such a group runs the micro-batch as several
   chunks). Ranks nothing can fill become idle one-rank groups with no micro-batches.
5. Balance. The exact DCP-inter solver (``inter.solve_ga_kinds``, groups of one (seq_group, p, cap)
   merged) picks every group's ga_steps, capped by the micro-batches of its seq_group inside the window
   (split in rank order between groups of the same seq_group); each group then takes that many
   micro-batches from its seq_group's FIFO queue.

Every sample is in exactly one micro-batch and every micro-batch is consumed once; each step consumes at
least the largest selected group's micro-batch, so the epoch ends. The plan depends only on (lengths,
table, config, world_size, epoch): numpy's seeded Generator and ordered containers, never hash() or set
iteration order.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import operator
from collections.abc import Iterator, Sequence

import numpy as np

from dcp.config import DCPConfig
from dcp.planner.inter import solve_ga_kinds
from dcp.planner.intra import Setting, best_settings, settings_by_sp
from dcp.planner.placement import place_largest_first
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.stream import (
    MicroBatchQueues,
    PlanningError,
    TimeLookup,
    check_shapes,
    micro_batch_times,
    no_setting_error,
    seq_groups_of,
    shuffled_order,
)
from dcp.planner.table import ProfileTable

DEFAULT_LOOKAHEAD_PER_RANK = 32
"""Minimum look-ahead samples per rank when planning.lookahead_samples is 0 (4 * world_size * 8)."""


_FIRST = operator.itemgetter(0)


def lookahead_samples(config: DCPConfig, world_size: int) -> int:
    """The configured look-ahead, or its lower bound 32 per rank when it is 0 (EpochPlanner.lookahead_samples
    holds the value in use, which for 0 is also large enough to hold the work of a balanced step)."""
    return config.planning.lookahead_samples or DEFAULT_LOOKAHEAD_PER_RANK * world_size


LOOKAHEAD_WORK_FACTOR = 2.0
"""Default window: this many times the samples whose GPU-time fills one longest micro-batch on every rank."""


def default_lookahead(world_size: int, longest_s: float, gpu_s_per_sample: float, n: int) -> int:
    """Look-ahead for planning.lookahead_samples = 0: ``LOOKAHEAD_WORK_FACTOR * W * T_max / g`` samples,
    with T_max the longest primary micro-batch time and g the epoch's mean GPU-seconds per sample, so the
    window holds about twice the work of a step whose groups all last one longest micro-batch; at least 32
    per rank, at most the epoch. With a fixed 32 samples per rank, short micro-batches run out beside a
    long one when micro-batch times differ ~40x, and their ranks idle."""
    need = LOOKAHEAD_WORK_FACTOR * world_size * longest_s / gpu_s_per_sample if gpu_s_per_sample > 0 else n
    return int(min(max(DEFAULT_LOOKAHEAD_PER_RANK * world_size, math.ceil(need)), max(n, 1)))


class EpochPlanner:
    """Iterates the StepPlans of one epoch (any planning.method). Deterministic for (seed, epoch)."""

    def __init__(
        self, lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, epoch: int = 0,
        *, shapes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """``shapes``: (frames, spatial tokens) per sample for 2D data, whose micro-batches pad T and S
        separately (``dcp.planner.stream``); None for 1D data."""
        if world_size < 1:
            raise PlanningError(f"world_size ({world_size}) must be >= 1: pass the number of ranks")
        self.config = config
        self.table = table
        self.world_size = world_size
        self.epoch = epoch
        self.method = config.planning.method
        self.lengths, self.groups = seq_groups_of(lengths, table)
        self.shapes = check_shapes(shapes, self.lengths)
        self.order = shuffled_order(len(self.lengths), config.planning.seed, epoch)
        self.settings: dict[int, Setting] = {}
        """Primary setting per seq_group (DCP methods; empty for baselines)."""
        self.batch_sizes: dict[int, int] = {}
        """Bucket baseline only: micro-batch size per seq_group."""
        self.baseline_sp_size = 0
        """Bucket and packed baselines: the fixed SP size (0 for DCP)."""
        self.lookahead_samples = lookahead_samples(config, world_size)
        """Look-ahead window in stream positions (DCP methods; see default_lookahead for the 0 default)."""
        if self.method in ("bucket", "packed"):
            from dcp.planner import baselines

            self._steps = baselines.baseline_steps(self)
        else:
            self._prepare()
            self._steps = self._dcp_steps()

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[StepPlan]:
        return self

    def __next__(self) -> StepPlan:
        # A step at thousands of ranks allocates ~10^4 small acyclic objects that reference counting frees;
        # letting the cyclic garbage collector scan and promote them costs ~30% of planning time, so it is
        # paused while one step is built (and restored even when planning raises).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return next(self._steps)
        finally:
            if paused:
                gc.enable()

    # ----- DCP ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Once per epoch: settings, micro-batches, per-micro-batch times and queue indices."""
        cfg = self.config.planning
        kw = dict(
            mem_capacity_bytes=cfg.mem_capacity_bytes,
            sp_sizes=cfg.sp_sizes,
            world_size=self.world_size,
            ranks_per_node=cfg.ranks_per_node,
            dynamic_recompute=self.method == "dcp-intra",
        )
        best = best_settings(self.table, **kw)
        by_sp = settings_by_sp(self.table, **kw)
        present = np.unique(self.groups).tolist()
        for g in present:
            if g not in best:
                raise no_setting_error(
                    g,
                    self.table,
                    self.groups,
                    mem_capacity_bytes=cfg.mem_capacity_bytes,
                    sp_sizes=cfg.sp_sizes,
                    world_size=self.world_size,
                )
        self.settings = {g: best[g] for g in present}
        self._by_sp = {g: by_sp[g] for g in present}
        self._options = {g: list(by_sp[g].values()) for g in present}
        self._present = present
        self._times = TimeLookup(self.table)
        self._unit_memo: dict[tuple[int, int], float] = {}
        mbq = self._mbq = MicroBatchQueues(
            self.lengths, self.groups, self.order, {g: s.micro_batch_size for g, s in self.settings.items()},
            shapes=self.shapes,
        )
        n_groups = len(self.table.seq_group_edges)
        self._p_of = [0] * n_groups
        """Primary sp_size per seq_group (0: no samples)."""
        self._unit_primary = [0.0] * n_groups
        """Primary time of one full micro-batch per seq_group."""
        count = np.asarray(mbq.count, dtype=np.int64)
        for g in present:
            s = self.settings[g]
            self._p_of[g] = s.sp_size
            self._unit_primary[g] = self._unit_time(s)
        mb_time = micro_batch_times(
            mbq, self._times, {g: (self.settings[g].sp_size, self.settings[g].recompute_layers) for g in present}
        )
        self._mb_time = tuple(mb_time.tolist())
        """Predicted time of every micro-batch with its seq_group's primary setting, at its padded length
        (balancing still uses the conservative per-seq_group unit times)."""
        self._mb_end = tuple((np.asarray(mbq.start, dtype=np.int64) + count).tolist())
        self._ready = tuple(mbq.ready.tolist())
        self._queue = [mbq.queue.get(g, ()) for g in range(n_groups)]
        """Per seq_group (index): its FIFO queue of global micro-batch indices."""
        if cfg.lookahead_samples:
            self.lookahead_samples = cfg.lookahead_samples
        else:
            counts = np.bincount(self.groups, minlength=n_groups)
            per_sample = sum(
                counts[g] * self._unit_primary[g] * self._p_of[g] / self.settings[g].micro_batch_size
                for g in present
            ) / max(1, self.num_samples)
            self.lookahead_samples = default_lookahead(
                self.world_size, max(self._unit_primary), per_sample, self.num_samples
            )

    def unit_time_s(self, seq_group: int, sp_size: int) -> float:
        """Predicted time for an SP group of sp_size ranks to run one full micro-batch of seq_group (DCP)."""
        return self._unit_time(self._by_sp[seq_group][sp_size])

    def _chunk(self, setting: Setting) -> int:
        """Samples per chunk when a group runs a primary micro-batch with this (possibly smaller-p) setting."""
        return min(setting.micro_batch_size, self.settings[setting.seq_group].micro_batch_size)

    def _unit_time(self, setting: Setting) -> float:
        """Time for a group with this setting to run one full primary micro-batch of its seq_group."""
        key = (setting.seq_group, setting.sp_size)
        t = self._unit_memo.get(key)
        if t is None:
            g, b = setting.seq_group, self.settings[setting.seq_group].micro_batch_size
            c = self._chunk(setting)
            q, rem = divmod(b, c)
            t = q * self._times.time_s(g, setting.sp_size, setting.recompute_layers, c)
            if rem:
                t += self._times.time_s(g, setting.sp_size, setting.recompute_layers, rem)
            self._unit_memo[key] = t
        return t

    def _dcp_steps(self) -> Iterator[StepPlan]:
        cfg = self.config.planning
        W, rpn = self.world_size, cfg.ranks_per_node
        look = self.lookahead_samples
        present, p_of, ready = self._present, self._p_of, self._ready
        n_groups = len(p_of)
        front = [0] * n_groups  # per seq_group: queue index of its first unconsumed micro-batch
        queue = self._queue
        step = 0
        while True:
            # The first unconsumed micro-batch: each seq_group is consumed in FIFO order, so it is the
            # earliest of the queue fronts (O(seq_groups), not a scan over what was consumed).
            fronts = [queue[g][front[g]] for g in present if front[g] < len(queue[g])]
            if not fronts:
                return
            head = min(fronts)
            # 1. window: micro-batches released before ready[head] + look; end[g] = window end in queue g.
            wend = bisect.bisect_left(ready, ready[head] + look, lo=head)
            end = [0] * n_groups
            for g in present:
                end[g] = bisect.bisect_left(queue[g], wend, lo=front[g])

            # 2. selection: the seq_group of every SP group of the step.
            chosen, taken = self._select(head, W, front, end)

            # 3. placement, largest p first (stable among equal p).
            chosen.sort(key=p_of.__getitem__, reverse=True)  # stable: equal p keep window order
            starts, free = place_largest_first([p_of[g] for g in chosen], W, rpn)
            # (first rank, seq_group, setting); setting None: an idle rank
            records: list[tuple[int, int, Setting | None]] = []
            settings = self.settings
            for g, st in zip(chosen, starts, strict=True):
                if st is None:
                    taken[g] -= 1  # the last selected of its seq_group (same p, stable order): it waits
                else:
                    records.append((st, g, settings[g]))

            # 4. fill free segments from their left end.
            for a, e in free:
                while a < e:
                    pick = self._filler(a % rpn, e - a, front, taken, end, queue)
                    if pick is None:
                        records.append((a, -1, None))
                        a += 1
                    else:
                        records.append((a, pick.seq_group, pick))
                        taken[pick.seq_group] += 1
                        a += pick.sp_size
            records.sort(key=_FIRST)
            yield self._balance_and_build(step, records, front, end, queue)
            step += 1

    def _select(self, head: int, world: int, front: list, end: list) -> tuple[list[int], list[int]]:
        """Open SP groups for window micro-batches, in window order, until the ranks are used.

        Pass 1 opens a group for a micro-batch only if its seq_group has enough work in the window to keep
        one more group busy for the longest micro-batch time chosen so far (``avail * T_g >= (n_g + 1) * T_ref``);
        otherwise the micro-batch is left to the seq_group's existing groups as extra ga_steps. Without this,
        many short micro-batches released early each open a group that then idles beside a long one.
        Pass 2 uses ranks still free for any remaining window micro-batch. The head micro-batch always
        opens a group, so every step makes progress. Within a seq_group only counts are chosen here; the
        groups take their micro-batches in FIFO order when the step is built.
        """
        p_of, unit, queue = self._p_of, self._unit_primary, self._queue
        taken = [0] * len(p_of)
        g = self._mbq.group[head]
        chosen = [g]
        taken[g] = 1
        remaining = world - p_of[g]
        t_ref = unit[g]
        # Walk the window in release order as a merge of the per-seq_group FIFO queues: the heap holds the
        # next unselected micro-batch of every seq_group still in play (O(log G) per step of the walk).
        heap = [(queue[h][front[h] + taken[h]], h) for h in self._present if front[h] + taken[h] < end[h]]
        heapq.heapify(heap)
        while remaining > 0 and heap:
            _, g = heap[0]
            p, t_g = p_of[g], unit[g]
            t_new = t_g if t_g > t_ref else t_ref
            if p <= remaining and (end[g] - front[g]) * t_g >= (taken[g] + 1) * t_new * (1 - 1e-9):
                chosen.append(g)
                taken[g] += 1
                remaining -= p
                t_ref = t_new
                i = front[g] + taken[g]
                if i < end[g]:
                    heapq.heapreplace(heap, (queue[g][i], g))
                else:
                    heapq.heappop(heap)
            else:
                # Fails now and for ever: remaining only shrinks, t_ref only grows, taken[g] stays.
                heapq.heappop(heap)
        heap = [(queue[h][front[h] + taken[h]], h) for h in self._present if front[h] + taken[h] < end[h]]
        heapq.heapify(heap)
        while remaining > 0 and heap:
            _, g = heap[0]
            if p_of[g] > remaining:
                heapq.heappop(heap)  # remaining only shrinks: this seq_group cannot open a group any more
                continue
            chosen.append(g)
            taken[g] += 1
            remaining -= p_of[g]
            i = front[g] + taken[g]
            if i < end[g]:
                heapq.heapreplace(heap, (queue[g][i], g))
            else:
                heapq.heappop(heap)
        return chosen, taken

    def _filler(
        self, local: int, room: int, front: list, taken: list, end: list, queue: list
    ) -> Setting | None:
        """Setting for the next window micro-batch (earliest released) that has a p fitting the slot."""
        best_k, best = None, None
        for g in self._present:
            i = front[g] + taken[g]
            if i >= end[g]:
                continue
            k = queue[g][i]
            if best_k is not None and k >= best_k:
                continue
            fits = [s for s in self._options[g] if s.sp_size <= room and local % s.sp_size == 0]
            if fits:
                best_k = k
                best = max(fits, key=lambda s: (s.tokens_per_gpu_s, s.sp_size))
        return best

    def _balance_and_build(self, step: int, records: list, front: list, end: list, queue: list) -> StepPlan:
        """5. ga_steps per group (exact, over merged kinds), then each group takes its micro-batches."""
        cfg = self.config.planning
        members: dict[int, list[int]] = {}  # seq_group -> record indices, in rank order
        for j, (_, g, s) in enumerate(records):
            if s is not None:
                members.setdefault(g, []).append(j)
        # Caps: the window's micro-batches of a seq_group, split in rank order between its groups.
        # Groups of one (seq_group, p, cap) are interchangeable, so they form one weighted kind.
        kind_of = [0] * len(records)
        kinds: dict[tuple[int, int, int], int] = {}
        k_time: list[float] = []
        k_weight: list[int] = []
        k_cap: list[int] = []

        def kind(g: int, s: Setting, cap: int, weight: int) -> int:
            key = (g, s.sp_size, cap)
            kid = kinds.get(key)
            if kid is None:
                kid = kinds[key] = len(k_time)
                k_time.append(self._unit_time(s))
                k_weight.append(0)
                k_cap.append(cap)
            k_weight[kid] += weight
            return kid

        for g, js in members.items():
            q, r = divmod(end[g] - front[g], len(js))
            s0 = records[js[0]][2]
            if all(records[j][2] is s0 for j in js):  # common case: one setting, at most two caps
                if r:
                    kid = kind(g, s0, q + 1, r * s0.sp_size)
                    for j in js[:r]:
                        kind_of[j] = kid
                if len(js) > r:
                    kid = kind(g, s0, q, (len(js) - r) * s0.sp_size)
                    for j in js[r:]:
                        kind_of[j] = kid
                continue
            for n, j in enumerate(js):
                s = records[j][2]
                kind_of[j] = kind(g, s, q + 1 if n < r else q, s.sp_size)
        ga = solve_ga_kinds(k_time, k_weight, k_cap, gmin=cfg.gmin, gmax=cfg.gmax)

        mbq = self._mbq
        start, stop, mb_time = mbq.start, self._mb_end, self._mb_time
        new_group, tuple_new = GroupPlan, tuple.__new__
        plans: list[GroupPlan | None] = [None] * len(records)
        for g, js in members.items():
            q, ids, lens = queue[g], mbq.ids_list[g], mbq.lens_list[g]
            f = front[g]
            primary_p = self._p_of[g]
            counts = [ga[kind_of[j]] for j in js]
            total = sum(counts)
            # Micro-batches run at the primary setting are built for the whole seq_group in one pass
            # (one comprehension, not one per group), then dealt out in FIFO order.
            # tuple.__new__ skips the NamedTuple's Python-level __new__ frame (~20% of this loop at W = 4096).
            built = tuple(
                [
                    tuple_new(MicroBatch, (ids[(a := start[k]) : (e := stop[k])], lens[a:e], g, mb_time[k]))
                    for k in q[f : f + total]
                ]
            )
            o = 0
            s0 = records[js[0]][2]
            if s0.sp_size == primary_p and all(records[j][2] is s0 for j in js):
                p0, r0 = s0.sp_size, s0.recompute_layers  # common case: every group at the primary setting
                for j, n in zip(js, counts, strict=True):
                    plans[j] = new_group(records[j][0], p0, r0, built[o : o + n])
                    o += n
            else:
                for j, n in zip(js, counts, strict=True):
                    s = records[j][2]
                    if s.sp_size == primary_p:
                        mbs = built[o : o + n]
                    else:
                        mbs = tuple(self._chunked(g, s, q[f + o : f + o + n]))
                    o += n
                    plans[j] = new_group(records[j][0], s.sp_size, s.recompute_layers, mbs)
            front[g] = f + total
        for j, rec in enumerate(records):
            if rec[2] is None:
                plans[j] = new_group(rec[0], 1, 0, ())  # an idle rank
        return StepPlan(self.epoch, step, self.world_size, self.method, tuple(plans))

    def _chunked(self, g: int, s: Setting, ks: list[int]) -> list[MicroBatch]:
        """Micro-batches of a smaller-p filler group: each primary micro-batch split into chunks of its b."""
        mbq = self._mbq
        ids, lens = mbq.ids_list[g], mbq.lens_list[g]
        chunk = self._chunk(s)
        out = []
        for k in ks:
            a, e = mbq.start[k], self._mb_end[k]
            for lo in range(a, e, chunk):
                hi = min(e, lo + chunk)
                t = self._times.time_s(g, s.sp_size, s.recompute_layers, hi - lo)
                out.append(MicroBatch(ids[lo:hi], lens[lo:hi], g, t))
        return out


def plan_epoch(
    lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, epoch: int = 0,
    *, shapes: Sequence[Sequence[int]] | None = None,
) -> list[StepPlan]:
    """All StepPlans of one epoch for config.planning.method (dcp-inter, dcp-intra, bucket, packed)."""
    return list(EpochPlanner(lengths, table, config, world_size, epoch, shapes=shapes))


__all__ = ["EpochPlanner", "PlanningError", "lookahead_samples", "plan_epoch"]
