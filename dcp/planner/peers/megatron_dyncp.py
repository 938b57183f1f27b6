"""Megatron-Core's dynamic context parallelism (hybrid CP, 2025), re-implemented as a baseline on dcp's cost model.

From its description (Megatron-LM ``hybrid_cp_schedule.py``, ``BalancedCPScheduler``) and docs/peers.md:

1. One optimizer step per global batch: a fixed token budget cut from the epoch's stream in order.
2. CP size per sequence: the smallest power of two >= len / m (m: ``max_seqlen_per_dp_cp_rank``), raised
   until the sequence fits memory at the run's recompute.
3. Packing: the sequences of one CP size p, longest first, first fit, into packs of at most
   min(p x m, the memory capacity at (p, r)) tokens, each run as one row of documents (THD).
4. Placement, in scheduling rounds (Megatron's "groups": every rank belongs to one CP group per round): packs
   longest first; a pack joins the CP group of its size that is least loaded (starts it earliest) while the
   round's longest pack still bounds that group, else opens a group on the lowest free aligned block of p
   ranks, else waits for the next round. Ranks left empty in a round are given to a neighbouring group by
   doubling its CP size (Megatron's ``fill_empty_gpus``) while that shortens the group.
5. Recompute is global (none or full), chosen per run; m is swept over the seq_group bounds; the pair with the
   least predicted compute time is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcp.planner.peers.common import PeerCost, aligned_start, cut_steps, phase_plan, power_of_two_at_least
from dcp.planner.placement import place_largest_first
from dcp.planner.plan import MicroBatch, StepPlan
from dcp.planner.stream import PlanningError

METHOD = "megatron-dyncp"

WORK_SHARE = 0.0
"""A round's target is max(its longest pack, this x the pending GPU-work / W)."""

Phase = list[list]
"""A round's groups: [first rank, p, load s, micro-batches]."""


def cp_sizes(lens: np.ndarray, cost: PeerCost, r: int, m: int) -> np.ndarray | None:
    """Per sequence: the smallest allowed power-of-two CP size >= len / m that fits memory at r (None: some
    sequence has none, so (m, r) is not a valid setting for this data)."""
    out = np.zeros(len(lens), dtype=np.int64)
    memo: dict[tuple[int, int], int] = {}
    for i, n in enumerate(lens.tolist()):
        need = power_of_two_at_least(n / m)
        key = (cost.group_of(n), need)
        p = memo.get(key)
        if p is None:
            p = memo[key] = cost.smallest_fit(n, r, at_least=need)
        if not p:
            return None
        out[i] = p
    return out


def _packs(ids: np.ndarray, lens: np.ndarray, shapes: np.ndarray | None, p_of: np.ndarray, cost: PeerCost, r: int,
           m: int) -> list[tuple[int, MicroBatch]]:
    """(p, pack) for every pack of the step: per CP size, first fit longest first within min(p x m, capacity)."""
    out = []
    for p in np.unique(p_of).tolist():
        sel = np.flatnonzero(p_of == p)
        mbs = cost.micro_batches(ids[sel].tolist(), lens[sel].tolist(), shapes[sel] if shapes is not None else None,
                                 p, r, cap_tokens=p * m)
        out.extend((p, mb) for mb in mbs)
    return out


def _retime(mb: MicroBatch, cost: PeerCost, p: int, r: int) -> MicroBatch:
    if mb.seq_group < 0:
        return mb._replace(time_s=cost.times.pack_time_s(p, r, mb.seq_lens))
    return mb._replace(time_s=cost.times.lengths_time_s(mb.seq_group, p, r, mb.seq_lens))


def _place(groups: Phase, world_size: int, rpn: int, sizes: list[int]) -> list[int] | None:
    """First ranks of groups of these sizes placed largest first on aligned blocks (None: they do not fit)."""
    order = sorted(range(len(groups)), key=lambda i: -sizes[i])
    starts, _ = place_largest_first([sizes[i] for i in order], world_size, rpn)
    if any(st is None for st in starts):
        return None
    out = [0] * len(groups)
    for i, st in zip(order, starts, strict=True):
        out[i] = st
    return out


def _fill_empty(groups: Phase, world_size: int, cost: PeerCost, r: int, rpn: int) -> None:
    """Ranks a round leaves empty: double the CP size of the most loaded group that gets shorter by it, moving
    the groups to make room (Megatron's fill_empty_gpus), while the groups still fit the world."""
    allowed = set(cost.sp_sizes)
    while True:
        used = sum(g[1] for g in groups)
        for g in sorted(groups, key=lambda g: -g[2]):
            q = 2 * g[1]
            if q not in allowed or used + g[1] > world_size:
                continue
            mbs = [_retime(mb, cost, q, r) for mb in g[3]]
            load = sum(mb.time_s for mb in mbs)
            if load >= g[2]:
                continue
            starts = _place(groups, world_size, rpn, [q if h is g else h[1] for h in groups])
            if starts is None:
                continue
            g[1], g[2], g[3] = q, load, mbs
            for h, st in zip(groups, starts, strict=True):
                h[0] = st
            break
        else:
            return


def _larger(groups: Phase, p: int, mb: MicroBatch, limit: float, cost: PeerCost, r: int):
    """(the group of a larger CP size where the pack, timed there, ends earliest within the limit, the pack
    timed there), or (None, the pack)."""
    best, best_mb = None, mb
    for g in groups:
        if g[1] > p:
            at = _retime(mb, cost, g[1], r)
            if g[2] + at.time_s <= limit and (best is None or g[2] + at.time_s < best[2] + best_mb.time_s):
                best, best_mb = g, at
    return best, best_mb


def schedule_rounds(packs: Sequence[tuple[int, MicroBatch]], world_size: int, ranks_per_node: int, cost: PeerCost,
                    r: int) -> list[Phase]:
    """Scheduling rounds of one step (module docstring, item 4)."""
    pending = sorted(packs, key=lambda pk: -pk[1].time_s)
    rounds: list[Phase] = []
    while pending:
        free = [True] * world_size
        groups: Phase = []
        # the round's target: its longest pack, or the pending work spread over every rank when that is longer
        # (Megatron forms a round until its ranks are balanced, not at the first pack)
        work = sum(p * mb.time_s for p, mb in pending) / world_size
        limit = max(pending[0][1].time_s, work * WORK_SHARE) * (1 + 1e-9)
        left = []
        for p, mb in pending:
            # earliest start: a free aligned block starts the pack now; else the least loaded group of its size
            s = aligned_start(free, p, ranks_per_node)
            if s is not None:
                free[s : s + p] = [False] * p
                best = [s, p, 0.0, []]
                groups.append(best)
            else:
                best = min((g for g in groups if g[1] == p and g[2] + mb.time_s <= limit), key=lambda g: g[2],
                           default=None)
                if best is None:  # a larger CP group with room runs it too (Megatron raises CP sizes to fill)
                    best, mb = _larger(groups, p, mb, limit, cost, r)
                if best is None:
                    left.append((p, mb))
                    continue
            best[2] += mb.time_s
            best[3].append(mb)
        if not groups:
            raise PlanningError(f"a pack of CP size {pending[0][0]} fits no aligned block of {world_size} ranks")
        _fill_empty(groups, world_size, cost, r, ranks_per_node)
        rounds.append(groups)
        pending = left
    return rounds


def plan_steps(ids: np.ndarray, lens: np.ndarray, shapes: np.ndarray | None, cuts: list[tuple[int, int]],
               cost: PeerCost, world_size: int, ranks_per_node: int, r: int, m: int) -> list[list[Phase]] | None:
    """Rounds of every step for one (m, r); None when some sequence has no CP size at (m, r)."""
    p_all = cp_sizes(lens, cost, r, m)
    if p_all is None:
        return None
    out = []
    for a, e in cuts:
        packs = _packs(ids[a:e], lens[a:e], shapes[a:e] if shapes is not None else None, p_all[a:e], cost, r, m)
        out.append(schedule_rounds(packs, world_size, ranks_per_node, cost, r))
    return out


def compute_time_s(steps: list[list[Phase]]) -> float:
    """Predicted compute time: every round lasts its most loaded group."""
    return sum(max(g[2] for g in rnd) for rounds in steps for rnd in rounds)


def plan_epoch(ids: np.ndarray, lens: np.ndarray, shapes: np.ndarray | None, cost: PeerCost, *, world_size: int,
               ranks_per_node: int, target_tokens: float, epoch: int,
               bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[list[StepPlan], dict]:
    """StepPlans (one per round; a step's rounds share its index) for the best (m, r), and that choice.

    ``ids``, ``lens`` and ``shapes`` are in stream order."""
    cuts = cut_steps(lens, target_tokens, bounds)
    best, choice = None, {}
    for r in (0, cost.num_layers):
        for m in cost.table.seq_group_edges:
            steps = plan_steps(ids, lens, shapes, cuts, cost, world_size, ranks_per_node, r, m)
            if steps is None:
                continue
            t = compute_time_s(steps)
            if best is None or t < choice["compute_time_s"] * (1 - 1e-12):
                best, choice = steps, {"max_seqlen_per_rank": m, "recompute_layers": r, "compute_time_s": t}
    if best is None:
        raise PlanningError(
            f"no CP size holds the longest sample ({int(lens.max())} tokens) at any max_seqlen_per_rank with "
            f"sp_sizes {list(cost.sp_sizes)}: raise planning.mem_capacity_gib or allow larger planning.sp_sizes"
        )
    plans = [phase_plan(epoch, k, world_size, METHOD, [(g[0], g[1], choice["recompute_layers"], g[3]) for g in rnd])
             for k, rounds in enumerate(best) for rnd in rounds]
    return plans, choice
