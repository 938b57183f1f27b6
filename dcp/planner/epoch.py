"""The DCP assembler's per-epoch tables: settings, micro-batches and their times, computed once per epoch.

``prepare_epoch`` turns an ``EpochInput`` into an ``EpochArrays`` (frozen): every micro-batch of the epoch
(``MicroBatchQueues`` over the shuffled stream, with its seq_group's primary setting), its predicted time from
its real lengths (``TimeLookup`` / ``micro_batch_times``, the one cost source), its time at every recompute depth
a primary setting of its p uses, its place in the epoch's longest-first order, and the flat sample arrays the
step plans are gathered from. The per-step modules (window, packing, rounds, improve, build) only read it;
what changes during the epoch (which micro-batches are consumed) is ``EpochProgress``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dcp.config import DCPConfig
from dcp.planner.intra import Setting, batch_settings, best_settings, candidate_settings, settings_by_sp
from dcp.planner.source import EpochInput
from dcp.planner.stream import MicroBatchQueues, TimeLookup, micro_batch_times, no_setting_error
from dcp.planner.tokens import token_pack_settings
from dcp.planner.tuning import DEFAULT_LOOKAHEAD_PER_RANK, LOOKAHEAD_WORK_FACTOR


def lookahead_samples(config: DCPConfig, world_size: int) -> int:
    """The configured look-ahead, or its lower bound 32 per rank when it is 0 (EpochPlanner.lookahead_samples
    holds the value in use, which for 0 is also large enough to hold the work of a balanced step)."""
    return config.advanced.lookahead_samples or DEFAULT_LOOKAHEAD_PER_RANK * world_size


def default_lookahead(world_size: int, longest_s: float, gpu_s_per_sample: float, n: int) -> int:
    """Hard window bound for advanced.lookahead_samples = 0: ``LOOKAHEAD_WORK_FACTOR * W * longest_s / g``
    samples, with longest_s the longest step Gmax allows (Gmax x the longest primary micro-batch time) and g
    the epoch's mean GPU-seconds per sample; at least 32 per rank, at most the epoch. The work-sized window
    (``dcp.planner.window.scan``) normally stops well inside it."""
    need = LOOKAHEAD_WORK_FACTOR * world_size * longest_s / gpu_s_per_sample if gpu_s_per_sample > 0 else n
    return int(min(max(DEFAULT_LOOKAHEAD_PER_RANK * world_size, math.ceil(need)), max(n, 1)))


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochArrays:
    """Everything the DCP steps of one epoch read. Micro-batch k is the k-th of ``mbq`` (release order)."""

    world_size: int
    """W."""
    ranks_per_node: int
    """planning.ranks_per_node."""
    gmin: int
    """planning.gmin."""
    gmax: int
    """planning.gmax."""
    epoch: int
    """Epoch index (goes into the StepPlans)."""
    method: str
    """dcp-inter or dcp-intra."""
    num_samples: int
    """Samples in the epoch."""
    lookahead_samples: int
    """Hard window bound in stream positions (configured, or ``default_lookahead``)."""
    settings: dict[int, Setting]
    """Primary setting per present seq_group."""
    by_sp: dict[int, dict[int, Setting]]
    """Per present seq_group, per feasible p: the best setting at that p."""
    options: dict[int, list[Setting]]
    """Per present seq_group: the settings of ``by_sp`` in ascending p (fillers choose among them)."""
    unit_time: dict[tuple[int, int], float]
    """(seq_group, p) -> time of one full primary micro-batch run with that setting (the primary's at its p)."""
    times: TimeLookup
    """The cost source."""
    mbq: MicroBatchQueues
    """The epoch's micro-batches."""
    mb_t: np.ndarray
    """Predicted time of every micro-batch at its seq_group's primary setting, from its real lengths."""
    mb_t_list: tuple[float, ...]
    """``mb_t`` as Python floats (the best-fit loop reads them one by one)."""
    rank_desc: np.ndarray
    """Every micro-batch's place in the epoch's longest-first order (ties: release order): a step sorts its
    window by this unique integer key instead of a stable sort of float times (same order; at 4096 ranks 3 ms
    instead of 18 ms for a window of 200,000)."""
    by_rank: np.ndarray
    """The micro-batch at every place of that order (``rank_desc``'s inverse): a window longest first is
    ``by_rank[np.sort(rank_desc[win])]``, one sort of integers and no index sort."""
    mb_p_np: np.ndarray
    """Primary p of every micro-batch."""
    mb_r_np: np.ndarray
    """Primary r of every micro-batch."""
    mb_p: tuple[int, ...]
    """``mb_p_np`` as Python ints."""
    mb_r: tuple[int, ...]
    """``mb_r_np`` as Python ints."""
    mb_work: np.ndarray
    """GPU-seconds of every micro-batch (time x p)."""
    time_at_np: dict[int, np.ndarray]
    """Per recompute depth r some primary setting uses: every micro-batch's time in a group of its p at r. A
    micro-batch runs its own r in any group (``StepPlan.mb_recompute_layers``): its own time at every r; kept
    per r so that the packing's look-ups stay one table read."""
    time_at: dict[int, tuple[float, ...]]
    """``time_at_np`` as Python floats."""
    mb_end: tuple[int, ...]
    """End (exclusive) of every micro-batch's run in its seq_group's queue."""
    flat_ids: np.ndarray
    """The epoch's sample ids, seq_group after seq_group, each in queue order."""
    flat_lens: np.ndarray
    """Their lengths."""
    mb_flat: np.ndarray
    """Where every micro-batch's samples start in ``flat_ids``."""
    mb_count: np.ndarray
    """Samples of every micro-batch."""
    mb_group: np.ndarray
    """seq_group of every micro-batch."""
    ready: tuple[int, ...]
    """Stream position at which every micro-batch is complete (ascending)."""

    @property
    def num_micro_batches(self) -> int:
        return self.mbq.num

    def own_r(self, k: int, p: int) -> int:
        """r micro-batch k runs at in a group of p ranks: its primary r at its own p, else its seq_group's
        setting's at p (a micro-batch runs its own minimal r whatever its group's, ``_times_at``)."""
        if p == self.mb_p[k]:
            return self.mb_r[k]
        return self.by_sp[self.mbq.group[k]][p].recompute_layers

    def chunk(self, setting: Setting) -> int:
        """Samples per chunk when a group runs a primary micro-batch with this (possibly smaller-p) setting."""
        return min(setting.micro_batch_size, self.settings[setting.seq_group].micro_batch_size)


class EpochProgress:
    """What changes while an epoch is planned: the consumed micro-batches and the last window's length."""

    __slots__ = ("consumed", "scan_hint", "mark")

    def __init__(self, num_micro_batches: int) -> None:
        self.consumed = bytearray(num_micro_batches)
        """1 for every micro-batch a step took."""
        self.scan_hint = 256
        """Length of the last step's window: the next scan reads chunks of about this size."""
        self.mark = np.zeros(num_micro_batches, dtype=bool)
        """Scratch mask over the epoch's micro-batches (``improve``), all False between uses."""

    def consumed_np(self) -> np.ndarray:
        """A numpy view of ``consumed`` (shares its memory)."""
        return np.frombuffer(self.consumed, dtype=np.uint8)


def _settings(inp: EpochInput, present: list[int]) -> tuple[dict, dict]:
    """Primary settings and the settings per p of the present seq_groups; a clear error for one with none."""
    cfg = inp.config.planning
    kw = dict(mem_capacity_bytes=cfg.mem_capacity_bytes, sp_sizes=cfg.sp_sizes, world_size=inp.world_size,
              ranks_per_node=cfg.ranks_per_node, dynamic_recompute=inp.method == "dcp-intra")
    best = best_settings(inp.table, **kw)
    by_sp = settings_by_sp(inp.table, **kw)
    for g in present:
        if g not in best:
            raise no_setting_error(g, inp.table, inp.groups, mem_capacity_bytes=cfg.mem_capacity_bytes,
                                   sp_sizes=cfg.sp_sizes, world_size=inp.world_size)
    best = {g: best[g] for g in present}
    if cfg.tokens_per_step:
        # the step time a global batch implies: its tokens at the epoch's GPU-seconds per token, over W
        tok = np.bincount(inp.groups, weights=inp.lengths, minlength=max(present) + 1)
        gpu_s = sum(tok[g] * s.sp_size * s.time_s / (s.micro_batch_size * s.seq_len) for g, s in best.items())
        step_s = cfg.tokens_per_step * gpu_s / max(1.0, float(tok.sum())) / inp.world_size
        best = batch_settings(inp.table, best, step_s, **kw)
        # as token packs (dcp.planner.tokens): no micro-batch of more samples than a rank's share of a step
        # holds, else a step can only take whole such micro-batches and misses its bounds (W = 1, 16 samples of
        # up to 256 tokens, 4 a step: micro-batches of 4 x 256 left one step 209 tokens of its 904)
        most = cfg.tokens_per_step / inp.world_size
        cands = candidate_settings(inp.table, **kw)
        for g, s in best.items():
            if s.micro_batch_size > 1 and s.micro_batch_size * s.seq_len > most:
                fit = [c for c in cands[g] if (c.sp_size, c.recompute_layers) == (s.sp_size, s.recompute_layers)
                       and (c.micro_batch_size == 1 or c.micro_batch_size * c.seq_len <= most)]
                best[g] = min(fit, key=lambda c: (-c.tokens_per_gpu_s, -c.micro_batch_size), default=s)
    return best, {g: by_sp[g] for g in present}


def _unit_times(settings: dict[int, Setting], options: dict[int, list[Setting]],
                times: TimeLookup) -> dict[tuple[int, int], float]:
    """(seq_group, p) -> time for a group with that setting to run one full primary micro-batch of the
    seq_group, in chunks of the smaller b; the primary setting's own at its p."""
    out: dict[tuple[int, int], float] = {}
    every = [*settings.values(), *(s for opts in options.values() for s in opts)]
    for s in every:
        key = (s.seq_group, s.sp_size)
        if key in out:
            continue
        g, b = s.seq_group, settings[s.seq_group].micro_batch_size
        c = min(s.micro_batch_size, b)
        q, rem = divmod(b, c)
        t = q * times.time_s(g, s.sp_size, s.recompute_layers, c)
        if rem:
            t += times.time_s(g, s.sp_size, s.recompute_layers, rem)
        out[key] = t
    return out


def _times_at(primary: dict[int, tuple[int, int]], mb_time: np.ndarray) -> dict[int, np.ndarray]:
    """Every micro-batch's time in a group of its p at recompute r, for every r a primary setting uses. A group
    runs its micro-batches one after another and frees each one's activations after its backward, so memory
    is per micro-batch: each runs its own minimal r whatever its group's (Eq. 6 holds micro-batch by
    micro-batch), at its own time. (Until 2026-11-26 a group ran one r, and a micro-batch of less recompute
    in it paid the group's.)"""
    return {r: mb_time for r in sorted({r for _, r in primary.values()})}


def _flat_samples(mbq: MicroBatchQueues, n_groups: int, grp: np.ndarray) -> tuple[np.ndarray, ...]:
    """The epoch's samples as flat arrays (seq_group after seq_group), and where each micro-batch's run of them
    starts: a step's sample arrays are gathered in numpy (``dcp.planner.build``)."""
    present_ids = sorted(mbq.sample_ids)
    base = np.zeros(n_groups, dtype=np.int64)
    base[present_ids] = np.cumsum([0] + [len(mbq.sample_ids[g]) for g in present_ids])[:-1]
    empty = [np.zeros(0, dtype=np.int64)]  # an empty epoch
    flat_ids = np.concatenate(empty + [mbq.sample_ids[g] for g in present_ids]).astype(np.int64)
    flat_lens = np.concatenate(empty + [mbq.seq_lens[g] for g in present_ids]).astype(np.int64)
    return flat_ids, flat_lens, base[grp] + np.asarray(mbq.start, dtype=np.int64)


def _lookahead(inp: EpochInput, settings: dict[int, Setting], unit_time: dict, n_groups: int,
               mbq: MicroBatchQueues) -> int:
    """advanced.lookahead_samples, or for 0 the work-sized ``default_lookahead`` (a token-packed group's
    samples per micro-batch: its mean, not b)."""
    cfg = inp.config.planning
    if inp.config.advanced.lookahead_samples:
        return inp.config.advanced.lookahead_samples
    unit_primary = [0.0] * n_groups
    for g, s in settings.items():
        unit_primary[g] = unit_time[(g, s.sp_size)]
    counts = np.bincount(inp.groups, minlength=n_groups)
    per_mb = {g: counts[g] / max(1, len(mbq.queue.get(g, ()))) for g in mbq.token_budget}
    per_sample = sum(
        counts[g] * unit_primary[g] * s.sp_size / per_mb.get(g, s.micro_batch_size) for g, s in settings.items()
    ) / max(1, inp.num_samples)
    la = default_lookahead(inp.world_size, cfg.gmax * max(unit_primary), per_sample, inp.num_samples)
    if cfg.tokens_per_step:
        # A step at a global batch reads on until it has found the work of its tokens (``window.scan`` skips
        # what earlier steps took): short micro-batches the packing left behind must not end it early.
        la = inp.num_samples
    return la


def prepare_epoch(inp: EpochInput) -> EpochArrays:
    """Once per epoch: settings, micro-batches, per-micro-batch times and queue indices."""
    present = np.unique(inp.groups).tolist()
    settings, by_sp = _settings(inp, present)
    options = {g: list(by_sp[g].values()) for g in present}
    times = TimeLookup(inp.table)
    packs = token_pack_settings(inp, settings, times)  # advanced.micro_batch_tokens: {} when off
    settings.update(packs)
    unit_time = _unit_times(settings, options, times)
    mbq = MicroBatchQueues(inp.lengths, inp.groups, inp.order, {g: s.micro_batch_size for g, s in settings.items()},
                           shapes=inp.shapes, token_budget={g: s.micro_batch_size * s.seq_len for g, s in packs.items()})
    n_groups = len(inp.table.seq_group_edges)
    primary = {g: (settings[g].sp_size, settings[g].recompute_layers) for g in present}
    mb_time = micro_batch_times(mbq, times, primary)
    by_rank = np.argsort(-mb_time, kind="stable")
    rank_desc = np.empty(len(mb_time), dtype=np.int64)
    rank_desc[by_rank] = np.arange(len(mb_time), dtype=np.int64)
    grp = np.asarray(mbq.group, dtype=np.int64)
    p_by_g = np.zeros(n_groups, dtype=np.int64)
    r_by_g = np.zeros(n_groups, dtype=np.int64)
    for g, (p, r) in primary.items():
        p_by_g[g], r_by_g[g] = p, r
    mb_p_np, mb_r_np = p_by_g[grp], r_by_g[grp]
    time_at_np = _times_at(primary, mb_time)
    count = np.asarray(mbq.count, dtype=np.int64)
    flat_ids, flat_lens, mb_flat = _flat_samples(mbq, n_groups, grp)
    cfg = inp.config.planning
    return EpochArrays(
        world_size=inp.world_size, ranks_per_node=cfg.ranks_per_node, gmin=cfg.gmin, gmax=cfg.gmax,
        epoch=inp.epoch, method=inp.method, num_samples=inp.num_samples,
        lookahead_samples=_lookahead(inp, settings, unit_time, n_groups, mbq), settings=settings, by_sp=by_sp,
        options=options, unit_time=unit_time, times=times, mbq=mbq, mb_t=mb_time,
        mb_t_list=tuple(mb_time.tolist()), rank_desc=rank_desc, by_rank=by_rank, mb_p_np=mb_p_np, mb_r_np=mb_r_np,
        mb_p=tuple(mb_p_np.tolist()), mb_r=tuple(mb_r_np.tolist()), mb_work=mb_time * mb_p_np,
        time_at_np=time_at_np, time_at={r: tuple(t.tolist()) for r, t in time_at_np.items()},
        mb_end=tuple((np.asarray(mbq.start, dtype=np.int64) + count).tolist()), flat_ids=flat_ids,
        flat_lens=flat_lens, mb_flat=mb_flat, mb_count=count, mb_group=grp, ready=tuple(mbq.ready.tolist()),
    )
