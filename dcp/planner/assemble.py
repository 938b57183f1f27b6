"""Step assembly: an epoch's shuffled stream becomes a sequence of StepPlans (DCP-inter and DCP-intra).

Every micro-batch is timed once per epoch from its real lengths (``TimeLookup`` / ``micro_batch_times``, the
one cost source), and a group's work is the sum of its micro-batches' times. Per step:

1. Window (``_scan``). From the first unconsumed micro-batch (the head), unconsumed micro-batches in release
   order, up to a GPU-work bound, never past ``lookahead_samples`` stream positions after the head.
2. Target (``_target``). T* = k x T_long (T_long: the window's longest micro-batch, which the step takes; the
   largest k <= Gmax whose window work and fill allow it), so the step stays within Gmax x its longest
   micro-batch; the window is cut to WINDOW_WORK_FACTOR x W x T* of work. At the epoch's end what is left is
   spread over the last steps.
3. Packing (``_pack``). Longest first, best fit: a micro-batch joins the open group of its p (and at least
   its recompute) with the most load that still fits T*, or opens a group on free ranks when its p's window
   work can fill one (the head and the longest always do); a second pass uses ranks still free. From 512
   ranks the packing runs in numpy (``_pack_rounds``): each kind's group count from its window time, walked
   longest first, then longest-first rounds (``_fill_rounds``). Gmin scales T* as the paper does. Then a
   small local search (``_improve``); a step that still idles is packed again with the head joining another
   group (``_join_head``) and at other targets.
4. Placement (``placement.place_largest_first``, aligned inside a node unless p exceeds one) and filling of
   free ranks with smaller-p settings of left-over window micro-batches (``_filler``); idle one-rank groups
   for what nothing fills. Micro-batches not taken stay for later steps.

Every sample is in exactly one micro-batch and every micro-batch is consumed once; each step takes the head,
so the epoch ends. The plan depends only on (lengths, table, config, world_size, epoch): numpy's seeded
Generator, stable sorts and ordered containers, never hash() or set iteration order.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import math
import operator
from collections.abc import Iterator, Sequence

import numpy as np

from dcp.config import DCPConfig
from dcp.planner.intra import Setting, best_settings, settings_by_sp
from dcp.planner.placement import place_largest_first
from dcp.planner.plan import MicroBatch, StepPlan
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


def _idle(groups: list[list], world_size: int) -> float:
    """GPU-weighted idle of packed groups ([p, r, load, items]) over the world, at their longest load."""
    t = max((gr[2] for gr in groups), default=0.0)
    if t <= 0:
        return 1.0
    return 1.0 - sum(gr[0] * gr[2] for gr in groups) / (world_size * t)


def _work(groups: list[list]) -> float:
    """GPU-seconds of work in packed groups ([p, r, load, items])."""
    return sum(gr[0] * gr[2] for gr in groups)


def _window(idx: np.ndarray, m: int, j_long: int) -> np.ndarray:
    """The first m scanned micro-batches, plus the scan's longest (position j_long) when it lies further:
    the step takes it, which bounds T* by Gmax x its time."""
    return idx[:m] if j_long < m else np.append(idx[:m], idx[j_long])


def _unclaimed(ts: list[float], ids: list[int], claimed: set[int], bound: float) -> int:
    """Index of the longest entry of ``ts`` (ascending) at most ``bound`` whose id is not claimed (-1: none);
    claimed entries met on the way are dropped."""
    j = bisect.bisect_right(ts, bound) - 1
    while j >= 0 and ids[j] in claimed:
        ts.pop(j)
        ids.pop(j)
        j -= 1
    return j


def lookahead_samples(config: DCPConfig, world_size: int) -> int:
    """The configured look-ahead, or its lower bound 32 per rank when it is 0 (EpochPlanner.lookahead_samples
    holds the value in use, which for 0 is also large enough to hold the work of a balanced step)."""
    return config.planning.lookahead_samples or DEFAULT_LOOKAHEAD_PER_RANK * world_size


LOOKAHEAD_WORK_FACTOR = 4.0
"""Default hard window bound: this many times the samples whose GPU-time fills the longest step Gmax allows
(Gmax x the longest micro-batch) on every rank; the work-sized window normally ends well before it."""
WINDOW_WORK_FACTOR = 1.5
"""A step's window holds this many times the GPU-work of the step (W x T*), so packing has choice."""
RETRY_IDLE = 0.03
"""A packed step idling more than this share (GPU-weighted) is re-packed with the longer targets below."""
RETRY_STRETCH = (0.05, 0.1, 0.15, 0.2, 0.3)
"""Relative stretches of T* tried (within Gmax x the step's longest micro-batch)."""
HEAD_ALONE = 0.8
"""The head is packed again without its own group (``_join_head``) only when that group holds less than this
share of the step's time: its kind lacks work in the window, and its ranks may serve a larger group better."""
SHORTER_GAIN = 0.05
"""A shorter target replaces T* only if it idles this much less (GPU-weighted share)."""
IMPROVE_GROUPS = 256
"""Local search visits at most this many of the emptiest groups per step."""
IMPROVE_MIN = 0.005
"""Groups idle for less than this share of the step are left as they are."""
BULK_MIN_RANKS = 512
"""From this world size a step is packed in numpy (``_pack_rounds``: group counts per kind, then longest-first
rounds); below it, one micro-batch at a time by best fit, whose Python loop is cheaper than numpy's per-call
cost for the few thousand micro-batches of a step there."""
OPEN_FILL = 0.8
"""A micro-batch opens a new SP group only if its p's unassigned window work, less what the open groups of
that p still lack, is at least this fraction of the target time (else the group would idle)."""
LONG_IDLE = 0.04
"""T* = k x T_long (k <= Gmax) only if the group of the longest micro-batch, filled with the window's work of
its kind, would leave at most this share of the step's GPU-time (W x T*) idle."""


def default_lookahead(world_size: int, longest_s: float, gpu_s_per_sample: float, n: int) -> int:
    """Hard window bound for planning.lookahead_samples = 0: ``LOOKAHEAD_WORK_FACTOR * W * longest_s / g``
    samples, with longest_s the longest step Gmax allows (Gmax x the longest primary micro-batch time) and g
    the epoch's mean GPU-seconds per sample; at least 32 per rank, at most the epoch. The work-sized window
    (``EpochPlanner._scan``) normally stops well inside it."""
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
        if self.method in ("bucket", "packed", "bucket-search"):
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
        primary = {g: (self.settings[g].sp_size, self.settings[g].recompute_layers) for g in present}
        mb_time = micro_batch_times(mbq, self._times, primary)
        self._mb_t = mb_time
        """Predicted time of every micro-batch with its seq_group's primary setting, from its real lengths
        (``TimeLookup`` / ``micro_batch_times``: the padded length today), as a numpy array."""
        self._mb_t_list = tuple(mb_time.tolist())
        # Every micro-batch's place in the epoch's longest-first order (ties: release order). A step sorts
        # its window by this unique integer key instead of a stable sort of float times (same order; at
        # 4096 ranks 3 ms instead of 18 ms for a window of 200,000).
        self._rank_desc = np.empty(len(mb_time), dtype=np.int64)
        self._rank_desc[np.argsort(-mb_time, kind="stable")] = np.arange(len(mb_time), dtype=np.int64)
        grp = np.asarray(mbq.group, dtype=np.int64)
        p_by_g = np.zeros(n_groups, dtype=np.int64)
        r_by_g = np.zeros(n_groups, dtype=np.int64)
        for g, (p, r) in primary.items():
            p_by_g[g], r_by_g[g] = p, r
        self._mb_p_np, self._mb_r_np = p_by_g[grp], r_by_g[grp]
        self._mb_p, self._mb_r = tuple(self._mb_p_np.tolist()), tuple(self._mb_r_np.tolist())
        self._mb_work = mb_time * self._mb_p_np
        """GPU-seconds of every micro-batch (time x p)."""
        # A micro-batch may join a group of its p with more recompute (same memory or less). Once per epoch:
        # every micro-batch's time in a group of recompute r, for every r a primary setting uses (its own
        # time where it runs at r already), so the per-step packing reads one table, never branches.
        self._time_at: dict[int, tuple[float, ...]] = {}
        self._time_at_np: dict[int, np.ndarray] = {}
        for r in sorted({r for _, r in primary.values()}):
            up = {g: (p, r) for g, (p, rg) in primary.items() if rg < r and any(
                p2 == p and r2 == r for p2, r2 in primary.values())}
            t_r = mb_time
            if up:
                t_r = np.where(np.isin(grp, list(up)), micro_batch_times(mbq, self._times, up), mb_time)
            self._time_at_np[r] = t_r
            self._time_at[r] = tuple(t_r.tolist())
        self._mb_end = tuple((np.asarray(mbq.start, dtype=np.int64) + count).tolist())
        # the epoch's samples as flat arrays (seq_group after seq_group), and where each micro-batch's run
        # of them starts: a step's sample arrays are gathered in numpy (``_build``)
        present_ids = sorted(mbq.sample_ids)
        base = np.zeros(n_groups, dtype=np.int64)
        base[present_ids] = np.cumsum([0] + [len(mbq.sample_ids[g]) for g in present_ids])[:-1]
        empty = [np.zeros(0, dtype=np.int64)]  # an empty epoch
        self._flat_ids = np.concatenate(empty + [mbq.sample_ids[g] for g in present_ids]).astype(np.int64)
        self._flat_lens = np.concatenate(empty + [mbq.seq_lens[g] for g in present_ids]).astype(np.int64)
        self._mb_flat_np = base[grp] + np.asarray(mbq.start, dtype=np.int64)
        self._mb_count_np = count
        self._mb_group_np = grp
        self._ready = tuple(mbq.ready.tolist())
        self._scan_hint = 256
        self._mark = np.zeros(len(mb_time), dtype=bool)
        """Scratch mask over the epoch's micro-batches (``_improve``), all False between uses."""
        self._head_k, self._head_t = -1, None
        """The step's head and, when it joined a group of another p or r (``_join_head``), (group, its time)."""
        if cfg.lookahead_samples:
            self.lookahead_samples = cfg.lookahead_samples
        else:
            counts = np.bincount(self.groups, minlength=n_groups)
            per_sample = sum(
                counts[g] * self._unit_primary[g] * self._p_of[g] / self.settings[g].micro_batch_size
                for g in present
            ) / max(1, self.num_samples)
            self.lookahead_samples = default_lookahead(
                self.world_size, cfg.gmax * max(self._unit_primary), per_sample, self.num_samples
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
        n = self._mbq.num
        consumed = self._consumed = bytearray(n)
        head, step = 0, 0
        while True:
            while head < n and consumed[head]:
                head += 1
            if head >= n:
                return
            yield self._plan_step(step, head)
            step += 1

    # ----- 1. window -------------------------------------------------------------------------------
    def _scan(self, head: int, need) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unconsumed micro-batches from ``head`` in release order, within the hard window bound, until their
        GPU-work (time x p) reaches ``need(cummax of times)`` or the bound ends: (indices, cumulative
        GPU-work, running longest time)."""
        if self._ready[head] + self.lookahead_samples >= self.num_samples:
            end = self._mbq.num  # the stream is exhausted: every remaining micro-batch (partial ones too)
        else:
            end = bisect.bisect_left(self._ready, self._ready[head] + self.lookahead_samples, lo=head)
        cons = np.frombuffer(self._consumed, dtype=np.uint8)
        parts: list[np.ndarray] = []
        lo, chunk, done_w, done_t = head, max(256, self._scan_hint), 0.0, 0.0
        while lo < end:
            hi = min(end, lo + chunk)
            part = lo + np.flatnonzero(cons[lo:hi] == 0)
            parts.append(part)
            lo, chunk = hi, chunk * 2
            if part.size:
                done_w += float(self._mb_work[part].sum())
                done_t = max(done_t, float(self._mb_t[part].max()))
                if done_w >= need(done_t):
                    break
        idx = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self._scan_all = lo >= self._mbq.num
        return idx, np.cumsum(self._mb_work[idx]), np.maximum.accumulate(self._mb_t[idx])

    def _target(self, idx: np.ndarray, cumw: np.ndarray, cummax: np.ndarray) -> tuple[float, int, int]:
        """Step target time T* and the window length (micro-batches of ``idx``) to pack from.

        T* = k x T_long with T_long the longest micro-batch of the scanned window (failing that, of its first
        part holding F x W x its own longest time) and the largest k <= Gmax for which the window has the work
        (F x W x T*) and the longest micro-batch's group can be filled with work of its kind (``LONG_IDLE``).
        The window always reaches the longest micro-batch, which the packing must take: the step then holds
        a micro-batch of at least T* / Gmax (the paper's Gmax bound). At the end of the epoch what is left is
        spread evenly over the last steps.
        """
        W, gmax = self.world_size, self.config.planning.gmax
        f = WINDOW_WORK_FACTOR * W
        n = len(idx)
        j1 = min(int(np.searchsorted(cumw >= f * cummax, True)), n - 1)
        t_all = self._mb_t[idx]
        best = None
        for j_long in dict.fromkeys((int(np.argmax(t_all)), int(np.argmax(t_all[: j1 + 1])))):
            t_long = float(t_all[j_long])
            kl = int(idx[j_long])
            p_l, r_l = self._mb_p[kl], self._mb_r[kl]
            compat = (self._mb_p_np[idx] == p_l) & (self._mb_r_np[idx] <= r_l)
            pool = np.cumsum(np.where(compat, t_all, 0.0))
            for k in range(gmax, 0, -1):
                tk = k * t_long
                if k > 1 and cumw[-1] < W * tk:
                    continue  # not enough work left in the window to fill a step this long
                j = max(j_long, min(int(np.searchsorted(cumw, f * tk)), n - 1))  # the window reaches the longest
                # GPU-time the longest micro-batch's group would lack, as a share of the step's capacity
                if k == 1 or p_l * max(0.0, tk - pool[j]) <= LONG_IDLE * W * tk:
                    best = (tk, j + 1, t_long, j_long)
                    break
            if best is not None and (cumw[-1] >= W * best[0] or self._scan_all):
                break
        t_star, m, t_long, j_long = best
        if self._scan_all and cumw[-1] <= 2 * W * t_star:
            # End of the epoch: spread what is left evenly over the last steps rather than leave a stub.
            steps = math.ceil(cumw[-1] / (W * t_star))
            t_star, m = max(t_long, min(t_star, 1.02 * cumw[-1] / (W * steps))), n
        return t_star, m, j_long

    # ----- 2. packing --------------------------------------------------------------------------------
    def _plan_step(self, step: int, head: int) -> StepPlan:
        cfg = self.config.planning
        W, gmax = self.world_size, cfg.gmax
        f = WINDOW_WORK_FACTOR * W
        idx, cumw, cummax = self._scan(head, lambda t: f * gmax * t)
        t_star, m, j_long = self._target(idx, cumw, cummax)
        win = _window(idx, m, j_long)
        groups = self._pack(win, t_star, head)
        if not any(head in gr[3] for gr in groups):
            # The longest micro-batch left no ranks for the head (a tiny world): the head goes first, and the
            # step is capped by Gmax x the head's time.
            t_star = min(t_star, gmax * self._mb_t_list[head])
            groups = self._pack(win, t_star, head, head_first=True)
        most = max(len(gr[3]) for gr in groups)
        if most < cfg.gmin:
            # The paper's Gmin: every group runs fewer than gmin micro-batches; scale the step (Gmin wins over Gmax).
            t_star *= math.ceil(cfg.gmin / most)
            # the rescan extends the first one (same head, same release order), so j_long still indexes it
            idx, cumw, _ = self._scan(head, lambda t: f * t_star)
            win = _window(idx, min(int(np.searchsorted(cumw, f * t_star)), len(idx) - 1) + 1, j_long)
            groups = self._pack(win, t_star, head)
        self._improve(win, groups, head)
        idle = _idle(groups, W)
        self._head_k, self._head_t = head, None
        hg = next((gr for gr in groups if head in gr[3]), None)
        if (idle > RETRY_IDLE and len(win) > 1 and hg is not None
                and hg[2] < HEAD_ALONE * max(gr[2] for gr in groups)):
            # The head's own group can take the ranks a second group of the longest kind needed while its kind
            # has too little work in the window to fill it (t1d-long: a p = 8 head beside one p = 16 group
            # left the other 16 ranks a third busy). Pack without it, then let it join the fullest group of
            # a p its seq_group can run at (same memory rule, timed there); keep the less idle packing.
            alt = self._pack(win, t_star, head, defer_head=True)
            head_t = self._join_head(alt, head, t_star)
            if head_t is not None:
                self._improve(win, alt, head)
                alt_idle = _idle(alt, W)
                # and no less work: a step that idles less only by being shorter pays the sync more often
                if (alt_idle < idle - 1e-9 and _work(alt) >= _work(groups) * (1 - 1e-9)
                        and max(len(gr[3]) for gr in alt) >= cfg.gmin):
                    groups, idle, self._head_t = alt, alt_idle, head_t
        if idle > RETRY_IDLE and cfg.gmin == 1:
            # Discrete micro-batch times can leave every group of a common kind short of T* (five 6.7 s
            # micro-batches in a 38.7 s step), the longest one's kind be too rare for k > 1, or the window hold
            # too little short work for the ranks beside the longest kind's group (t1d-long: p = 4, 2, 1 groups
            # a third busy): pack the other multiples k x T_long and slightly longer targets too, keep the least
            # idle (ties: the first). Once limited to windows of coarse micro-batches (median > T*/10): with
            # real-length prices and the calibrated H200 model, doing it for all takes t1d-long DCP-intra from
            # 5.0% to 2.8% idle at 32 GPUs.
            t_long = float(self._mb_t[win].max())
            tries = [k * t_long for k in range(1, gmax + 1)] + [t_star * (1 + x) for x in RETRY_STRETCH]
            for t_try in tries:
                if abs(t_try - t_star) <= 1e-9 * t_star:
                    continue
                m_try = max(m, min(int(np.searchsorted(cumw, f * t_try)), len(idx) - 1) + 1)
                w_try = _window(idx, m_try, j_long)
                longest = float(self._mb_t[w_try].max())
                if not longest <= t_try * (1 + 1e-9) <= gmax * longest * (1 + 1e-9):
                    continue
                alt = self._pack(w_try, t_try, head)
                if not any(head in gr[3] for gr in alt):
                    continue
                self._improve(w_try, alt, head)
                alt_idle = _idle(alt, W)
                # a shorter step must idle clearly less: it also pays the optimizer step more often
                if alt_idle < idle - (SHORTER_GAIN if t_try < t_star else 1e-9):
                    groups, idle, win, self._head_t = alt, alt_idle, w_try, None
        self._scan_hint = len(win)
        return self._place_and_build(step, head, win, groups, t_star)

    def _improve(self, win: np.ndarray, groups: list[list], head: int) -> None:
        """Local search: in the emptiest groups (at most IMPROVE_GROUPS), swap a micro-batch for a longer one
        left in the window (same p, recompute at most the group's) while the group stays within the step's
        time (its longest group, not T*), and add left-over micro-batches that fit. The head stays. From
        BULK_MIN_RANKS ranks only the adding: the rounds leave groups of many short micro-batches, whose swaps
        cost a Python step each for little (t2d-balanced at 512 GPUs: 0.990 -> 0.980 of the ideal bound
        without any local search)."""
        if len(groups) < 2 or _idle(groups, self.world_size) < IMPROVE_MIN:
            return
        step_t = max(gr[2] for gr in groups) * (1 + 1e-9)
        slack = [(step_t - gr[2], i) for i, gr in enumerate(groups) if step_t - gr[2] > IMPROVE_MIN * step_t]
        if not slack:
            return
        slack.sort(reverse=True)
        taken = np.fromiter(itertools.chain.from_iterable(gr[3] for gr in groups), dtype=np.int64,
                            count=sum(len(gr[3]) for gr in groups))
        mark = self._mark  # all False between calls
        mark[taken] = True
        rest = win[~mark[win]]
        mark[taken] = False
        if not rest.size:
            return
        swaps = self.world_size < BULK_MIN_RANKS
        at = self._time_at
        spare: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
        """Per (p, group r): left-over micro-batches that may join, (times at that r ascending, ids)."""
        p_rest, r_rest = self._mb_p_np[rest], self._mb_r_np[rest]
        claimed: set[int] = set()
        """Left-over micro-batches given to a group here: kinds of one p with different r share left-overs."""
        for _, i in slack[:IMPROVE_GROUPS]:
            p, r, _, ks = groups[i]
            key = (p, r)
            if key not in spare:
                ok = (p_rest == p) & (r_rest <= r)
                sel = rest[ok]
                ts_np = self._time_at_np[r][sel]
                o = np.argsort(ts_np, kind="stable")
                spare[key] = (ts_np[o].tolist(), sel[o].tolist())
            ts, ids = spare[key]
            if not ts:
                continue
            gr = groups[i]
            for n in range(0 if swaps else len(ks), len(ks) + 1):
                room = step_t - gr[2]
                if n == len(ks):  # add what still fits
                    j = _unclaimed(ts, ids, claimed, room)
                    if j >= 0:
                        gr[2] += ts.pop(j)
                        k_new = ids.pop(j)
                        claimed.add(k_new)
                        ks.append(k_new)
                    break
                k = ks[n]
                if k == head:
                    continue
                t_k = at[r][k]
                j = _unclaimed(ts, ids, claimed, t_k + room)
                if j >= 0 and ts[j] > t_k:
                    t_new, k_new = ts.pop(j), ids.pop(j)
                    claimed.add(k_new)
                    claimed.discard(k)
                    at_j = bisect.bisect_right(ts, t_k)
                    ts.insert(at_j, t_k)
                    ids.insert(at_j, k)
                    ks[n] = k_new
                    gr[2] += t_new - t_k

    def _join_head(self, groups: list[list], head: int, t_star: float) -> tuple[int, float] | None:
        """Put the head (left out of ``groups``) into the fullest group it fits within t_star: a group of its
        primary p whose r is at least its own, or of a larger p where its seq_group has a setting whose b holds
        it and whose r is at most the group's (the same memory rule as for smaller-p fillers). Returns (the
        group's index, the head's time there), or None when no group has room."""
        mbq = self._mbq
        g, p_h, r_h = mbq.group[head], self._mb_p[head], self._mb_r[head]
        lens = mbq.lens_list[g][mbq.start[head] : self._mb_end[head]]
        limit = t_star * (1 + 1e-9)
        best, best_load = None, -1.0
        memo: dict[tuple[int, int], float] = {}
        for i, (p, r, load, _) in enumerate(groups):
            if p < p_h or load <= best_load:
                continue
            if p == p_h:
                if r < r_h:
                    continue
            else:
                s = self._by_sp[g].get(p)
                if s is None or s.micro_batch_size < len(lens) or s.recompute_layers > r:
                    continue
            t = memo.get((p, r))
            if t is None:
                t = memo[(p, r)] = self._times.lengths_time_s(g, p, r, lens) if p != p_h else (
                    self._time_at[r][head])
            if load + t <= limit:
                best, best_load = (i, t), load
        if best is None:
            return None
        i, t = best
        groups[i][2] += t
        groups[i][3].append(head)
        return best

    def _pack(self, win: np.ndarray, t_star: float, head: int, head_first: bool = False,
              defer_head: bool = False) -> list[list]:
        """Longest-first best-fit of the window's micro-batches into SP groups of at most t_star each.

        A group is [p, r, load, items]; a micro-batch joins a group of its primary p whose r is at least its
        own (more recompute fits the same memory), timed at the group's r. It opens a new group when none has
        room, ranks are free and its p's unassigned window work can fill one more group (the head, and the
        window's longest micro-batch, always open one). A second pass opens groups for what is left while
        ranks are free. Returns the groups in opening order. From BULK_MIN_RANKS ranks: ``_pack_rounds``.
        """
        W = self.world_size
        order_np = win[np.argsort(self._rank_desc[win])]  # longest first, ties in release order
        if W >= BULK_MIN_RANKS:
            return self._pack_rounds(order_np, t_star, head, head_first, defer_head)
        t_of, p_of, r_of, at = self._mb_t_list, self._mb_p, self._mb_r, self._time_at
        order = order_np.tolist()
        if defer_head:  # the head is placed afterwards (``_join_head``)
            order.remove(head)
        elif order[0] != head:  # the head opens a group right after the longest (or first), before ranks run out
            order.remove(head)
            order.insert(0 if head_first else 1, head)
        limit = t_star * (1 + 1e-9)
        pw = np.bincount(self._mb_p_np[win], weights=self._mb_t[win])
        pool: dict[int, float] = {int(q): float(pw[q]) for q in np.flatnonzero(pw)}
        """Per p: window time (at the primary setting) not yet in a group."""
        if defer_head:
            pool[p_of[head]] -= t_of[head]
        deficit = dict.fromkeys(pool, 0.0)
        """Per p: time the open groups of that p still lack to reach t_star."""
        open_need = OPEN_FILL * t_star
        groups: list[list] = []
        kinds: dict[int, list[tuple[int, list[float], list[int]]]] = {}
        """Per p: (r, group loads ascending, group ids in the same order), by ascending r."""
        free = W
        forced = {order[0]} if defer_head else {head} if head_first else {head, order[0]}
        left: list[int] = []
        bisect_right, insert_at = bisect.bisect_right, list.insert
        for second in (False, True):
            todo, left = (left, []) if second else (order, [])
            for k in todo:
                p, r, t = p_of[k], r_of[k], t_of[k]
                best_load, best = -1.0, None
                can_open = p <= free and t <= limit and (
                    second or k in forced or pool[p] - deficit[p] >= open_need)
                for r2, loads, gids in kinds.get(p, ()):
                    if r2 < r:
                        continue
                    t2 = t if r2 == r else at[r2][k]
                    i = bisect_right(loads, limit - t2) - 1
                    if i >= 0 and loads[i] > best_load:
                        best_load, best = loads[i], (loads, gids, i, t2)
                if best is not None:
                    loads, gids, i, t2 = best
                    gid = gids.pop(i)
                    load = loads.pop(i) + t2
                    gr = groups[gid]
                    gr[2] = load
                    gr[3].append(k)
                    j = bisect_right(loads, load)
                    insert_at(loads, j, load)
                    insert_at(gids, j, gid)
                    deficit[p] -= t2
                    pool[p] -= t
                elif can_open:
                    gid = len(groups)
                    groups.append([p, r, t, [k]])
                    ks = kinds.setdefault(p, [])
                    entry = next((e for e in ks if e[0] == r), None)
                    if entry is None:
                        entry = (r, [], [])
                        ks.append(entry)
                        ks.sort(key=_FIRST)
                    j = bisect_right(entry[1], t)
                    insert_at(entry[1], j, t)
                    insert_at(entry[2], j, gid)
                    free -= p
                    deficit[p] += t_star - t
                    pool[p] -= t
                else:
                    left.append(k)
            if not free or not left:
                break
        return groups

    def _pack_rounds(self, order: np.ndarray, t_star: float, head: int, head_first: bool,
                     defer_head: bool) -> list[list]:
        """``_pack`` for large worlds with many micro-batches per rank, in numpy: count the groups, then fill
        them in longest-first rounds.

        The one-by-one best fit would place nearly every micro-batch of such a step in a Python loop (20,000-
        80,000 at 4096 ranks, ~90 ms). Here, walking the window longest first (the head right after the
        longest, or first), a kind (p, r) asks for its j-th group where its running time passes (j - 1) x
        t_star; groups are granted in that order while ranks are free and the kind's window time can fill
        OPEN_FILL of one more (the longest's and the head's first groups always), then, on ranks still free,
        the others. The window's longest and then the head go into their kinds' first groups
        (``_place_first``); ``_fill_rounds`` fills the rest. Same result shape as ``_pack``.
        """
        W = self.world_size
        limit = t_star * (1 + 1e-9)
        rest = order[order != head]
        if defer_head:  # the head is placed afterwards (``_join_head``): it asks for no group here
            order, forced = rest, {0}
        else:  # the head right after the longest (or first): it always gets a group
            at = 0 if head_first or not len(rest) else 1
            order = np.concatenate([rest[:at], [head], rest[at:]])
            forced = {at} if head_first else {0, at}  # window positions whose group always opens
        if not len(order):
            return []
        p_o, r_o = self._mb_p_np[order], self._mb_r_np[order]
        n_r = int(r_o.max()) + 1
        kind = p_o * n_r + r_o
        t_o = self._mb_t[order]
        events: list[tuple[int, int, int, bool]] = []
        """(window position where the kind asks for the group, p, r, whether it may open in the first pass)"""
        for kd in np.unique(kind).tolist():
            sel = np.flatnonzero(kind == kd)
            p, r = divmod(kd, n_r)
            cw = np.cumsum(t_o[sel])
            total = float(cw[-1])
            n_full = min(W // p, int(total / t_star + (1 - OPEN_FILL)))  # the last one filled >= OPEN_FILL
            n_all = min(W // p, math.ceil(total / t_star - 1e-9))
            asks = sel[np.minimum(np.searchsorted(cw, np.arange(n_all) * t_star, "right"), len(sel) - 1)]
            events.extend((x, p, r, j < n_full) for j, x in enumerate(asks.tolist()))
        events.sort()
        free, granted, short = W, [], []
        for x, p, r, full in events:
            if p > free:
                continue
            if full or x in forced:
                granted.append((p, r))
                free -= p
                if not free:
                    break
            else:
                short.append((p, r))
        for p, r in short:  # ranks still free: the groups the window cannot fill, too
            if p <= free:
                granted.append((p, r))
                free -= p
        groups: list[list] = []
        kinds: dict[int, list[tuple[int, list, list[int]]]] = {}
        index: dict[tuple[int, int], list[int]] = {}
        for p, r in granted:
            gids = index.get((p, r))
            if gids is None:
                gids = index[(p, r)] = []
                kinds.setdefault(p, []).append((r, [], gids))
            gids.append(len(groups))
            groups.append([p, r, 0.0, []])
        # Before the rounds: the window's longest (T* was sized on it) and the head, each into the first group
        # of its own kind with room, else of its p with more recompute; the head first with head_first.
        longest = int(rest[0]) if len(rest) else -1
        first = [head, longest] if head_first else [longest, head]
        for k in first:
            if k < 0 or (k == head and defer_head):
                continue
            if not self._place_first(groups, index, k, limit) and k == head:
                return [gr for gr in groups if gr[3]]  # no group for the head: the caller retries head first
        self._fill_rounds(groups, kinds, rest[rest != longest] if longest >= 0 else rest, limit)
        return [gr for gr in groups if gr[3]]

    def _place_first(self, groups: list[list], index: dict[tuple[int, int], list[int]], k: int,
                     limit: float) -> bool:
        """Put micro-batch k into the first group (in grant order) of its own (p, r) with room for it, else
        of its p with more recompute (timed there); False when none has room."""
        p_k, r_k = self._mb_p[k], self._mb_r[k]
        for key in sorted((key for key in index if key[0] == p_k and key[1] >= r_k), key=lambda q: q[1]):
            for g in index[key]:
                t = self._time_at[key[1]][k]
                if groups[g][2] + t <= limit:
                    groups[g][2] += t
                    groups[g][3].append(k)
                    return True
        return False

    def _fill_rounds(self, groups: list[list], kinds: dict, items: list[int], limit: float) -> None:
        """Longest-first filling of the groups (``_pack_rounds``) in vectorised rounds.

        Per (p, r) kind: the window's remaining micro-batches of exactly that kind, longest first, in rounds
        of one per group: the i-th longest of the round goes to the group with the i-th most room if it fits
        (LPT's choice, made for a whole round at once). Then, in the same way, what is left of the same p
        with less recompute (timed at the group's r, which fits the same memory): a kind's own work first,
        so a group of more recompute never takes the work its own kind's groups were granted for. What does
        not fit stays for later steps.
        """
        arr = np.asarray(items, dtype=np.int64)
        p_arr, r_arr = self._mb_p_np[arr], self._mb_r_np[arr]
        free_item = np.ones(len(arr), dtype=bool)
        passes = [(exact, p, r, gids) for exact in (True, False) for p, entries in kinds.items()
                  for r, _, gids in sorted(entries, key=_FIRST, reverse=True)]
        for exact, p, r, gids in passes:
            sel = np.flatnonzero(free_item & (p_arr == p) & ((r_arr == r) if exact else (r_arr < r)))
            if not sel.size or not gids:
                continue
            ks = arr[sel]
            tt = self._time_at_np[r][ks]
            srt = np.argsort(-tt, kind="stable")
            sel, ks, tt = sel[srt], ks[srt], tt[srt]
            g_arr = np.asarray(gids, dtype=np.int64)
            loads = np.asarray([groups[g][2] for g in gids])
            n, G, pos = len(ks), len(gids), 0
            dest = np.full(n, -1, dtype=np.int64)
            while pos < n:
                m = min(G, n - pos)
                tgt = np.argsort(loads, kind="stable")[:m]
                t_round = tt[pos : pos + m]
                ok = loads[tgt] + t_round <= limit
                if ok.any():
                    loads[tgt[ok]] += t_round[ok]
                    dest[pos : pos + m][ok] = tgt[ok]
                pos += m
                if limit - loads.min() < tt[-1]:
                    break  # no group has room for even the shortest left
            got = np.flatnonzero(dest >= 0)
            if not got.size:
                continue
            free_item[sel[got]] = False
            by = got[np.argsort(dest[got], kind="stable")]
            d = dest[by]
            cuts = (np.flatnonzero(np.diff(d)) + 1).tolist()
            flat = ks[by].tolist()
            for a, e, g in zip([0, *cuts], [*cuts, len(flat)], g_arr[d[[0, *cuts]]].tolist(), strict=True):
                groups[g][3].extend(flat[a:e])
            for g, load in zip(gids, loads.tolist(), strict=True):
                groups[g][2] = load

    # ----- 3. placement, 4. filling, build ----------------------------------------------------------
    def _place_and_build(self, step: int, head: int, win: np.ndarray, groups: list[list], t_star: float) -> StepPlan:
        W, rpn = self.world_size, self.config.planning.ranks_per_node
        has_head = [head in gr[3] for gr in groups]
        order = sorted(range(len(groups)), key=lambda i: (-groups[i][0], not has_head[i], i))
        starts, free = place_largest_first([groups[i][0] for i in order], W, rpn)
        hi = order.index(has_head.index(True))
        if starts[hi] is None:  # alignment left no slot for the head's group: drop the larger groups
            p_h = groups[order[hi]][0]
            order = [i for i in order if groups[i][0] <= p_h]
            order.sort(key=lambda i: (-groups[i][0], not has_head[i], i))
            starts, free = place_largest_first([groups[i][0] for i in order], W, rpn)
        placed = [(st, groups[i]) for i, st in zip(order, starts, strict=True) if st is not None]
        if len(placed) < len(groups):
            t_star = self._cap_to_gmax(placed, head, t_star)
        fillers: list[tuple[int, Setting, list[int]]] = []
        idle: list[int] = []
        if not free:
            return self._build(step, placed, fillers, idle)
        # 4. fill free segments with window micro-batches not yet taken, at a smaller p if needed
        taken = {k for _, gr in placed for k in gr[3]}
        rest: dict[int, list[int]] = {}
        grp = self._mbq.group
        for k in win.tolist():
            if k not in taken:
                rest.setdefault(grp[k], []).append(k)
        for lst in rest.values():
            lst.reverse()  # pop() from the end yields release order
        # A filler runs on ranks that would idle: up to the step's time (its longest placed group), never
        # past it. T* is only the target; bounded by it, a filler group once made a t1d-long step at 32 x H200
        # last 38.5 s beside groups of 10.5 s (69% idle).
        fill_to = min(t_star, max((gr[2] for _, gr in placed), default=t_star))
        for a, e in free:
            while a < e:
                pick = self._filler(a % rpn, e - a, rest, fill_to)
                if pick is None:
                    idle.append(a)
                    a += 1
                    continue
                s, ks = pick
                fillers.append((a, s, ks))
                a += s.sp_size
        return self._build(step, placed, fillers, idle)

    def _cap_to_gmax(self, placed: list, head: int, t_star: float) -> float:
        """The groups dropped for want of aligned ranks may have held the step's longest micro-batch, which
        T* was sized on: keep the paper's Gmax bound for what is left (step time <= Gmax x the longest
        micro-batch it runs) by returning the shortest micro-batches of over-long groups to the stream.
        Returns the step's new target (the fillers' bound too)."""
        longest = max(self._time_at[gr[1]][k] for _, gr in placed for k in gr[3])
        cap = min(t_star, self.config.planning.gmax * longest)
        limit = cap * (1 + 1e-9)
        for _, gr in placed:
            at_r = self._time_at[gr[1]]
            ks = gr[3]
            # the shortest first, never the head
            for k in sorted((k for k in ks if k != head), key=lambda k: at_r[k]):
                if gr[2] <= limit:
                    break
                ks.remove(k)
                gr[2] -= at_r[k]
        return cap

    def _filler(self, local: int, room: int, rest: dict[int, list[int]], t_star: float):
        """A smaller-p group for a free aligned slot: the earliest left-over window micro-batch with a setting
        whose p fits, then more of its seq_group while the group stays within t_star. None: nothing fits."""
        best_k, best = None, None
        limit = t_star * (1 + 1e-9)
        for g, lst in rest.items():
            if not lst or (best_k is not None and lst[-1] >= best_k):
                continue
            fits = [s for s in self._options[g] if s.sp_size <= room and local % s.sp_size == 0
                    and self._unit_time(s) <= limit]
            if fits:
                best_k, best = lst[-1], max(fits, key=lambda s: (s.tokens_per_gpu_s, s.sp_size))
        if best is None:
            return None
        lst = rest[best.seq_group]
        unit = self._unit_time(best)
        ks = [lst.pop()]
        load = unit
        while lst and load + unit <= limit:
            ks.append(lst.pop())
            load += unit
        return best, ks

    def _build(self, step: int, placed: list, fillers: list, idle: list[int]) -> StepPlan:
        """The StepPlan's arrays: placed groups in numpy (their micro-batches in release order), then the
        smaller-p fillers (a few, chunked one by one) and the idle one-rank groups."""
        counts = [len(gr[3]) for _, gr in placed]
        kk = np.fromiter(itertools.chain.from_iterable(gr[3] for _, gr in placed), dtype=np.int64,
                         count=sum(counts))
        r_of = np.asarray([gr[1] for _, gr in placed], dtype=np.int64)
        gidx = np.repeat(np.arange(len(placed)), counts)
        kk = kk[np.lexsort((kk, gidx))]  # release order inside each group
        r_mb = r_of[gidx]
        times = np.empty(len(kk))
        for r in np.unique(r_of).tolist():
            sel = r_mb == r
            times[sel] = self._time_at_np[r][kk[sel]]
        if self._head_t is not None:  # the head joined a group of another p or r (``_join_head``): its time there
            times[kk == self._head_k] = self._head_t[1]
        np.frombuffer(self._consumed, dtype=np.uint8)[kk] = 1
        size = self._mb_count_np[kk]
        # the samples of every micro-batch: consecutive runs of the epoch's flat sample arrays
        offset = np.cumsum(size) - size
        pos = np.repeat(self._mb_flat_np[kk] - offset, size) + np.arange(int(size.sum()))
        first = [st for st, _ in placed]
        p_all = [gr[0] for _, gr in placed]
        r_all = r_of.tolist()
        mb_t, mb_g, mb_n = [times], [self._mb_group_np[kk]], [size]
        ids, lens = [self._flat_ids[pos]], [self._flat_lens[pos]]
        for st, s, ks in fillers:
            ks.sort()
            for k in ks:
                self._consumed[k] = 1
            mbs = self._chunked(s.seq_group, s, ks)
            first.append(st)
            p_all.append(s.sp_size)
            r_all.append(s.recompute_layers)
            counts.append(len(mbs))
            mb_t.append(np.asarray([mb.time_s for mb in mbs]))
            mb_g.append(np.asarray([mb.seq_group for mb in mbs], dtype=np.int64))
            mb_n.append(np.asarray([len(mb.sample_ids) for mb in mbs], dtype=np.int64))
            ids.append(np.asarray([i for mb in mbs for i in mb.sample_ids], dtype=np.int64))
            lens.append(np.asarray([n for mb in mbs for n in mb.seq_lens], dtype=np.int64))
        first.extend(idle)
        p_all.extend([1] * len(idle))
        r_all.extend([0] * len(idle))
        counts.extend([0] * len(idle))
        return StepPlan.from_arrays(
            self.epoch, step, self.world_size, self.method, first_rank=first, sp_size=p_all,
            recompute_layers=r_all, ga_steps=counts, mb_time_s=np.concatenate(mb_t),
            mb_seq_group=np.concatenate(mb_g), mb_size=np.concatenate(mb_n), sample_ids=np.concatenate(ids),
            seq_lens=np.concatenate(lens),
        )

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
