"""Step 4 of a DCP step: placement of the packed groups on ranks, fillers for free ranks, and the StepPlan.

Placement is ``placement.place_largest_first`` (aligned inside a node unless p exceeds one). Free ranks are
filled with smaller-p settings of left-over window micro-batches (``_filler``); idle one-rank groups stand for
what nothing fills. Micro-batches not taken stay for later steps. Building marks the step's micro-batches
consumed in the ``EpochProgress``.
"""

from __future__ import annotations

import itertools

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.group import Group, held_tokens
from dcp.planner.improve import left_over
from dcp.planner.intra import Setting
from dcp.planner.placement import place_largest_first
from dcp.planner.plan import MicroBatch, StepPlan
from dcp.planner.sorting import argsort_int
from dcp.planner.tokens import token_runs


def place_and_build(ep: EpochArrays, prog: EpochProgress, step: int, head: int, win: np.ndarray,
                    groups: list[Group], t_star: float, head_t: tuple[int, float] | None,
                    joined: dict[int, float] | None = None, longest_last: bool = False,
                    tokens: tuple[np.ndarray, float] | None = None) -> StepPlan:
    """Place ``groups`` (the head's first among equal p), fill free ranks and build the step's plan.
    ``head_t``: (group, the head's time there) when the head joined a group of another p or r; ``joined``:
    other micro-batches that did so (the epoch's last step at a global batch), with their times there;
    ``longest_last``: every group runs its longest micro-batch last (``_longest_last``); ``tokens``: (every
    micro-batch's tokens, the most the step may hold) at a global batch, which bounds the fillers too."""
    placed, firsts, free = placed_groups(ep, groups, head)
    if len(placed) < len(groups):
        t_star = _cap_to_gmax(ep, placed, head, t_star)
    fillers: list[tuple[int, Setting, list[int]]] = []
    idle: list[int] = []
    if free:
        if tokens is not None:  # what the fillers may add: the step's most, less what the placed groups hold
            tokens = (tokens[0], tokens[1] - held_tokens(placed, tokens[0]))
        _fill_free(ep, left_over(prog, win, placed), placed, free, t_star, fillers, idle, tokens)
    return _build(ep, prog, step, firsts, placed, fillers, idle, head, head_t, joined or {}, longest_last)


def placed_groups(ep: EpochArrays, groups: list[Group], head: int) -> tuple[list[Group], list[int], list[tuple[int, int]]]:
    """(the groups placement keeps, their first ranks, the free rank segments): by p descending, the head's
    group first among equal p, then packing order; when alignment leaves no slot for the head's group, the
    larger groups are dropped."""
    W, rpn = ep.world_size, ep.ranks_per_node
    has_head = _has_head(groups, head)
    # by p descending, the head's group first among equal p, then packing order (numpy: no key tuples)
    order = np.lexsort((np.arange(len(groups)), ~np.asarray(has_head, dtype=bool),
                        -np.fromiter((gr.p for gr in groups), dtype=np.int64, count=len(groups)))).tolist()
    starts, free = place_largest_first([groups[i].p for i in order], W, rpn)
    hi = order.index(has_head.index(True))
    if starts[hi] is None:  # alignment left no slot for the head's group: drop the larger groups
        p_h = groups[order[hi]].p
        order = [i for i in order if groups[i].p <= p_h]
        order.sort(key=lambda i: (-groups[i].p, not has_head[i], i))
        starts, free = place_largest_first([groups[i].p for i in order], W, rpn)
    # the placed groups and their first ranks, as two lists (not a tuple per group for the collector)
    placed = [groups[i] for i, st in zip(order, starts, strict=True) if st is not None]
    firsts = [st for st in starts if st is not None]
    return placed, firsts, free


def _has_head(groups: list[Group], head: int) -> list[bool]:
    """Per group: whether it holds the head. The head is in one group at most: a search that stops there, not a
    scan of every group's micro-batches (~10^5 at 4096 ranks)."""
    has = [False] * len(groups)
    i = next((i for i, gr in enumerate(groups) if head in gr.items), None)
    if i is not None:
        has[i] = True
    return has


def _fill_free(ep: EpochArrays, left: np.ndarray, placed: list, free: list[tuple[int, int]], t_star: float,
               fillers: list, idle: list[int], tokens: tuple[np.ndarray, float] | None = None) -> None:
    """Fill free segments with window micro-batches not yet taken (``left``, in window order), at a smaller p if
    needed (``fillers``: (first rank, setting, micro-batches)); ranks nothing fills go to ``idle``. ``tokens``:
    (every micro-batch's tokens, the tokens the fillers may add): a filler's micro-batches past that stay in the
    stream (once a t1d-short step at 32 x H200 holding a 447k-token sample took 1.32x its global batch so)."""
    rpn = ep.ranks_per_node
    rest = _by_seq_group(ep, left)
    # A filler runs on ranks that would idle: up to the step's time (its longest placed group), never
    # past it. T* is only the target; bounded by it, a filler group once made a t1d-long step at 32 x H200
    # last 38.5 s beside groups of 10.5 s (69% idle).
    fill_to = min(t_star, max((gr.load for gr in placed), default=t_star))
    for a, e in free:
        while a < e:
            pick = _filler(ep, a % rpn, e - a, rest, fill_to)
            if pick is None:
                idle.append(a)
                a += 1
                continue
            s, ks = pick
            if tokens is not None:
                while ks and int(tokens[0][ks].sum()) > tokens[1]:
                    ks.pop()
                if not ks:  # the step holds its tokens: the rest of the free ranks idle
                    idle.extend(range(a, e))
                    break
                tokens = (tokens[0], tokens[1] - int(tokens[0][ks].sum()))
            fillers.append((a, s, ks))
            a += s.sp_size


def _by_seq_group(ep: EpochArrays, left: np.ndarray) -> dict[int, list[int]]:
    """Per seq_group, in the order of their first micro-batch in ``left``: its micro-batches there, the last
    first (pop() from the end yields window order). In numpy: a window holds up to ~10^5 left-overs."""
    if not len(left):
        return {}
    g = ep.mb_group[left]
    o = argsort_int(g)  # stable: window order inside each seq_group
    cut = (np.flatnonzero(np.diff(g[o])) + 1).tolist()
    runs = list(zip([0, *cut], [*cut, len(o)], strict=True))
    runs.sort(key=lambda run: int(o[run[0]]))  # by the window position of each seq_group's first
    return {int(g[o[a]]): left[o[a:e]][::-1].tolist() for a, e in runs}


def _cap_to_gmax(ep: EpochArrays, placed: list, head: int, t_star: float) -> float:
    """The groups dropped for want of aligned ranks may have held the step's longest micro-batch, which
    T* was sized on: keep the paper's Gmax bound for what is left (step time <= Gmax x the longest
    micro-batch it runs) by returning the shortest micro-batches of over-long groups to the stream.
    Returns the step's new target (the fillers' bound too)."""
    longest = max(ep.time_at[gr.r][k] for gr in placed for k in gr.items)
    cap = min(t_star, ep.gmax * longest)
    limit = cap * (1 + 1e-9)
    for gr in placed:
        at_r = ep.time_at[gr.r]
        ks = gr.items
        # the shortest first, never the head
        for k in sorted((k for k in ks if k != head), key=lambda k: at_r[k]):
            if gr.load <= limit:
                break
            ks.remove(k)
            gr.load -= at_r[k]
    return cap


def _filler(ep: EpochArrays, local: int, room: int, rest: dict[int, list[int]], t_star: float):
    """A smaller-p group for a free aligned slot: the earliest left-over window micro-batch with a setting
    whose p fits, then more of its seq_group while the group stays within t_star. None: nothing fits."""
    best_k, best = None, None
    limit = t_star * (1 + 1e-9)
    unit = ep.unit_time
    for g, lst in rest.items():
        if not lst or (best_k is not None and lst[-1] >= best_k):
            continue
        packs = g in ep.mbq.token_budget
        fits = [s for s in ep.options[g] if s.sp_size <= room and local % s.sp_size == 0
                and (_chunks_time(ep, s, lst[-1]) if packs else unit[(g, s.sp_size)]) <= limit]
        if fits:
            best_k, best = lst[-1], max(fits, key=lambda s: (s.tokens_per_gpu_s, s.sp_size))
    if best is None:
        return None
    lst = rest[best.seq_group]
    t_unit = unit[(best.seq_group, best.sp_size)]
    ks = [lst.pop()]
    load = t_unit
    if best.seq_group in ep.mbq.token_budget:  # token packs: their own chunks' times, not a full unit's
        load = _chunks_time(ep, best, ks[0])
        while lst and load + (t := _chunks_time(ep, best, lst[-1])) <= limit:
            ks.append(lst.pop())
            load += t
        return best, ks
    while lst and load + t_unit <= limit:
        ks.append(lst.pop())
        load += t_unit
    return best, ks


def _build(ep: EpochArrays, prog: EpochProgress, step: int, firsts: list[int], placed: list, fillers: list,
           idle: list[int], head: int, head_t: tuple[int, float] | None, joined: dict[int, float],
           longest_last: bool = False) -> StepPlan:
    """The StepPlan's arrays: placed groups in numpy (their micro-batches in release order, or with the longest
    last: ``_longest_last``), then the smaller-p fillers (a few, chunked one by one) and the idle one-rank
    groups."""
    counts = [len(gr.items) for gr in placed]
    kk = np.fromiter(itertools.chain.from_iterable(gr.items for gr in placed), dtype=np.int64,
                     count=sum(counts))
    r_of = np.asarray([gr.r for gr in placed], dtype=np.int64)
    # release order inside each group: one sort of (group, micro-batch) keys, not a lexsort (~10x faster)
    n = ep.num_micro_batches
    gidx = np.repeat(np.arange(len(placed), dtype=np.int64), counts)
    kk = np.sort(gidx * n + kk) - gidx * n
    times = ep.mb_t[kk]  # each at its own r (``epoch._times_at``); other p: overridden below
    if head_t is not None:  # the head joined a group of another p or r (``improve.join_head``): its time there
        times[kk == head] = head_t[1]
    if joined:
        keys = np.fromiter(joined, dtype=np.int64, count=len(joined))
        vals = np.fromiter(joined.values(), dtype=np.float64, count=len(joined))
        o = np.argsort(keys)
        hit = np.isin(kk, keys)
        times[hit] = vals[o][np.searchsorted(keys[o], kk[hit])]
    if longest_last:
        kk, times = _longest_last(kk, times, gidx)
    prog.consumed_np()[kk] = 1
    r_of, mb_r = _own_r(ep, placed, kk, gidx, r_of)
    size = ep.mb_count[kk]
    # the samples of every micro-batch: consecutive runs of the epoch's flat sample arrays
    offset = np.cumsum(size) - size
    pos = np.repeat(ep.mb_flat[kk] - offset, size) + np.arange(int(size.sum()))
    # np.take, not fancy indexing: the same values, ~30% faster for a step's ~10^6 samples
    cols = dict(first=firsts, p=[gr.p for gr in placed], r=r_of.tolist(), ga=counts, t=[times],
                g=[ep.mb_group[kk]], n=[size], ids=[np.take(ep.flat_ids, pos)], lens=[np.take(ep.flat_lens, pos)])
    for st, s, ks in fillers:
        n_mb = _add_filler(ep, prog, cols, st, s, ks, longest_last)
        if mb_r is not None:
            mb_r.append(np.full(n_mb, s.recompute_layers, dtype=np.int64))
    cols["first"].extend(idle)
    cols["p"].extend([1] * len(idle))
    cols["r"].extend([0] * len(idle))
    cols["ga"].extend([0] * len(idle))
    return StepPlan.from_arrays(
        ep.epoch, step, ep.world_size, ep.method, first_rank=cols["first"], sp_size=cols["p"],
        recompute_layers=cols["r"], ga_steps=cols["ga"], mb_time_s=_cat(cols["t"]), mb_seq_group=_cat(cols["g"]),
        mb_size=_cat(cols["n"]), sample_ids=_cat(cols["ids"]), seq_lens=_cat(cols["lens"]),
        mb_recompute_layers=None if mb_r is None else _cat(mb_r), owned=True,
    )


def _longest_last(kk: np.ndarray, times: np.ndarray, gidx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``kk`` and ``times`` (micro-batches grouped by ``gidx``, ascending) with each group's longest micro-batch
    (the first of equal ones) moved to its group's end, the others in their order. The ddp engine all-reduces
    the step's gradients during the backward of every rank's last micro-batch (``dcp.runtime.engines``): the
    longer that backward, the less of the sync is left after it (``dcp.sim.cluster.exposed_sync_s``)."""
    if not len(kk):
        return kk, times
    new_run = np.concatenate([[True], gidx[1:] != gidx[:-1]])
    run = np.cumsum(new_run) - 1
    hit = np.flatnonzero(times == np.maximum.reduceat(times, np.flatnonzero(new_run))[run])
    first = hit[np.unique(run[hit], return_index=True)[1]]
    flag = np.zeros(len(kk), dtype=np.int8)
    flag[first] = 1
    o = np.lexsort((flag, gidx))  # stable: the others keep their order
    return kk[o], times[o]


def _own_r(ep: EpochArrays, placed: list, kk: np.ndarray, gidx: np.ndarray,
           r_of: np.ndarray) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """The r each placed micro-batch runs at (``EpochArrays.own_r``: its primary r at its p, its setting's at
    another p) and the groups' r. Where every one runs its group's r: (``r_of``, None), the plan as without
    per-micro-batch recompute; else the groups' r is the most their micro-batches run at, and the micro-batches'
    r a list of one array (the fillers' are appended)."""
    p_of = np.asarray([gr.p for gr in placed], dtype=np.int64)
    own = ep.mb_r_np[kk]
    other = np.flatnonzero(ep.mb_p_np[kk] != p_of[gidx])
    if other.size:
        own = own.copy()
        own[other] = [ep.own_r(k, p) for k, p in zip(kk[other].tolist(), p_of[gidx[other]].tolist(), strict=True)]
    if np.array_equal(own, r_of[gidx]):
        return r_of, None
    top = r_of.copy()
    top[np.bincount(gidx, minlength=len(placed)) > 0] = 0
    np.maximum.at(top, gidx, own)
    return top, [own]


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    """The parts as one new array (the one part itself when alone: ``_build`` made it for the plan)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _add_filler(ep: EpochArrays, prog: EpochProgress, cols: dict, st: int, s: Setting, ks: list[int],
                longest_last: bool = False) -> int:
    """Append a filler group (first rank st, setting s, primary micro-batches ks) to the plan's columns; with
    ``longest_last``, its longest chunk runs last (``_longest_last``). Returns its micro-batch count."""
    ks.sort()
    for k in ks:
        prog.consumed[k] = 1
    mbs = _chunked(ep, s.seq_group, s, ks)
    if longest_last and len(mbs) > 1:
        mbs.append(mbs.pop(max(range(len(mbs)), key=lambda i: (mbs[i].time_s, -i))))
    cols["first"].append(st)
    cols["p"].append(s.sp_size)
    cols["r"].append(s.recompute_layers)
    cols["ga"].append(len(mbs))
    cols["t"].append(np.asarray([mb.time_s for mb in mbs]))
    cols["g"].append(np.asarray([mb.seq_group for mb in mbs], dtype=np.int64))
    cols["n"].append(np.asarray([len(mb.sample_ids) for mb in mbs], dtype=np.int64))
    cols["ids"].append(np.asarray([i for mb in mbs for i in mb.sample_ids], dtype=np.int64))
    cols["lens"].append(np.asarray([n for mb in mbs for n in mb.seq_lens], dtype=np.int64))
    return len(mbs)


def _chunked(ep: EpochArrays, g: int, s: Setting, ks: list[int]) -> list[MicroBatch]:
    """Micro-batches of a smaller-p filler group: each primary micro-batch split into chunks of its b (a token
    pack: into packs of at most s's b x bound tokens, priced from their real lengths at s's row)."""
    mbq = ep.mbq
    ids, lens = mbq.ids_list[g], mbq.lens_list[g]
    out = []
    for k in ks:
        for lo, hi, t in _chunks(ep, s, k):
            out.append(MicroBatch(ids[lo:hi], lens[lo:hi], g, t))
    return out


def _chunks(ep: EpochArrays, s: Setting, k: int) -> list[tuple[int, int, float]]:
    """(start, end, time) of the chunks that run micro-batch k with setting s (see ``_chunked``)."""
    mbq, g = ep.mbq, s.seq_group
    a, e = mbq.start[k], ep.mb_end[k]
    if g not in mbq.token_budget:
        chunk = ep.chunk(s)
        lens = mbq.seq_lens[g]
        return [(lo, min(e, lo + chunk),
                 ep.times.lengths_time_s(g, s.sp_size, s.recompute_layers, lens[lo:min(e, lo + chunk)].tolist()))
                for lo in range(a, e, chunk)]
    lens = mbq.seq_lens[g][a:e].astype(np.float64)
    starts = token_runs(lens.astype(np.int64), s.micro_batch_size * s.seq_len)
    t = ep.times.lengths_times_s(g, s.sp_size, s.recompute_layers, s.micro_batch_size,
                                 np.add.reduceat(lens, starts), np.add.reduceat(lens * lens, starts))
    ends = [*starts[1:].tolist(), e - a]
    return [(a + lo, a + hi, float(ti)) for lo, hi, ti in zip(starts.tolist(), ends, t.tolist(), strict=True)]


def _chunks_time(ep: EpochArrays, s: Setting, k: int) -> float:
    return sum(t for _, _, t in _chunks(ep, s, k))
