"""Baselines with the same StepPlan output: bucket parallel (Open-Sora) and packed parallel.

Both use one fixed SP size p for the whole run, full recompute (r = L) and ga_steps = 1, and put one SP
group on every aligned block of p ranks (``placement.aligned_slots``); ranks no block covers idle.

- Bucket parallel: p is ``advanced.bucket_sp_size`` or the smallest p in sp_sizes that fits the longest
  seq_group of the data at b = 1, r = L. Every seq_group gets the largest b whose time (r = L) stays
  within the reference time of the longest seq_group at b = 1 (at least 1), as Open-Sora tunes its
  bucket batch sizes: every group's step then lasts about the same. Micro-batches come from the same
  seq_group queues as DCP, in readiness order, W // p per step.
- Bucket parallel, searched (``bucket-search``): the same, but the reference time is chosen among the
  table's full-recompute times at p (every candidate that changes some b) to maximise the predicted
  throughput of the epoch (tokens / sum of step times, each step the longest of its micro-batches): the
  strongest bucket baseline this rule family allows. Gradient sync is not in the prediction.
- Packed parallel: samples in stream order are packed greedily into micro-batches of at most
  ``advanced.packed_token_budget`` tokens (0: the largest b * seq_len that fits memory at p, r = L).
  A pack's predicted time is the sum of its samples' b = 1 times with the constant part T_C counted once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from dcp.config import gib
from dcp.planner.cost import micro_batch_time_s, min_recompute_layers
from dcp.planner.placement import aligned_slots
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.source import EpochInput
from dcp.planner.step_tokens import slot_steps
from dcp.planner.stream import (
    MicroBatchQueues,
    PlanningError,
    TimeLookup,
    micro_batch_times,
    no_setting_error,
)
from dcp.planner.table import ProfileRow, ProfileTable


def _fits_full_recompute(row: ProfileRow, cap: float) -> bool:
    return min_recompute_layers(row, cap) is not None


def _row(table: ProfileTable, group: int, sp_size: int, b: int) -> ProfileRow | None:
    return next((r for r in table.rows_for(group) if r.sp_size == sp_size and r.micro_batch_size == b), None)


def fixed_sp_size(
    table: ProfileTable,
    *,
    sp_sizes,
    bucket_sp_size: int,
    world_size: int,
    longest_group: int,
    mem_capacity_bytes: float,
) -> int:
    """The baselines' one SP size (see the module docstring)."""
    if bucket_sp_size:
        if bucket_sp_size > world_size:
            raise PlanningError(
                f"advanced.bucket_sp_size ({bucket_sp_size}) exceeds world_size ({world_size}): "
                "use a smaller bucket_sp_size or 0 to derive it"
            )
        return bucket_sp_size
    for p in sorted(sp_sizes):
        if p > world_size:
            break
        row = _row(table, longest_group, p, 1)
        if row is not None and _fits_full_recompute(row, mem_capacity_bytes):
            return p
    raise PlanningError(
        f"no sp_size in {sorted(sp_sizes)} (<= world_size {world_size}) fits the longest seq_group "
        f"{longest_group} (<= {table.seq_group_edges[longest_group]} tokens) at b=1 with full recompute in "
        f"{gib(mem_capacity_bytes)}: raise planning.mem_capacity_gib, allow larger planning.sp_sizes "
        "or more ranks"
    )


def bucket_batch_sizes(
    table: ProfileTable,
    sp_size: int,
    groups: list[int],
    mem_capacity_bytes: float,
    all_groups: np.ndarray | None = None,
    reference_s: float | None = None,
) -> dict[int, int]:
    """Per seq_group, the largest b (r = L, fits memory) whose time is within the reference time: the longest
    group's b=1 time (Open-Sora's rule), or ``reference_s`` when given (bucket-search)."""
    L = table.num_layers
    longest = max(groups)
    ref_row = _row(table, longest, sp_size, 1)
    if ref_row is None or not _fits_full_recompute(ref_row, mem_capacity_bytes):
        raise no_setting_error(
            longest,
            table,
            all_groups if all_groups is not None else np.array(groups),
            mem_capacity_bytes=mem_capacity_bytes,
            sp_sizes=[sp_size],
            world_size=sp_size,
            what="b=1 row at the fixed sp_size",
        )
    t_ref = micro_batch_time_s(ref_row, L) if reference_s is None else reference_s
    out = {}
    for g in groups:
        ok = [
            r.micro_batch_size
            for r in table.rows_for(g)
            if r.sp_size == sp_size
            and _fits_full_recompute(r, mem_capacity_bytes)
            and micro_batch_time_s(r, L) <= t_ref * (1 + 1e-12)
        ]
        if not ok and not any(
            r.sp_size == sp_size and r.micro_batch_size == 1 and _fits_full_recompute(r, mem_capacity_bytes)
            for r in table.rows_for(g)
        ):
            raise no_setting_error(
                g,
                table,
                all_groups if all_groups is not None else np.array(groups),
                mem_capacity_bytes=mem_capacity_bytes,
                sp_sizes=[sp_size],
                world_size=sp_size,
                what="b=1 row at the fixed sp_size",
            )
        out[g] = max(ok, default=1)
    return out


def packed_token_budget(table: ProfileTable, sp_size: int, mem_capacity_bytes: float, configured: int) -> int:
    """advanced.packed_token_budget, or the largest b * seq_len that fits memory at sp_size, r = L."""
    if configured:
        return configured
    fits = [
        r.tokens for r in table.rows if r.sp_size == sp_size and _fits_full_recompute(r, mem_capacity_bytes)
    ]
    if not fits:
        raise PlanningError(
            f"no profile row at sp_size {sp_size} fits {gib(mem_capacity_bytes)} with full recompute, "
            "so no packing token budget can be derived: set advanced.packed_token_budget or raise mem_capacity_gib"
        )
    return max(fits)


class BaselinePlan(NamedTuple):
    """A baseline's plans of one epoch and the choices they were made with."""

    steps: Iterator[StepPlan]
    """The StepPlans, made as they are iterated."""
    sp_size: int
    """The one SP size p (0 for an empty epoch)."""
    batch_sizes: dict[int, int]
    """Bucket methods: micro-batch size per seq_group ({} for packed)."""


def baseline_plan(pl: EpochInput) -> BaselinePlan:
    """The epoch's plans for planning.method bucket, bucket-search or packed."""
    cfg = pl.config.planning
    cap = cfg.mem_capacity_bytes
    present = np.unique(pl.groups).tolist()
    if not present:
        return BaselinePlan(iter(()), 0, {})
    p = fixed_sp_size(
        pl.table,
        sp_sizes=cfg.sp_sizes,
        bucket_sp_size=pl.config.advanced.bucket_sp_size,
        world_size=pl.world_size,
        longest_group=max(present),
        mem_capacity_bytes=cap,
    )
    slots = aligned_slots(p, pl.world_size, cfg.ranks_per_node)
    if pl.method == "bucket":
        b_of = bucket_batch_sizes(pl.table, p, present, cap, pl.groups)
        return BaselinePlan(_bucket(pl, p, slots, b_of), p, b_of)
    if pl.method == "bucket-search":
        b_of = searched_batch_sizes(pl, p, slots, present, cap)
        return BaselinePlan(_bucket(pl, p, slots, b_of), p, b_of)
    budget = packed_token_budget(pl.table, p, cap, pl.config.advanced.packed_token_budget)
    return BaselinePlan(_packed(pl, p, slots, budget), p, {})


def searched_batch_sizes(pl: EpochInput, p: int, slots: list[int], present: list[int], cap: float) -> dict[int, int]:
    """Batch sizes of the bucket rule for the reference time that maximises predicted epoch throughput.

    Candidates: every full-recompute time of a fitting row at p of a present seq_group (each b assignment the
    rule can produce comes from one of them); the epoch is planned exactly as ``_bucket`` does (micro-batches
    in readiness order, one per slot, a step lasting its longest micro-batch) and scored by tokens / time.
    Ties keep the smaller reference (the first found), so the choice is deterministic.
    """
    L = pl.table.num_layers
    times = sorted({micro_batch_time_s(r, L) for g in present for r in pl.table.rows_for(g)
                    if r.sp_size == p and _fits_full_recompute(r, cap)})
    lookup = TimeLookup(pl.table)
    tokens = float(pl.lengths.sum())
    best, best_tput, seen = None, -1.0, set()
    for t_ref in times:
        b_of = bucket_batch_sizes(pl.table, p, present, cap, pl.groups, reference_s=t_ref)
        key = tuple(sorted(b_of.items()))
        if key in seen:
            continue
        seen.add(key)
        mbq = MicroBatchQueues(pl.lengths, pl.groups, pl.order, b_of, shapes=pl.shapes)
        mb_time = micro_batch_times(mbq, lookup, {g: (p, L) for g in b_of})
        cuts = np.arange(0, mbq.num, len(slots))
        total = float(np.maximum.reduceat(mb_time, cuts).sum()) if mbq.num else 0.0
        tput = tokens / total if total > 0 else 0.0
        if tput > best_tput * (1 + 1e-12):
            best, best_tput = b_of, tput
    if best is None:  # no fitting row at p: the plain rule raises the clear error
        return bucket_batch_sizes(pl.table, p, present, cap, pl.groups)
    return best


def _step(pl: EpochInput, step: int, p: int, slots: list[int], mbs: list[MicroBatch | None]) -> StepPlan:
    L = pl.table.num_layers
    groups = []
    covered = set()
    for st, mb in zip(slots, mbs, strict=False):
        groups.append(GroupPlan(st, p, L, (mb,) if mb is not None else ()))
        covered.update(range(st, st + p))
    for st in slots[len(mbs) :]:
        groups.append(GroupPlan(st, p, L, ()))
        covered.update(range(st, st + p))
    groups += [GroupPlan(r, 1, 0, ()) for r in range(pl.world_size) if r not in covered]
    groups.sort(key=lambda g: g.first_rank)
    return StepPlan(pl.epoch, step, pl.world_size, pl.method, tuple(groups))


def _bucket(pl: EpochInput, p: int, slots: list[int], b_of: dict[int, int]) -> Iterator[StepPlan]:
    mbq = MicroBatchQueues(pl.lengths, pl.groups, pl.order, b_of, shapes=pl.shapes)
    L = pl.table.num_layers
    mb_time = micro_batch_times(mbq, TimeLookup(pl.table), {g: (p, L) for g in b_of}).tolist()

    cfg = pl.config.planning
    if cfg.tokens_per_step:  # the user's global batch: steps cut by tokens, slots accumulate (ga > 1)
        yield from slot_steps([mbq.micro_batch(k, mb_time[k]) for k in range(mbq.num)], slots, p, L,
                              world_size=pl.world_size, epoch=pl.epoch, method=pl.method,
                              tokens_per_step=cfg.tokens_per_step, bounds=cfg.step_tokens_bounds)
        return
    step = 0
    for k0 in range(0, mbq.num, len(slots)):
        ks = range(k0, min(k0 + len(slots), mbq.num))
        mbs = [mbq.micro_batch(k, mb_time[k]) for k in ks]
        yield _step(pl, step, p, slots, mbs)
        step += 1


def _packed(pl: EpochInput, p: int, slots: list[int], budget: int) -> Iterator[StepPlan]:
    L = pl.table.num_layers
    cap = pl.config.planning.mem_capacity_bytes
    one: dict[int, tuple[float, float]] = {}  # seq_group -> (b=1 time at r = L, its T_C)
    for g in np.unique(pl.groups).tolist():
        row = _row(pl.table, g, p, 1)
        if row is None or not _fits_full_recompute(row, cap):
            raise no_setting_error(
                g,
                pl.table,
                pl.groups,
                mem_capacity_bytes=cap,
                sp_sizes=[p],
                world_size=pl.world_size,
                what="b=1 row at the fixed sp_size",
            )
        one[g] = (micro_batch_time_s(row, L), row.t_const_s)
    too_long = np.flatnonzero(pl.lengths > budget)
    if too_long.size:
        i = int(too_long[0])
        raise PlanningError(
            f"sample {i} has {int(pl.lengths[i])} tokens, more than advanced.packed_token_budget ({budget}): "
            f"raise the budget to >= {int(pl.lengths.max())} (and the memory capacity if needed) or drop the sample"
        )
    # each sample's b = 1 time at its own length (interpolated between seq_group bounds, as micro-batches are)
    times = TimeLookup(pl.table)
    sample_time = np.zeros(len(pl.lengths))
    for g in one:
        idx = np.flatnonzero(pl.groups == g)
        sample_time[idx] = times.padded_times_s(g, p, L, 1, pl.lengths[idx])
    # A 1D pack runs as one row of documents (one forward, document-masked attention): priced from its
    # documents' real lengths with the overhead paid once. A 2D pack runs its samples one by one.
    pack_time = None if pl.shapes is not None else (lambda lens: times.pack_time_s(p, L, lens))
    return _pack_steps(pl, p, slots, budget, one, sample_time, pack_time)


def _pack_steps(
    pl: EpochInput, p: int, slots: list[int], budget: int, one: dict[int, tuple[float, float]],
    sample_time: np.ndarray, pack_time: Callable[[list[int]], float] | None = None,
) -> Iterator[StepPlan]:
    packs = _packs_in_order(pl, budget, one, sample_time, pack_time)
    cfg = pl.config.planning
    if cfg.tokens_per_step:  # the user's global batch: steps cut by tokens, slots accumulate (ga > 1)
        yield from slot_steps(list(packs), slots, p, pl.table.num_layers, world_size=pl.world_size,
                              epoch=pl.epoch, method=pl.method, tokens_per_step=cfg.tokens_per_step,
                              bounds=cfg.step_tokens_bounds)
        return
    step, mbs = 0, []
    for mb in packs:
        mbs.append(mb)
        if len(mbs) == len(slots):
            yield _step(pl, step, p, slots, mbs)
            step, mbs = step + 1, []
    if mbs:
        yield _step(pl, step, p, slots, mbs)


def _packs_in_order(
    pl: EpochInput, budget: int, one: dict[int, tuple[float, float]], sample_time: np.ndarray,
    pack_time: Callable[[list[int]], float] | None,
) -> Iterator[MicroBatch]:
    """The packs, in stream order: greedy, a pack closes when the next sample would pass the budget."""
    order = pl.order.tolist()
    lengths = pl.lengths[pl.order].tolist()
    groups = pl.groups[pl.order].tolist()
    t_one = sample_time[pl.order].tolist()
    n, i = len(order), 0
    while i < n:
        ids, lens, tok, t, tc = [], [], 0, 0.0, 0.0
        while i < n and tok + lengths[i] <= budget:
            c = one[groups[i]][1]
            ids.append(order[i])
            lens.append(lengths[i])
            tok += lengths[i]
            t += t_one[i] - c
            tc = max(tc, c)
            i += 1
        # One forward/backward for the whole pack: the constant part (embedding, head, loss) once.
        t_pack = pack_time(lens) if pack_time is not None and len(lens) > 1 else t + tc
        yield MicroBatch(tuple(ids), tuple(lens), -1, t_pack)
