"""Packing for large worlds (from BULK_MIN_RANKS ranks), in numpy: count the groups, then fill them in
longest-first rounds. Same result shape as ``dcp.planner.packing.pack``: ``Group`` values.

The one-by-one best fit would place nearly every micro-batch of such a step in a Python loop (20,000-80,000 at
4096 ranks, ~90 ms). Here, walking the window longest first (the head right after the longest, or first), a
kind (p, r) asks for its j-th group where its running time passes (j - 1) x t_star; groups are granted in that
order while ranks are free and the kind's window time can fill OPEN_FILL of one more (the longest's and the
head's first groups always), then, on ranks still free, the others. The window's longest and then the head go
into their kinds' first groups (``place_first``); ``fill_rounds`` fills the rest.
"""

from __future__ import annotations

import math
import operator
from typing import NamedTuple

import numpy as np

from dcp.planner.epoch import EpochArrays
from dcp.planner.group import Group
from dcp.planner.sorting import SMALL, argsort_float, argsort_int, stable_from
from dcp.planner.tuning import OPEN_FILL

_FIRST = operator.itemgetter(0)
REORDER_SHARE = 8
"""``_rounds`` merges the groups a round moved into its order (``_reorder``) while they are at most 1/REORDER_SHARE
of the groups, else sorts them all again (the same order; 4096 groups of distinct loads: a sort ~50 us, a merge
of 25 ~20 us)."""
REORDER_TIES = 8
"""``_reorder`` gives up where more moved loads than this equal unmoved ones' (each such tie is resolved in Python;
discrete loads, where a sort with ties costs ~100 us): the rest of that packing then sorts."""


def pack_rounds(ep: EpochArrays, order: np.ndarray, t_star: float, head: int, head_first: bool,
                defer_head: bool) -> list[Group]:
    """``packing.pack`` for large worlds; ``order``: the window longest first (ties in release order)."""
    limit = t_star * (1 + 1e-9)
    rest = order[order != head]
    if defer_head:  # the head is placed afterwards (``improve.join_head``): it asks for no group here
        order, forced = rest, {0}
    else:  # the head right after the longest (or first): it always gets a group
        at = 0 if head_first or not len(rest) else 1
        order = np.concatenate([rest[:at], [head], rest[at:]])
        forced = {at} if head_first else {0, at}  # window positions whose group always opens
    if not len(order):
        return []
    cols = columns(ep, order)
    g_p, g_r = _grant(ep, order, t_star, forced, cols)
    groups = [Group(p, r, 0.0, []) for p, r in zip(g_p, g_r, strict=True)]
    kinds: dict[int, list[tuple[int, list, list[int]]]] = {}
    index: dict[tuple[int, int], list[int]] = {}
    code = np.asarray(g_p, dtype=np.int64) * (max(g_r, default=0) + 1) + np.asarray(g_r, dtype=np.int64)
    _, at_first = np.unique(code, return_index=True)
    for f in np.sort(at_first).tolist():  # the kinds (p, r) in grant order, each with its groups in grant order
        p, r = g_p[f], g_r[f]
        gids = index[(p, r)] = np.flatnonzero(code == code[f]).tolist()
        kinds.setdefault(p, []).append((r, [], gids))
    # Before the rounds: the window's longest (T* was sized on it) and the head, each into the first group
    # of its own kind with room, else of its p with more recompute; the head first with head_first.
    longest = int(rest[0]) if len(rest) else -1
    first = [head, longest] if head_first else [longest, head]
    for k in first:
        if k < 0 or (k == head and defer_head):
            continue
        if not place_first(ep, groups, index, k, limit) and k == head:
            return [gr for gr in groups if gr.items]  # no group for the head: the caller retries head first
    # the rounds take the rest of the window: its positions but the head's and the longest's
    skip = [i for i in range(min(2, len(order))) if int(order[i]) in (head, longest)]
    fill_rounds(ep, groups, kinds, order, limit, cols, skip)
    return [gr for gr in groups if gr.items]


class Columns(NamedTuple):
    """A packing's micro-batches (by position) as columns: per kind (p, r) its positions, ascending
    (``kind_of``), and the times ``_grant`` read for them."""

    n_r: int
    """One more than the largest r: kind (p, r) has the code p x n_r + r."""
    by_kind: dict[int, np.ndarray]
    """Kind code -> the positions of that kind, ascending."""
    times: dict[int, np.ndarray]
    """Kind code -> ``ep.mb_t`` at its positions (``_grant`` fills it; ``fill_rounds`` reads it again)."""

    def kind_of(self, p: int, r: int) -> np.ndarray | None:
        """Positions of kind (p, r) (None: none)."""
        return self.by_kind.get(p * self.n_r + r) if r < self.n_r else None


def columns(ep: EpochArrays, arr: np.ndarray) -> Columns:
    """``Columns`` of micro-batches ``arr``: one gather of p and r, and one stable sort by kind (radix where
    the codes fit 16 bits) instead of a mask over all of them per kind and pass. An epoch whose seq_groups
    share one primary (p, r) (``ep.settings``) has that kind only: no gather (4096 ranks, the default bench:
    ~3 ms of a packing)."""
    kinds = {(s.sp_size, s.recompute_layers) for s in ep.settings.values()}
    if len(kinds) == 1 and len(arr):
        ((p1, r1),) = kinds
        return Columns(r1 + 1, {p1 * (r1 + 1) + r1: np.arange(len(arr), dtype=np.int64)}, {})
    p, r = ep.mb_p_np[arr], ep.mb_r_np[arr]
    n_r = int(r.max()) + 1 if len(arr) else 1
    kind = p * n_r + r
    counts = np.bincount(kind)
    present = np.flatnonzero(counts)
    if len(present) <= 1:
        return Columns(n_r, {int(kd): np.arange(len(arr), dtype=np.int64) for kd in present.tolist()}, {})
    top = int(present[np.argmax(counts[present])])
    if 10 * int(counts[top]) >= 9 * len(arr):
        # one kind holds >= 90% (text at 4096 ranks: 99% p = 1): its positions by one mask, the others sorted
        is_top = kind == top
        minor = np.flatnonzero(~is_top)
        rest = present[present != top]
        by_kind = _split_by_kind(minor[argsort_int(kind[minor])], rest, counts)
        by_kind[top] = np.flatnonzero(is_top)
        return Columns(n_r, dict(sorted(by_kind.items())), {})
    o = np.argsort(kind.astype(np.int16), kind="stable") if present[-1] < 2**15 else argsort_int(kind)
    return Columns(n_r, _split_by_kind(o, present, counts), {})


def _split_by_kind(o: np.ndarray, present: np.ndarray, counts: np.ndarray) -> dict[int, np.ndarray]:
    """Kind code -> its positions, from ``o``: positions stably sorted by kind, of the kinds ``present``
    (ascending) with ``counts`` each."""
    ends = np.cumsum(counts[present]).tolist()
    return {kd: o[e - c : e] for kd, c, e in zip(present.tolist(), counts[present].tolist(), ends, strict=True)}


def _grant(ep: EpochArrays, order: np.ndarray, t_star: float, forced: set[int],
           cols: Columns) -> tuple[list[int], list[int]]:
    """The p and r of every group the step gets, in grant order: each kind asks for its j-th group where its
    running window time passes (j - 1) x t_star; the asks that the kind can fill to OPEN_FILL (and the forced
    window positions) first while ranks are free, then the others on ranks still free.

    The asks are numpy columns, not a list of tuples: at 4096 ranks a step makes ~4000 asks per packing and
    packs several times; tuples would be that many more objects for the cyclic garbage collector to track."""
    W = ep.world_size
    asked: list[tuple[np.ndarray, int, int, np.ndarray]] = []
    """Per kind: (window positions where it asks for its groups, p, r, whether each may open in the first pass)"""
    for kd, sel in sorted(cols.by_kind.items()):  # the kinds present, ascending; their positions ascending
        p, r = divmod(kd, cols.n_r)
        t = cols.times[kd] = ep.mb_t[order if len(sel) == len(order) else order[sel]]  # (all: sel is every one)
        cw = np.cumsum(t)
        total = float(cw[-1])
        n_full = min(W // p, int(total / t_star + (1 - OPEN_FILL)))  # the last one filled >= OPEN_FILL
        n_all = min(W // p, math.ceil(total / t_star - 1e-9))
        asks = sel[np.minimum(np.searchsorted(cw, np.arange(n_all) * t_star, "right"), len(sel) - 1)]
        asked.append((asks, p, r, np.arange(n_all) < n_full))
    xs = np.concatenate([c[0] for c in asked])
    ps = np.concatenate([np.full(len(c[0]), c[1], dtype=np.int64) for c in asked])
    rs = np.concatenate([np.full(len(c[0]), c[2], dtype=np.int64) for c in asked])
    fulls = np.concatenate([c[3] for c in asked])
    srt = _by_ask(xs, ps, rs, fulls)
    return _take(xs[srt], ps[srt], rs[srt], fulls[srt], forced, W)


def _take(xs: np.ndarray, ps: np.ndarray, rs: np.ndarray, fulls: np.ndarray, forced: set[int],
          world_size: int) -> tuple[list[int], list[int]]:
    """``_grant``'s asks in grant order (window position, p, r, may open in the first pass) -> the p and r of
    the groups granted: in the first pass the fillable and forced asks while their ranks are free (the others
    with p <= the ranks then free wait), then the waiting ones on ranks still free."""
    first = fulls | np.isin(xs, list(forced))
    # Until an ask of the first pass finds too few ranks free, each of them takes its ranks and each other one
    # with p <= the ranks then free waits: that prefix at once (4096 asks at 4096 ranks), the rest ask by ask.
    cum = np.cumsum(np.where(first, ps, 0))
    over = np.flatnonzero(first & (cum >= world_size))
    end = int(over[0]) if over.size else len(xs)
    took = np.flatnonzero(first[:end])
    waits = np.flatnonzero(~first[:end] & (ps[:end] <= world_size - cum[:end]))
    gp, gr, sp, sr = ps[took].tolist(), rs[took].tolist(), ps[waits].tolist(), rs[waits].tolist()
    free = world_size - (int(cum[end - 1]) if end else 0)
    for x, p, r, full in zip(xs[end:].tolist(), ps[end:].tolist(), rs[end:].tolist(), fulls[end:].tolist(),
                             strict=True):
        if p > free:
            continue
        if full or x in forced:
            gp.append(p)
            gr.append(r)
            free -= p
            if not free:
                break
        else:
            sp.append(p)
            sr.append(r)
    for p, r in zip(sp, sr, strict=True):  # ranks still free: the groups the window cannot fill, too
        if p <= free:
            gp.append(p)
            gr.append(r)
            free -= p
    return gp, gr


def _by_ask(xs: np.ndarray, ps: np.ndarray, rs: np.ndarray, fulls: np.ndarray) -> np.ndarray:
    """The asks' order by (position, p, r, full), as tuples would sort: one integer key, ``np.lexsort``'s order."""
    if len(xs) < 2:
        return np.arange(len(xs))
    n_p, n_r = int(ps.max()) + 1, int(rs.max()) + 1
    if (int(xs.max()) + 1) * n_p * n_r * 2 * len(xs) >= 2**62:
        return np.lexsort((fulls, rs, ps, xs))
    return argsort_int(((xs * n_p + ps) * n_r + rs) * 2 + fulls)


def place_first(ep: EpochArrays, groups: list[Group], index: dict[tuple[int, int], list[int]], k: int,
                limit: float) -> bool:
    """Put micro-batch k into the first group (in grant order) of its own (p, r) with room for it, else of
    its p at another r (ascending; it runs its own r there, at its own time); False when none has room."""
    p_k, r_k = ep.mb_p[k], ep.mb_r[k]
    for key in sorted((key for key in index if key[0] == p_k), key=lambda q: (q[1] != r_k, q[1])):
        for g in index[key]:
            t = ep.time_at[key[1]][k]
            if groups[g].load + t <= limit:
                groups[g].load += t
                groups[g].items.append(k)
                return True
    return False


def fill_rounds(ep: EpochArrays, groups: list[Group], kinds: dict, items, limit: float, cols: Columns | None = None,
                skip: list[int] = ()) -> None:
    """Longest-first filling of the groups in vectorised rounds.

    Per (p, r) kind: the window's remaining micro-batches of exactly that kind, longest first, in rounds
    of one per group: the i-th longest of the round goes to the group with the i-th most room if it fits
    (LPT's choice, made for a whole round at once). Then, in the same way, what is left of the same p at
    other recompute depths (each runs its own r, ``StepPlan.mb_recompute_layers``): a kind's own work first,
    so a group of more recompute never takes the work its own kind's groups were granted for. What does
    not fit stays for later steps. Reads only ``ep.mb_p_np``, ``ep.mb_r_np`` and ``ep.time_at_np``.
    ``cols``: the items' ``columns`` (made here when None); ``skip``: item positions that take no part.
    """
    arr = np.asarray(items, dtype=np.int64)
    cols = columns(ep, arr) if cols is None else cols
    free_item = np.ones(len(arr), dtype=bool)
    free_item[list(skip)] = False
    passes = [(exact, p, r, gids) for exact in (True, False) for p, entries in kinds.items()
              for r, _, gids in sorted(entries, key=_FIRST, reverse=True)]
    for exact, p, r, gids in passes:
        kd = p * cols.n_r + r
        if exact and r < cols.n_r and kd in cols.times and ep.time_at_np[r] is ep.mb_t:  # _grant's times
            sel = cols.by_kind[kd]
            free = free_item[sel]
            sel, tt = sel[free], cols.times[kd][free]
        else:
            sel = _free_of(cols, free_item, p, r, exact)
            tt = None if sel is None else ep.time_at_np[r][arr[sel]]
        if sel is None or not sel.size or not gids:
            continue
        if not bool(np.all(tt[:-1] >= tt[1:])):  # (a kind's own items come longest first: nothing to sort)
            srt = argsort_float(-tt)
            sel, tt = sel[srt], tt[srt]
        dest, loads = _rounds(np.asarray([groups[g].load for g in gids]), tt, limit)
        got = np.flatnonzero(dest >= 0)
        if not got.size:
            continue
        free_item[sel[got]] = False
        by = got[argsort_int(dest[got])]
        d = dest[by]
        cuts = (np.flatnonzero(np.diff(d)) + 1).tolist()
        flat = arr[sel[by]].tolist()
        got_g = d[[0, *cuts]]  # the groups (places in gids) that took items; the others' loads are as they were
        for a, e, g, load in zip([0, *cuts], [*cuts, len(flat)], np.asarray(gids, dtype=np.int64)[got_g].tolist(),
                                 loads[got_g].tolist(), strict=True):
            gr = groups[g]
            gr.items.extend(flat[a:e])
            gr.load = load


def _free_of(cols: Columns, free_item: np.ndarray, p: int, r: int, exact: bool) -> np.ndarray | None:
    """Positions (ascending) of the free items of kind (p, r), or (not ``exact``) of p at another r."""
    if exact:
        sel = cols.kind_of(p, r)
    else:
        parts = [s for r2 in range(cols.n_r) if r2 != r and (s := cols.kind_of(p, r2)) is not None]
        sel = None if not parts else parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
    return None if sel is None else sel[free_item[sel]]


def _rounds(loads: np.ndarray, tt: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Rounds of one item per group over items of times ``tt`` (longest first): the i-th of a round goes to
    the group with the i-th least load when it fits ``limit``. Returns each item's group position (-1: none)
    and the loads after."""
    n, G, pos = len(tt), len(loads), 0
    dest = np.full(n, -1, dtype=np.int64)
    order = _least_loaded(loads, G)  # every group, least loaded first (ties in group order), kept round by round
    merge = True
    while pos < n:
        m = min(G, n - pos)
        tgt = order[:m]
        new = loads[tgt] + tt[pos : pos + m]
        ok = new <= limit
        moved = tgt
        if ok.all():  # (most rounds: no mask to apply)
            loads[tgt] = new
            dest[pos : pos + m] = tgt
        elif ok.any():
            moved = tgt[ok]
            loads[moved] = new[ok]
            dest[pos : pos + m][ok] = moved
        else:
            moved = tgt[:0]
        pos += m
        if limit - loads.min() < tt[-1]:
            break  # no group has room for even the shortest left
        if moved.size:  # (after a merge gave up on ties, ties are likely again: a sort at once)
            merged = _reorder(loads, order, moved) if merge and REORDER_SHARE * len(moved) <= G else None
            merge = merge and (merged is not None or REORDER_SHARE * len(moved) > G)
            order = _least_loaded(loads, G) if merged is None else merged
    return dest, loads


def _reorder(loads: np.ndarray, order: np.ndarray, moved: np.ndarray) -> np.ndarray | None:
    """``_least_loaded(loads, len(loads))`` from ``order``, that order before the loads of the groups ``moved``
    grew: the others keep their order and the moved ones are merged in by (load, group), as the stable sort
    orders them (a round moves ~25 of 4096 groups late in a packing: no sort of all of them per round). None
    where more than REORDER_TIES moved loads equal unmoved ones (the caller sorts)."""
    gone = np.zeros(len(loads), dtype=bool)
    gone[moved] = True
    rest = order[~gone[order]]
    moved = moved[np.lexsort((moved, loads[moved]))]
    ml, rl = loads[moved], loads[rest]
    at = np.searchsorted(rl, ml, "left")
    hi = np.searchsorted(rl, ml, "right")
    tied = np.flatnonzero(hi > at)
    if len(tied) > REORDER_TIES:
        return None
    for i in tied.tolist():  # a load equal to others': after those of a lower group index
        at[i] += int(np.searchsorted(rest[at[i] : hi[i]], moved[i]))
    out = np.empty(len(order), dtype=order.dtype)
    at += np.arange(len(moved))  # (``at`` ascends: the moved ones' places in the merged order)
    out[at] = moved
    keep = np.ones(len(order), dtype=bool)
    keep[at] = False
    out[keep] = rest
    return out


def _least_loaded(loads: np.ndarray, m: int) -> np.ndarray:
    """The m least loaded groups, ties in group order (``argsort_float(loads)[:m]`` without its test for sorted
    loads, which a round's loads rarely are): numpy's own sort, and the tie-breaking one only where two loads
    are equal."""
    if len(loads) < SMALL:
        return np.argsort(loads, kind="stable")[:m]
    return stable_from(loads, np.argsort(loads))[:m]
