"""After packing a DCP step: the local search (``improve``), the head joining another group (``join_head``),
and the measures both are judged by (``idle``, ``work``), on ``Group`` values (``dcp.planner.group``)."""

from __future__ import annotations

import bisect
import itertools
import operator

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.group import Group
from dcp.planner.sorting import argsort_float
from dcp.planner.tuning import BULK_MIN_RANKS, IMPROVE_GROUPS, IMPROVE_MIN

_P, _LOAD = operator.attrgetter("p"), operator.attrgetter("load")


def idle(groups: list[Group], world_size: int) -> float:
    """GPU-weighted idle of packed groups over the world, at their longest load."""
    t = max(map(_LOAD, groups), default=0.0)
    if t <= 0:
        return 1.0
    return 1.0 - work(groups) / (world_size * t)


def work(groups: list[Group]) -> float:
    """GPU-seconds of work in packed groups (p x load, summed in order; ``map``: no generator frame per group)."""
    return sum(map(operator.mul, map(_P, groups), map(_LOAD, groups)))


def idle_floor(ep: EpochArrays, groups: list[Group]) -> float:
    """The least idle ``improve`` can leave packed ``groups`` at: it changes at most IMPROVE_GROUPS groups, none
    past the longest one's load (x (1 + 1e-9)), and never shortens a group, so at most the IMPROVE_GROUPS largest
    p x (room to that load) of work joins while the longest load stays."""
    loads = np.fromiter(map(_LOAD, groups), dtype=np.float64, count=len(groups))
    t = float(loads.max()) if len(groups) else 0.0
    if t <= 0:
        return 1.0
    room = np.fromiter(map(_P, groups), dtype=np.float64, count=len(groups)) * (t * (1 + 1e-9) - loads)
    more = float(np.sort(room)[-IMPROVE_GROUPS:].sum())
    return 1.0 - (work(groups) + more) / (ep.world_size * t)


def _unclaimed(ts: list[float], ids: list[int], claimed: set[int], bound: float) -> int:
    """Index of the longest entry of ``ts`` (ascending) at most ``bound`` whose id is not claimed (-1: none);
    claimed entries met on the way are dropped."""
    j = bisect.bisect_right(ts, bound) - 1
    while j >= 0 and ids[j] in claimed:
        ts.pop(j)
        ids.pop(j)
        j -= 1
    return j


def left_over(prog: EpochProgress, win: np.ndarray, groups: list[Group]) -> np.ndarray:
    """The window's micro-batches no group holds, in window order."""
    taken = np.fromiter(itertools.chain.from_iterable(gr.items for gr in groups), dtype=np.int64,
                        count=sum(len(gr.items) for gr in groups))
    mark = prog.mark  # all False between calls
    mark[taken] = True
    rest = win[~mark[win]]
    mark[taken] = False
    return rest


def improve(ep: EpochArrays, prog: EpochProgress, win: np.ndarray, groups: list[Group], head: int) -> None:
    """Local search: in the emptiest groups (at most IMPROVE_GROUPS), swap a micro-batch for a longer one
    left in the window (same p, any recompute: each runs its own) while the group stays within the step's
    time (its longest group, not T*), and add left-over micro-batches that fit. The head stays. From
    BULK_MIN_RANKS ranks only the adding: a step there holds tens of thousands of short micro-batches, whose
    swaps cost a Python step each for little."""
    if len(groups) < 2 or idle(groups, ep.world_size) < IMPROVE_MIN:
        return
    loads = np.fromiter(map(_LOAD, groups), dtype=np.float64, count=len(groups))  # (one pass, no generator)
    step_t = float(loads.max()) * (1 + 1e-9)
    slack = step_t - loads
    emptiest = np.flatnonzero(slack > IMPROVE_MIN * step_t)
    if not emptiest.size:
        return
    # most slack first, ties the later group first (numpy keys: no tuple per group for the collector)
    emptiest = emptiest[np.lexsort((emptiest, slack[emptiest]))[::-1]][:IMPROVE_GROUPS].tolist()
    rest = left_over(prog, win, groups)
    if not rest.size:
        return
    swaps = ep.world_size < BULK_MIN_RANKS
    spare: dict[tuple[int, int], tuple] = {}
    """Per (p, group r): left-over micro-batches of that p, (times ascending, ids), as lists
    (swaps) or arrays (only the adding: one look-up per group, not the whole list in Python objects)."""
    p_rest = ep.mb_p_np[rest]
    claimed: set[int] = set()
    """Left-over micro-batches given to a group here: kinds of one p with different r share left-overs."""
    for i in emptiest:
        p, r = groups[i].p, groups[i].r
        if (p, r) not in spare:
            sel = rest[p_rest == p]
            ts_np = ep.time_at_np[r][sel]
            o = argsort_float(ts_np)
            spare[(p, r)] = (ts_np[o].tolist(), sel[o].tolist()) if swaps else (ts_np[o], sel[o], {})
        if not swaps:
            _add_longest(groups[i], spare[(p, r)], claimed, step_t)
            continue
        ts, ids = spare[(p, r)]
        if ts:
            _improve_group(ep.time_at[r], groups[i], ts, ids, claimed, step_t, head, swaps)


def _add_longest(gr: Group, entry: tuple[np.ndarray, np.ndarray, dict[int, int]], claimed: set[int],
                 step_t: float) -> None:
    """``_improve_group`` without swaps, on arrays: the longest unclaimed left-over (times ascending, ties the
    later) that fits the group's room joins it. ``entry``: (times, ids, gone), ``gone`` linking each position
    the list form would have popped (claimed: taken here or by a kind of another r) to the one before it."""
    ts, ids, gone = entry
    j = _before(gone, int(np.searchsorted(ts, step_t - gr.load, side="right")) - 1)
    while j >= 0 and int(ids[j]) in claimed:
        gone[j] = j - 1
        j = _before(gone, j - 1)
    if j >= 0:
        k_new = int(ids[j])
        gr.load += float(ts[j])
        claimed.add(k_new)
        gr.items.append(k_new)
        gone[j] = j - 1


def _before(gone: dict[int, int], j: int) -> int:
    """The first position at or before j not gone (-1: none), shortening the links it follows."""
    path = []
    while j in gone:
        path.append(j)
        j = gone[j]
    for q in path:
        gone[q] = j
    return j


def _improve_group(at_r: tuple[float, ...], gr: Group, ts: list[float], ids: list[int], claimed: set[int],
                   step_t: float, head: int, swaps: bool) -> None:
    """One group of ``improve``: each micro-batch (not the head) swapped for the longest left-over that still
    fits (``swaps`` only), then the longest left-over that fits added."""
    ks = gr.items
    for n in range(0 if swaps else len(ks), len(ks) + 1):
        room = step_t - gr.load
        if n == len(ks):  # add what still fits
            j = _unclaimed(ts, ids, claimed, room)
            if j >= 0:
                gr.load += ts.pop(j)
                k_new = ids.pop(j)
                claimed.add(k_new)
                ks.append(k_new)
            break
        k = ks[n]
        if k == head:
            continue
        t_k = at_r[k]
        j = _unclaimed(ts, ids, claimed, t_k + room)
        if j >= 0 and ts[j] > t_k:
            t_new, k_new = ts.pop(j), ids.pop(j)
            claimed.add(k_new)
            claimed.discard(k)
            at_j = bisect.bisect_right(ts, t_k)
            ts.insert(at_j, t_k)
            ids.insert(at_j, k)
            ks[n] = k_new
            gr.load += t_new - t_k


def join_head(ep: EpochArrays, groups: list[Group], head: int, t_star: float) -> tuple[int, float] | None:
    """Put the head (left out of ``groups``) into the fullest group it fits within t_star: a group of its
    primary p, or of a larger p where its seq_group has a setting whose b holds it (the same memory rule as
    for smaller-p fillers), at any group r: it runs its own r there (its primary's, or that setting's).
    Returns (the group's index, the head's time there), or None when no group has room."""
    mbq = ep.mbq
    g, p_h, t_h = mbq.group[head], ep.mb_p[head], ep.mb_t_list[head]
    lens = mbq.lens_list[g][mbq.start[head] : ep.mb_end[head]]
    limit = t_star * (1 + 1e-9)
    best, best_load = None, -1.0
    memo: dict[int, float] = {}
    for i, gr in enumerate(groups):
        p, load = gr.p, gr.load
        if p < p_h or load <= best_load:
            continue
        if p != p_h:
            s = ep.by_sp[g].get(p)
            if s is None or s.micro_batch_size < len(lens):
                continue
        t = memo.get(p)
        if t is None:
            t = memo[p] = ep.times.lengths_time_s(g, p, s.recompute_layers, lens) if p != p_h else t_h
        if load + t <= limit:
            best, best_load = (i, t), load
    if best is None:
        return None
    i, t = best
    groups[i].load += t
    groups[i].items.append(head)
    return best
