"""Step 3 of a DCP step: packing the window's micro-batches into SP groups of at most T* each.

A group is a ``Group`` (``dcp.planner.group``: p, r, load, items; mutable: the local search and the head's join
change it). Longest first, best fit: a micro-batch joins the open group of its p (at any r: each runs its own) with the most load
that still fits T*, or opens a group on free ranks when its p's window work can fill one (the head and the
longest always do); a second pass uses ranks still free. One packer at every world size: at 4096 ranks it costs
66 ms of CPU per step (t1d-long on H200, ``dcp bench planner``: 0.14% of a 46.6 s step), and a numpy packer used
from 512 ranks once made a step at a global batch idle 0.7 instead of 0.1 there (``test_planner_world_smooth``).
"""

from __future__ import annotations

import bisect
import operator

import numpy as np

from dcp.planner.epoch import EpochArrays
from dcp.planner.group import Group
from dcp.planner.tuning import OPEN_FILL

_FIRST = operator.itemgetter(0)
DENSE_WINDOW = 4
"""``longest_first`` marks a mask instead of sorting from windows of 1/DENSE_WINDOW of the epoch (here the two
break even near 1/6: 1.1M micro-batches, a window of 400k: sort 4.4 ms, mask 2.4 ms; of 140k: 1.4 / 1.6 ms)."""


def pack(ep: EpochArrays, win: np.ndarray, t_star: float, head: int, head_first: bool = False,
         defer_head: bool = False) -> list[Group]:
    """Longest-first best-fit of the window's micro-batches into SP groups of at most t_star each.

    A micro-batch joins a group of its primary p at any r, running its own
    r there (``StepPlan.mb_recompute_layers``: memory is per micro-batch) at its own time. It opens a new
    group when none has room, ranks are free and its p's unassigned window work can fill one more group (the head, and the
    window's longest micro-batch, always open one). A second pass opens groups for what is left while
    ranks are free. Returns the groups in opening order.
    ``head_first``: the head opens the first group; ``defer_head``: the head is left out (it joins later).
    """
    order_np = longest_first(ep, win)
    order = order_np.tolist()
    if defer_head:  # the head is placed afterwards (``improve.join_head``)
        order.remove(head)
    elif order[0] != head:  # the head opens a group right after the longest (or first), before ranks run out
        order.remove(head)
        order.insert(0 if head_first else 1, head)
    pw = np.bincount(ep.mb_p_np[win], weights=ep.mb_t[win])
    pool: dict[int, float] = {int(q): float(pw[q]) for q in np.flatnonzero(pw)}
    """Per p: window time (at the primary setting) not yet in a group."""
    if defer_head:
        pool[ep.mb_p[head]] -= ep.mb_t_list[head]
    forced = {order[0]} if defer_head else {head} if head_first else {head, order[0]}
    return _best_fit(ep, order, t_star, pool, forced)


def longest_first(ep: EpochArrays, win: np.ndarray) -> np.ndarray:
    """The window's micro-batches longest first, ties in release order: their places in the epoch's
    longest-first order (unique), ascending. A window of more than 1/DENSE_WINDOW of the epoch's micro-batches
    marks its places in a mask over that order (a pass over it) instead of sorting them (4096 ranks, text: a
    window of 400k of 1.1M). The places sort as 32-bit integers where they fit (the same order; numpy's sort
    of 300k of them takes 1.0 ms instead of 1.9 ms)."""
    ranks = ep.rank_desc[win]
    n = len(ep.by_rank)
    if len(win) * DENSE_WINDOW < n:
        return ep.by_rank[np.sort(ranks.astype(np.int32) if n < 2**31 else ranks)]
    mask = np.zeros(n, dtype=bool)
    mask[ranks] = True
    return ep.by_rank[np.flatnonzero(mask)]


def _best_fit(ep: EpochArrays, order: list[int], t_star: float, pool: dict[int, float],
              forced: set[int]) -> list[Group]:
    """The best-fit passes of ``pack`` over ``order`` (``forced``: micro-batches that always open a group)."""
    t_of, p_of, r_of, at = ep.mb_t_list, ep.mb_p, ep.mb_r, ep.time_at
    limit = t_star * (1 + 1e-9)
    deficit = dict.fromkeys(pool, 0.0)
    """Per p: time the open groups of that p still lack to reach t_star."""
    open_need = OPEN_FILL * t_star
    groups: list[Group] = []
    kinds: dict[int, list[tuple[int, list[float], list[int]]]] = {}
    """Per p: (r, group loads ascending, group ids in the same order), by ascending r."""
    free = ep.world_size
    left: list[int] = []
    bisect_right, insert_at = bisect.bisect_right, list.insert
    for second in (False, True):
        todo, left = (left, []) if second else (order, [])
        for k in todo:
            p, r, t = p_of[k], r_of[k], t_of[k]
            best_load, best = -1.0, None
            for r2, loads, gids in kinds.get(p, ()):
                t2 = t if r2 == r else at[r2][k]
                i = bisect_right(loads, limit - t2) - 1
                if i >= 0 and loads[i] > best_load:
                    best_load, best = loads[i], (loads, gids, i, t2)
            if best is not None:
                loads, gids, i, t2 = best
                gid = gids.pop(i)
                load = loads.pop(i) + t2
                gr = groups[gid]
                gr.load = load
                gr.items.append(k)
                j = bisect_right(loads, load)
                insert_at(loads, j, load)
                insert_at(gids, j, gid)
                deficit[p] -= t2
                pool[p] -= t
            elif p <= free and t <= limit and (second or k in forced or pool[p] - deficit[p] >= open_need):
                free -= p
                _open(groups, kinds, k, p, r, t)
                deficit[p] += t_star - t
                pool[p] -= t
            else:
                left.append(k)
        if not free or not left:
            break
    return groups


def _open(groups: list[Group], kinds: dict, k: int, p: int, r: int, t: float) -> None:
    """Open a Group(p, r, t, [k]) and enter it in ``kinds`` (per p, per r: loads ascending, group ids)."""
    gid = len(groups)
    groups.append(Group(p, r, t, [k]))
    ks = kinds.setdefault(p, [])
    entry = next((e for e in ks if e[0] == r), None)
    if entry is None:
        entry = (r, [], [])
        ks.append(entry)
        ks.sort(key=_FIRST)
    j = bisect.bisect_right(entry[1], t)
    entry[1].insert(j, t)
    entry[2].insert(j, gid)
