"""A DCP step at a global batch, balanced after packing (``dcp.planner.step._token_step``).

At a global batch the step's tokens fix its work, and T* is that work over the world: the packing fills groups
of each micro-batch's primary p up to T*, but the batch rarely holds each kind's work in whole groups. A rare
long sample alone on 16 ranks runs 6 s of a 13.5 s step (t1d-short), or the short kinds overflow their few
groups while a p = 4 group runs a third of the step (t1d-long). Within the step's one layout:

1. **Shed**: every group over a goal time hands micro-batches to groups with room, at that group's p where
   the micro-batch's seq_group has a setting there that holds it (the memory rule of ``join_head``: the same
   p, or a setting at the other p whose b holds its samples), at its own r there whatever the group's (a
   micro-batch runs its own minimal r, ``StepPlan.mb_recompute_layers``), priced from its real lengths. The goal is bisected between the work spread over
   the world and the step's time.
2. **Shrink**: a group far shorter than the step runs at half its p (or less) where its micro-batches fit
   there and stay within the step's time (the long sample at p = 8 with more recompute: 97% of its p = 16
   efficiency on t1d), and the freed ranks open empty groups of the step's busiest kind, which shedding fills
   (else fillers from the window take them, ``dcp.planner.build``).
3. **Split**: the slowest group, holding several micro-batches, gets a second group of its p and r from the
   ranks of the least-loaded groups (not the head's), whose micro-batches are placed anew.
4. **Left-overs**: window micro-batches no group holds join groups with room, while the step holds fewer
   tokens than it wants.

Moves 1-3 keep the step's micro-batches; a new layout is kept when its slowest group finishes clearly earlier,
or as early on fewer ranks, and every group can be placed. Micro-batches whose time changed (moved, or in a
shrunk group) are returned with their new times (``place_and_build``'s joined). Token-packed micro-batches
(advanced.micro_batch_tokens) move only to groups of their own p.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.group import Group, Shed, held_tokens
from dcp.planner.improve import idle, left_over
from dcp.planner.placement import place_largest_first
from dcp.planner.sorting import argsort_float
from dcp.planner.tuning import (
    ADD_TRIES,
    BALANCE_BISECT,
    BALANCE_MIN_GAIN,
    FILL_AHEAD_STEPS,
    IMPROVE_MIN,
    RETRY_IDLE,
    SHRINK_ROUNDS,
    SHRINK_SHARE,
)


class _Times:
    """Time of a micro-batch in a group of (p, r), or None where the memory rule forbids it; cached. The
    micro-batch runs its own r at p (``EpochArrays.own_r``), whatever the group's r."""

    __slots__ = ("ep", "cache")

    def __init__(self, ep: EpochArrays) -> None:
        self.ep = ep
        self.cache: dict[int, dict[int, float | None]] = {}
        """Per p: per micro-batch its time there (a row per group size: no key tuple per look-up)."""

    def row(self, p: int, r: int) -> dict[int, float | None]:
        """The cached times in a group of (p, r) (the same at every r): ``at`` fills it."""
        row = self.cache.get(p)
        if row is None:
            row = self.cache[p] = {}
        return row

    def at(self, k: int, p: int, r: int) -> float | None:
        row = self.row(p, r)
        if k in row:
            return row[k]
        ep = self.ep
        g = ep.mbq.group[k]
        t: float | None = None
        if p == ep.mb_p[k]:
            t = ep.mb_t_list[k]
        elif g not in ep.mbq.token_budget:
            s = ep.by_sp[g].get(p)
            if s is not None and s.micro_batch_size >= int(ep.mb_count[k]):
                lens = ep.mbq.lens_list[g][ep.mbq.start[k] : ep.mb_end[k]]
                t = ep.times.lengths_time_s(g, p, s.recompute_layers, lens)
        row[k] = t
        return t


def balance(ep: EpochArrays, prog: EpochProgress, win: np.ndarray, groups: list[Group], head: int,
            fixed: dict[int, float], tokens: tuple[np.ndarray, float]) -> tuple[list[Group], dict]:
    """``groups`` (``Group`` values) balanced (module docstring), and the times of the micro-batches that
    changed (``fixed``, the times already overridden, e.g. the head's in another group, kept unless moved
    again). Returns ``groups`` and ``fixed`` themselves when nothing shortens the step or frees ranks.
    ``tokens``: (tokens of every micro-batch, the tokens the step wants): left-overs join up to them."""
    t_step = max(gr.load for gr in groups)
    if t_step <= 0 or 1 - sum(gr.p * gr.load for gr in groups) / (ep.world_size * t_step) <= RETRY_IDLE:
        return groups, fixed
    tm = _Times(ep)
    cur = Shed(t_step, groups, fixed)
    out = _bisect(ep, tm, groups, fixed, [], head)
    if out is not None and _better(ep, out, cur):
        cur = out
    layout = (groups, fixed)  # the layout before shedding that ``cur`` came from
    for _ in range(SHRINK_ROUNDS):
        free = ep.world_size - sum(gr.p for gr in layout[0] if gr.items)
        best, best_layout = cur, None
        for cand, times, orphans in [*_shrunk(ep, tm, *layout, t_step, free),
                                     *_split(ep, layout[0], head, layout[1], free)]:
            out = _bisect(ep, tm, cand, times, orphans, head)
            if out is not None and _better(ep, out, best):
                # (a split's orphans are only placed in its shed result: later rounds start from that)
                best_layout = (_copy([gr for gr in (out.groups if orphans else cand) if gr.items]),
                               out.fixed if orphans else times)
                best = out
        if best_layout is None:
            break
        cur, layout = best, best_layout
    groups, fixed = cur.groups, dict(cur.fixed)
    mb_tok, want = tokens
    held = held_tokens(groups, mb_tok)
    if held < want:
        _add_left(ep, tm, prog, win, groups, fixed, (mb_tok, want - held))
    return groups, fixed


def fill_ahead(ep: EpochArrays, prog: EpochProgress, packed: tuple[np.ndarray, list[Group], dict | None],
               mb_tok: np.ndarray, room: tuple[float, float]) -> dict | None:
    """The chosen packing (window, groups, ``place_and_build``'s joined) of a step still idling more than
    RETRY_IDLE, in an epoch with token-packed seq_groups and at least FILL_AHEAD_STEPS x target tokens left after
    the wanted ones (``room[1]``, in targets: the last steps, planned together, keep theirs): window left-overs
    join its groups with room (``_add_left``) while the step holds at most ``room[0]`` tokens (``mb_tok``: of
    every micro-batch; the caller's: the epoch's running total at most TOKEN_LAG ahead of step x target).
    Returns joined with their times, or joined itself when nothing joins. Text at 32 H200, seed 0: a 123k-token
    document alone on 8 ranks leaves a p = 8 group 0.57 s short, which two p = 4 micro-batches fill (0.9673 ->
    0.9728 of the ideal bound). Without token packs (t1d's coarse micro-batches) the tokens taken ahead starved
    later steps (t1d-balanced 0.977 -> 0.964: its seeds were not measured with this gate off)."""
    (win, groups, joined), (most, after) = packed, room
    if not ep.mbq.token_budget or after < FILL_AHEAD_STEPS:
        return joined
    held = held_tokens(groups, mb_tok)
    if held >= most or max(gr.load for gr in groups) <= 0 or idle(groups, ep.world_size) <= RETRY_IDLE:
        return joined
    fixed = dict(joined or {})
    _add_left(ep, _Times(ep), prog, win, groups, fixed, (mb_tok, most - held))
    return fixed


def _add_left(ep: EpochArrays, tm: _Times, prog: EpochProgress, win: np.ndarray, groups: list[Group],
              fixed: dict, room_tokens: tuple[np.ndarray, float]) -> None:
    """Window micro-batches no group holds join groups with room to the step's time, at the group's p and r
    where the memory rule allows (a group of another p: its seq_group's setting there), while the step holds
    fewer tokens than it wants (``room_tokens``: tokens of every micro-batch, the tokens still wanted): the
    emptiest groups first, each taking the longest that fits (at most ADD_TRIES tried per group)."""
    mb_tok, room_tok = room_tokens
    t_step = max(gr.load for gr in groups)
    rest = left_over(prog, win, [gr for gr in groups if gr.items])
    if not rest.size:
        return
    rest = rest[argsort_float(-ep.mb_work[rest])]
    work, p_rest, tok_rest = ep.mb_work[rest], ep.mb_p_np[rest], mb_tok[rest]
    taken = np.zeros(len(rest), dtype=bool)
    for gr in sorted((gr for gr in groups if gr.items), key=lambda gr: gr.load):
        room = t_step - gr.load
        if room <= IMPROVE_MIN * t_step:
            break
        # candidates: a micro-batch's time at p is about its work over p (perfect scaling, the filter)
        cand = np.flatnonzero(~taken & (p_rest <= gr.p) & (work <= room * gr.p * (1 + 1e-9))
                              & (tok_rest <= room_tok))
        for n in cand[:ADD_TRIES].tolist():
            k = int(rest[n])
            t = tm.at(k, gr.p, gr.r)
            if t is not None and gr.load + t <= t_step * (1 + 1e-9) and tok_rest[n] <= room_tok:
                room_tok -= tok_rest[n]
                gr.load += t
                gr.items.append(k)
                fixed[k] = t
                taken[n] = True


def _better(ep: EpochArrays, a: Shed, b: Shed) -> bool:
    """Whether balanced step ``a`` beats ``b``: clearly shorter, or as long on fewer ranks
    (the freed ones take fillers from the window: same time, more tokens)."""
    sizes = sorted((gr.p for gr in a.groups if gr.items), reverse=True)
    if sum(sizes) > ep.world_size or None in place_largest_first(sizes, ep.world_size, ep.ranks_per_node)[0]:
        return False  # placement would drop a group (a world that is no power of two)
    if a.time < b.time * (1 - BALANCE_MIN_GAIN):
        return True
    return (a.time <= b.time * (1 + 1e-9)
            and sum(gr.p for gr in a.groups if gr.items) < sum(gr.p for gr in b.groups if gr.items))


def _copy(groups: list[Group]) -> list[Group]:
    return [gr.copy() for gr in groups]


def _bisect(ep: EpochArrays, tm: _Times, groups: list[Group], fixed: dict, orphans: list[tuple[float, int]],
            head: int) -> Shed | None:
    """The balanced step at the shortest shed goal bisection finds, no later than the groups' own
    time; None when the ``orphans`` ((time, micro-batch) of removed groups, placed first) fit nowhere."""
    hi = max(gr.load for gr in groups)
    opts: dict[int, list] = {}  # per micro-batch: the kinds of this layout it may run at, least GPU-time first
    best = _shed(tm, opts, _copy(groups), dict(fixed), orphans, head, hi)
    if best is None:
        return None
    lo = max(sum(gr.p * gr.load for gr in best.groups) / ep.world_size,
             max((gr.load for gr in best.groups if len(gr.items) == 1), default=0.0))
    hi = best.time
    for _ in range(BALANCE_BISECT):
        if hi - lo <= 1e-3 * hi:
            break
        goal = (lo + hi) / 2
        out = _shed(tm, opts, _copy(groups), dict(fixed), orphans, head, goal)
        if out is None:
            lo = goal
        else:
            best, hi = out, out.time
    return best


def _own(tm: _Times, src: Group, fixed: dict, head: int) -> list[tuple[float, int]]:
    """(time, micro-batch) of group ``src``'s micro-batches but the head, ascending: ``fixed``'s time where it
    has one, else the time at the group's (p, r)."""
    p, r = src.p, src.r
    row = tm.row(p, r)
    out = []
    for k in src.items:
        if k == head:
            continue
        t = fixed.get(k)
        if t is None:
            t = row[k] if k in row else tm.at(k, p, r)
        out.append((t, k))
    out.sort()
    return out


def _shed(tm: _Times, opts: dict, groups: list[Group], fixed: dict, orphans: list[tuple[float, int]], head: int,
          goal: float) -> Shed | None:
    """Place the ``orphans`` (longest first), then move micro-batches out of every group over ``goal`` into
    groups with room; None when one has no room or some group stays over it. Per group: the shortest
    micro-batch that removes the excess alone, else the longest that moves, until it is under the goal."""
    limit = goal * (1 + 1e-9)
    kinds: dict[tuple[int, int], list[int]] = {}
    for j, gr in enumerate(groups):
        kinds.setdefault((gr.p, gr.r), []).append(j)
    lay = _Layout(groups, kinds)
    for _, k in orphans:
        j, t = _target(tm, opts, lay, -1, k, limit)
        if j is None:
            return None
        lay.add(j, k, t)
        fixed[k] = t
    for i in sorted(range(len(groups)), key=lambda i: -groups[i].load):
        src = groups[i]
        if src.load <= limit:
            break
        own = _own(tm, src, fixed, head)
        while src.load > limit:
            a = bisect.bisect_left(own, (src.load - goal, -1))
            pick = None
            for n in itertools.chain(range(a, len(own)), range(min(a, len(own)) - 1, -1, -1)):
                j, t = _target(tm, opts, lay, i, own[n][1], limit)
                if j is not None:
                    pick = (n, j, t)
                    break
            if pick is None:
                return None
            n, j, t = pick
            t_k, k = own.pop(n)
            lay.take(i, k, t_k)
            lay.add(j, k, t)
            fixed[k] = t
    return Shed(max(gr.load for gr in groups), groups, fixed)


class _Layout:
    """``_shed``'s groups with their loads also in numpy, per kind (p, r) its groups' indices: at 4096 ranks a
    kind holds thousands of groups, and a micro-batch's target is the fullest with room among them."""

    __slots__ = ("groups", "kinds", "loads", "index", "least")

    def __init__(self, groups: list[Group], kinds: dict[tuple[int, int], list[int]]) -> None:
        self.groups, self.kinds = groups, kinds
        self.loads = np.fromiter((gr.load for gr in groups), dtype=np.float64, count=len(groups))
        self.index = {kind: np.asarray(js, dtype=np.int64) for kind, js in kinds.items() if len(js) > _SCAN_MAX}
        self.least: dict[tuple[int, int], float] = {}
        """Per kind: its groups' least load, dropped when one of them changes (most searches find no room)."""

    def add(self, j: int, k: int, t: float) -> None:
        """Micro-batch k joins group j, taking t there."""
        gr = self.groups[j]
        gr.load += t
        gr.items.append(k)
        self.loads[j] = gr.load
        self.least.pop((gr.p, gr.r), None)

    def take(self, j: int, k: int, t: float) -> None:
        """Micro-batch k, taking t there, leaves group j."""
        gr = self.groups[j]
        gr.load -= t
        gr.items.remove(k)
        self.loads[j] = gr.load
        self.least.pop((gr.p, gr.r), None)

    def fullest(self, kind: tuple[int, int], i: int, t: float, limit: float) -> int | None:
        """The kind's group (not i) of the most load that has room for t within limit (ties: the first)."""
        idx = self.index.get(kind)
        least = self.least.get(kind)
        if least is None:
            least = self.least[kind] = (float(self.loads[idx].min()) if idx is not None
                                        else min(self.groups[j].load for j in self.kinds[kind]))
        if least + t > limit:  # (a sum rounds monotonically: no group of the kind has room)
            return None
        if idx is None:
            best, best_load, groups = None, -1.0, self.groups
            for j in self.kinds[kind]:
                load = groups[j].load
                if j != i and load + t <= limit and load > best_load:
                    best, best_load = j, load
            return best
        ld = self.loads[idx]
        ok = (ld + t <= limit) & (ld > -1.0) & (idx != i)
        return int(idx[int(np.argmax(np.where(ok, ld, -np.inf)))]) if ok.any() else None


_SCAN_MAX = 32
"""A kind of at most this many groups is searched in a Python loop, a larger one in numpy."""


def _target(tm: _Times, opts: dict, lay: _Layout, i: int, k: int, limit: float) -> tuple[int | None, float]:
    """The group (not ``i``) where micro-batch k fits within ``limit``: of the kind (p, r) where it takes the
    least GPU-time, the fullest that has room. ``opts``: the kinds' order per micro-batch, filled here."""
    mine = opts.get(k)
    if mine is None:
        mine = []
        for kind in lay.kinds:
            t = tm.at(k, *kind)
            if t is not None:
                mine.append((kind[0] * t, t, kind))
        mine.sort(key=lambda o: o[0])
        opts[k] = mine
    for _, t, kind in mine:
        best = lay.fullest(kind, i, t, limit)
        if best is not None:
            return best, t
    return None, 0.0


def _shrunk(ep: EpochArrays, tm: _Times, groups: list[Group], fixed: dict, t_step: float,
            free: int) -> list[tuple[list[Group], dict, list]]:
    """Layouts with one short group (at most SHRINK_SHARE of the step) at half its p, where all its
    micro-batches fit there within the step's time; the freed ranks (and those free before) hold empty groups
    of the busiest group's p and r where they have room for one (else fillers take them)."""
    out = []
    busiest = max(groups, key=lambda gr: gr.load)
    for i, gr in enumerate(groups):
        p, load, ks = gr.p, gr.load, gr.items
        if p == 1 or not ks or load > SHRINK_SHARE * t_step or gr is busiest:
            continue
        q = p // 2
        while q >= 1 and (new := _at_size(ep, tm, ks, q, t_step)) is not None:
            r, ts = new
            cand = _copy(groups)
            cand[i] = Group(q, r, sum(ts), list(ks))
            times = dict(fixed)
            times.update(zip(ks, ts, strict=True))
            cand += [Group(busiest.p, busiest.r, 0.0, []) for _ in range((free + p - q) // busiest.p)]
            out.append((cand, times, []))
            q //= 2
    return out


def _at_size(ep: EpochArrays, tm: _Times, ks: list[int], q: int, t_step: float) -> tuple[int, list[float]] | None:
    """(r, times) of micro-batches ``ks`` in one group of q ranks (r: the most recompute their settings at q
    need), or None when one has no setting there or the group would outlast ``t_step``."""
    r = 0
    for k in ks:
        g = ep.mbq.group[k]
        s = ep.by_sp[g].get(q)
        if s is None or g in ep.mbq.token_budget or s.micro_batch_size < int(ep.mb_count[k]):
            return None
        r = max(r, s.recompute_layers)
    ts = [tm.at(k, q, r) for k in ks]
    if any(t is None for t in ts) or sum(ts) > t_step:
        return None
    return r, ts


def _split(ep: EpochArrays, groups: list[Group], head: int, fixed: dict, free: int) -> list[tuple[list[Group], dict, list]]:
    """The step's slowest group, when it holds more than one micro-batch, gets a second group of its p and r:
    the ranks come from free ones and the groups of least GPU-work (not the head's), whose micro-batches become
    orphans (placed by ``_shed``)."""
    i_b = max(range(len(groups)), key=lambda i: groups[i].load)
    p_b, r_b = groups[i_b].p, groups[i_b].r
    if len(groups[i_b].items) < 2:
        return []
    keep = [True] * len(groups)
    for i in sorted(range(len(groups)), key=lambda i: groups[i].p * groups[i].load):
        if free >= p_b:
            break
        if i != i_b and head not in groups[i].items:
            keep[i] = False
            free += groups[i].p
    if free < p_b:
        return []
    orphans = sorted(((ep.mb_t_list[k], k) for i, gr in enumerate(groups) if not keep[i] for k in gr.items),
                     reverse=True)
    cand = [gr.copy() for i, gr in enumerate(groups) if keep[i]]
    cand.append(Group(p_b, r_b, 0.0, []))
    gone = {k for _, k in orphans}
    return [(cand, {k: t for k, t in fixed.items() if k not in gone}, orphans)]
