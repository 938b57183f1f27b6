"""One DCP step: window and target (``dcp.planner.window``), packing (``packing``), the re-packs that lower its
idle (``improve``, the head joining another group, other targets), then placement and the StepPlan (``build``)."""

from __future__ import annotations

import math

import numpy as np

from dcp.planner.balance import balance, fill_ahead
from dcp.planner.build import place_and_build, placed_groups
from dcp.planner.dense import dense_window
from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.group import Balanced, Budget, Group, Packed, held_tokens
from dcp.planner.improve import idle, idle_floor, improve, join_head, work
from dcp.planner.packing import pack
from dcp.planner.plan import StepPlan
from dcp.planner.step_tokens import (
    TOKEN_TARGETS,
    short_target,
    step_room,
    thin_window,
    token_target,
    window_at,
)
from dcp.planner.tuning import (
    BULK_MIN_RANKS,
    END_STRETCHES,
    HEAD_ALONE,
    LIFT_FILL,
    LOW_STRETCHES,
    RETRY_IDLE,
    RETRY_STRETCH,
    SHORTER_GAIN,
    TOKEN_SLACK,
    WINDOW_WORK_FACTOR,
)
from dcp.planner.window import Scan, scan, target, window


def plan_step(ep: EpochArrays, prog: EpochProgress, step: int, head: int,
              budget: Budget | None = None) -> StepPlan:
    """The StepPlan of step ``step``, whose head (first unconsumed micro-batch) is ``head``. ``budget``: the
    step's share of the global batch when planning.tokens_per_step is set."""
    if budget is not None:
        return _token_step(ep, prog, step, head, budget)
    f = WINDOW_WORK_FACTOR * ep.world_size
    sc = scan(ep, prog, head, lambda t: f * ep.gmax * t)
    t_star, m, j_long = target(ep, sc)
    win = window(sc.idx, m, j_long)
    groups = pack(ep, win, t_star, head)
    if not any(head in gr.items for gr in groups):
        # The longest micro-batch left no ranks for the head (a tiny world): the head goes first, and the
        # step is capped by Gmax x the head's time.
        t_star = min(t_star, ep.gmax * ep.mb_t_list[head])
        groups = pack(ep, win, t_star, head, head_first=True)
    most = max(len(gr.items) for gr in groups)
    if most < ep.gmin:
        # The paper's Gmin: every group runs fewer than gmin micro-batches; scale the step (Gmin wins over Gmax).
        t_star *= math.ceil(ep.gmin / most)
        # the rescan extends the first one (same head, same release order), so j_long still indexes it
        sc = scan(ep, prog, head, lambda t: f * t_star)
        win, groups = _repack_for_gmin(ep, sc, j_long, t_star, head, win, groups)
    improve(ep, prog, win, groups, head)
    best = Packed(groups, idle(groups, ep.world_size), win, None)
    best = _try_head_elsewhere(ep, prog, best, head, t_star)
    if best.idle > RETRY_IDLE and ep.gmin == 1:
        best = _try_targets(ep, prog, best, sc, m, j_long, head, t_star)
    groups, _, win, head_t = best
    prog.scan_hint = len(win)
    return place_and_build(ep, prog, step, head, win, groups, t_star, head_t)


def _repack_for_gmin(ep: EpochArrays, sc: Scan, j_long: int, t_star: float, head: int, win: np.ndarray,
                     groups: list[Group]) -> tuple[np.ndarray, list[Group]]:
    """The Gmin re-pack of the rescanned window at the scaled ``t_star``. The step must take the head: when
    the longer window's longest kind takes the ranks the head needed (a tiny world), the head goes first;
    should even that leave it out, the step keeps its un-re-packed window and groups."""
    f = WINDOW_WORK_FACTOR * ep.world_size
    win_g = window(sc.idx, min(int(np.searchsorted(sc.cumw, f * t_star)), len(sc.idx) - 1) + 1, j_long)
    for head_first in (False, True):
        alt = pack(ep, win_g, t_star, head, head_first=head_first)
        if any(head in gr.items for gr in alt):
            return win_g, alt
    return win, groups


def _try_head_elsewhere(ep: EpochArrays, prog: EpochProgress, best: Packed, head: int, t_star: float) -> Packed:
    """The head's own group can take the ranks a second group of the longest kind needed while its kind has
    too little work in the window to fill it (t1d-long: a p = 8 head beside one p = 16 group left the other
    16 ranks a third busy). When the step idles and the head's group is short (``HEAD_ALONE``): pack without
    it, then let it join the fullest group of a p its seq_group can run at (same memory rule, timed there);
    keep the less idle packing."""
    groups, cur, win, _ = best
    hg = next((gr for gr in groups if head in gr.items), None)
    if not (cur > RETRY_IDLE and len(win) > 1 and hg is not None
            and hg.load < HEAD_ALONE * max(gr.load for gr in groups)):
        return best
    alt = pack(ep, win, t_star, head, defer_head=True)
    head_t = join_head(ep, alt, head, t_star)
    if head_t is None:
        return best
    improve(ep, prog, win, alt, head)
    alt_idle = idle(alt, ep.world_size)
    # and no less work: a step that idles less only by being shorter pays the sync more often
    if (alt_idle < cur - 1e-9 and work(alt) >= work(groups) * (1 - 1e-9)
            and max(len(gr.items) for gr in alt) >= ep.gmin):
        return Packed(alt, alt_idle, win, head_t)
    return best


def _try_targets(ep: EpochArrays, prog: EpochProgress, best: Packed, sc: Scan, m: int, j_long: int, head: int,
                 t_star: float) -> Packed:
    """Discrete micro-batch times can leave every group of a common kind short of T* (five 6.7 s micro-batches
    in a 38.7 s step), the longest kind be too rare for k > 1, or the window hold too little short work beside the
    longest kind's group (t1d-long: p = 4, 2, 1 groups a third busy): pack the multiples k x T_long and slightly
    longer targets too, keep the least idle (ties: the first); t1d-long DCP-intra at 32 H200: 5.0% -> 2.8% idle.
    A target is skipped where 1 - (the window's work) / (W x its longest) idles no less than needed: a packing
    holds at most that work and takes the longest (it opens the first group; ``improve`` only lengthens groups)."""
    f = WINDOW_WORK_FACTOR * ep.world_size
    t_long = float(ep.mb_t[best.win].max())
    tries = [k * t_long for k in range(1, ep.gmax + 1)] + [t_star * (1 + x) for x in RETRY_STRETCH]
    same_t = all(t is ep.mb_t for t in ep.time_at_np.values())  # every micro-batch's time the same at every r
    for t_try in tries:
        if abs(t_try - t_star) <= 1e-9 * t_star:
            continue
        m_try = max(m, min(int(np.searchsorted(sc.cumw, f * t_try)), len(sc.idx) - 1) + 1)
        w_try = window(sc.idx, m_try, j_long)
        longest = float(ep.mb_t[w_try].max())
        if not longest <= t_try * (1 + 1e-9) <= ep.gmax * longest * (1 + 1e-9):
            continue
        gain = SHORTER_GAIN if t_try < t_star else 1e-9
        if same_t and 1 - float(ep.mb_work[w_try].sum()) / (ep.world_size * longest) >= best.idle - gain + 1e-9:
            continue  # no packing of w_try can idle less (the bound in the docstring): skip packing it
        alt = pack(ep, w_try, t_try, head)
        if not any(head in gr.items for gr in alt) or idle_floor(ep, alt) >= best.idle - gain + 1e-9:
            continue  # no head, or even the local search could not make it win
        improve(ep, prog, w_try, alt, head)
        alt_idle = idle(alt, ep.world_size)
        # a shorter step must idle clearly less: it also pays the optimizer step more often
        if alt_idle < best.idle - gain:
            best = Packed(alt, alt_idle, w_try, None)
    return best


def _token_step(ep: EpochArrays, prog: EpochProgress, step: int, head: int,
                budget: Budget) -> StepPlan:
    """A step at the user's global batch (``dcp.planner.step_tokens.token_target``): T* from the release-order
    batch of about the wanted tokens, the window capped in tokens; the same packing, local search and head re-pack
    as any step, balanced (``balance``, ``fill_ahead``), no Gmax bound (the batch decides the step's length), other
    targets only while the tokens stay near the wanted ones (``_other_targets``). A packing below the lower bound
    (``low`` tokens) stretches T* (``_reach_low``); the last step stretches it until it takes all that is left."""
    want, cap, mb_tok, low, target = budget.want, budget.most, budget.mb_tok, budget.fewest, budget.target
    f = WINDOW_WORK_FACTOR * ep.world_size
    per_token = float(ep.mb_work.sum()) / max(1.0, float(mb_tok.sum()))  # GPU-s per token of the epoch
    sc = scan(ep, prog, head, lambda t: f * max(t, want * per_token / ep.world_size))
    left = float(mb_tok[prog.consumed_np() == 0].sum())
    lag = step_room(step, float(mb_tok.sum()) - left, float(mb_tok.sum()), target)  # (TOKEN_LAG's tokens, the room)
    # the epoch's end: what is left, unless it makes two steps (not when the head alone leaves less than the lower
    # bound after it: a long sample that would run alone before a short last step)
    last = left <= min(cap, want + low) or (left <= cap and mb_tok[head] > left - low)
    if last and not sc.all:
        sc = scan(ep, prog, head, lambda t: math.inf)
    if not last and lag[1] < cap and ep.world_size >= BULK_MIN_RANKS:
        # where no other target is tried (``_other_targets``, which keeps a step within ``step_room``'s room), the
        # room is the step's upper bound in every pass (never below its fewest tokens or its head): a packing that
        # takes its whole window (a long T*) would otherwise run the epoch's total ahead until it ends a step
        # early (t1d-long at W = 512: 15 steps of 16, every one at 1.1 x; at W = 1024 a last step at 0.71 x)
        cap = max(lag[1], low, float(mb_tok[head]))
        budget = budget._replace(most=cap)
    # the window may hold a little more than the batch (choice for the packing), never past the cap, nor so far
    # that what is left after it is less than a step's lower bound
    top = min(cap, left - low)
    sizes = (left, left) if last else (want, min(top, TOKEN_SLACK * want))
    t_star, m, j_long = token_target(sc.cumw, ep.mb_t[sc.idx], mb_tok[sc.idx], ep.world_size, *sizes,
                                     WINDOW_WORK_FACTOR)
    if last:  # all that is left, its longest micro-batch included
        m, j_long = len(sc.idx), int(np.argmax(ep.mb_t[sc.idx]))
        t_star = max(t_star, float(ep.mb_t[sc.idx[j_long]]))
    win = window(sc.idx, m, j_long)
    joined = None
    if last:
        t_star, groups, joined = _take_all(ep, win, t_star, head)
    if joined is None:  # (the epoch's last kinds may not share the ranks: then a step like any)
        sized, best, flagged = _first_plan(ep, prog, head, (sc, top), (t_star, win), budget, per_token, last)
        if not last:
            best = _other_targets(ep, prog, head, sc, top, lag, budget, per_token, best)
        t_star, win, groups, head_t, joined = _lift_low(ep, prog, head, sized, budget, per_token, best,
                                                        (flagged, lag[1]))
    elif not joined:  # micro-batches joined at another p keep their groups as they are
        groups, win, head_t = _improve_within(ep, prog, (groups, win, None), head, t_star, mb_tok, (low, cap))
        groups, joined = balance(ep, prog, win, groups, head, {} if head_t is None else {head: head_t[1]},
                                 (mb_tok, want))
        groups = [gr for gr in groups if gr.items]
    else:
        head_t = None
    joined = fill_ahead(ep, prog, (win, groups, joined), mb_tok,
                        (min(cap, lag[1], want + lag[0]), (left - want) / target))
    prog.scan_hint = len(win)
    return place_and_build(ep, prog, step, head, win, groups, t_star, head_t, joined=joined, longest_last=True,
                           tokens=None if last else (mb_tok, cap))


def _first_plan(ep: EpochArrays, prog: EpochProgress, head: int, scanned: tuple[Scan, float],
                sized: tuple[float, np.ndarray], budget: Budget, per_token: float,
                last: bool) -> tuple[tuple[float, np.ndarray], Balanced, bool]:
    """A step's first balanced plan (``_balanced``) and the (T*, window) it came from: ``sized`` (``token_target``'s
    T*, at least the batch's longest micro-batch), or from BULK_MIN_RANKS ranks, where no other target is tried,
    the short target (``step_tokens.short_target``) where that is shorter and its plan holds the bounds; not where
    the look-ahead bound ended the scan (``Scan.capped``): there the micro-batches it lets wait fill the look-ahead
    (t1d-gmin, 24 samples per rank at 1024 ranks: the scan's tokens fell from 3.9x to 0.12x the step's over 12
    steps, and a step held 0.12x)."""
    sc, top = scanned
    short = None
    if not last and ep.world_size >= BULK_MIN_RANKS and not sc.capped:
        short = short_target(sc.cumw, ep.mb_t[sc.idx], budget.mb_tok[sc.idx], ep.world_size, (budget.want, top),
                             sized[0], WINDOW_WORK_FACTOR)
    if short is not None:
        alt = (short[0], window(sc.idx, short[1], short[2]))
        best, flagged = _balanced(ep, prog, head, alt, budget, per_token)
        if not flagged and budget.fewest <= _tokens(ep, best.groups, head, budget.mb_tok) <= budget.most:
            return alt, best, flagged
    return (sized, *_balanced(ep, prog, head, sized, budget, per_token))


def _lift_low(ep: EpochArrays, prog: EpochProgress, head: int, sized: tuple[float, np.ndarray],
              budget: Budget, per_token: float, best: Balanced,
              flag: tuple[bool, float]) -> Balanced:
    """``best``, or, where ``_reach_low``
    flagged the first plan (``flag``: that, the most tokens ``step_room`` gives the step) and ``best`` is still below the
    bound (or far past the wanted tokens while the total is ahead, or past the room), ``sized`` (T*, window)
    packed with its other windows when that is within the bounds."""
    want, cap, mb_tok, low = budget.want, budget.most, budget.mb_tok, budget.fewest
    flagged, room = flag
    if not flagged:
        return best
    tok = _tokens(ep, best.groups, head, mb_tok)  # (far past the wanted tokens only while wanting the lower bound)
    ahead = tok > room
    if low <= tok <= (TOKEN_SLACK * want if want <= low else cap) and not ahead:
        return best
    alt = _balanced(ep, prog, head, sized, budget, per_token, LOW_MODES[1:])[0]
    alt_tok = _tokens(ep, alt.groups, head, mb_tok)
    if not low <= alt_tok <= cap or (tok >= low and alt_tok >= tok):
        return best
    # (a step far past its wanted tokens or the room gives way: to one that fills the ranks as well, or to stay in it)
    fill = [fill_share(ep, placed_groups(ep, b.groups, head)[0]) for b in (best, alt)]
    return alt if tok < low or ahead or fill[1] >= fill[0] - LIFT_FILL else best


def _balanced(ep: EpochArrays, prog: EpochProgress, head: int, sized: tuple[float, np.ndarray],
              budget: Budget, per_token: float,
              modes: tuple[str, ...] = ("plain",)) -> tuple[Balanced, bool]:
    """A step at a global batch packed from window ``sized[1]`` at T* ``sized[0]``: packed with the head
    (``_pack_head``), stretched to the lower bound (``_reach_low``), improved (``_improve_within``) and balanced
    (``balance``). Returns the step and whether ``_reach_low`` left it below the lower bound. ``modes``: ``_reach_low``'s windows."""
    want, cap, mb_tok, low = budget.want, budget.most, budget.mb_tok, budget.fewest
    t_star, win = sized
    groups = _pack_head(ep, win, t_star, head)
    t_star, win, groups, head_t, short = _reach_low(ep, prog, mb_tok, head, (t_star, win, groups),
                                                    (want, cap, per_token), low, modes)
    groups, win, head_t = _improve_within(ep, prog, (groups, win, head_t), head, t_star, mb_tok, (low, cap))
    groups, joined = balance(ep, prog, win, groups, head, {} if head_t is None else {head: head_t[1]},
                             (mb_tok, want))
    return Balanced(t_star, win, [gr for gr in groups if gr.items], head_t, joined), short


def _other_targets(ep: EpochArrays, prog: EpochProgress, head: int, sc: Scan, top: float, lag: tuple[float, float],
                   budget: Budget, per_token: float, best: Balanced) -> Balanced:
    """A balanced step at a global batch that still idles more than RETRY_IDLE (its longest kind's work is not
    a whole number of groups at T*: three 300k-500k-token samples on one 16-rank group of a 32-rank world
    while the other groups end a third earlier) is planned again at other targets ``TOKEN_TARGETS`` x T*,
    each from its own window (``step_tokens.window_at``: its work, at most ``top`` tokens) and from that window
    with its widest kind cut to one group's worth (``step_tokens.thin_window``: the other giants wait for a later
    step rather than queue on one group), then from a dense window (``dense.dense_window``); the plan whose placed
    work at the micro-batches' own settings fills the most of W x its time is kept (``fill_share``), among those
    whose tokens stay within the bounds. ``lag``: ``step_tokens.step_room``'s two."""
    want, cap, mb_tok, low = budget.want, budget.most, budget.mb_tok, budget.fewest
    if ep.world_size >= BULK_MIN_RANKS:
        return best
    lag, room = lag
    placed = placed_groups(ep, best.groups, head)[0]  # placed once per plan: its tokens and its fill from one placement
    share, first = fill_share(ep, placed), held_tokens(placed, mb_tok)
    if 1.0 - share <= RETRY_IDLE and low <= first <= room:
        return best  # (a first plan below the lower bound or past the room: any other plan within them replaces it)
    if not low <= first <= room:
        share = -1.0
    t_all, tok_all = ep.mb_t[sc.idx], mb_tok[sc.idx]
    # tokens near the wanted ones: the epoch's running total stays within TOKEN_LAG x the target's of step x target
    # (``want`` at a bound hides how far the total is off: then no further than the first plan)
    floor = max(low, first if want >= cap else min(first, want - lag))
    ceil = min(cap, first if want <= low else max(first, want + lag), max(room, low))
    for x in TOKEN_TARGETS:
        sized = window_at(sc.cumw, t_all, tok_all, ep.world_size, best.t_star * x, top, WINDOW_WORK_FACTOR)
        if sized is None:
            continue
        t_try, m, j_long = sized
        w_try = window(sc.idx, m, j_long)
        for w in (w_try, thin_window(ep, w_try, t_try, head)):
            if w is None:
                continue
            alt = _balanced(ep, prog, head, (t_try, w), budget, per_token)[0]
            placed = placed_groups(ep, alt.groups, head)[0]
            if not floor <= held_tokens(placed, mb_tok) <= ceil:
                continue
            alt_share = fill_share(ep, placed)
            if alt_share > share + 1e-9:
                best, share = alt, alt_share
    # a long micro-batch's step runs that long whatever it holds: up to want + lag tokens even with ``want`` at low
    most = min(top, max(first, want + lag), max(room, low))
    w = dense_window(ep, prog, head, best.t_star, (want * per_token, most), mb_tok)
    if w is not None:
        alt = _balanced(ep, prog, head, (best.t_star, w), budget, per_token)[0]
        placed = placed_groups(ep, alt.groups, head)[0]
        if floor <= held_tokens(placed, mb_tok) <= most and fill_share(ep, placed) > share + 1e-9:
            best = alt
    return best


def _improve_within(ep: EpochArrays, prog: EpochProgress, packed: tuple, head: int, t_star: float,
                    mb_tok: np.ndarray, bounds: tuple[float, float]) -> tuple:
    """``improve`` and, unless the head already joined another group, ``_try_head_elsewhere`` on ``packed``
    (groups, window, head's (group, time) or None); their swaps trade micro-batches for longer ones, which
    can hold fewer tokens (one long sample for many short ones) or more (a second long sample for short ones):
    when that takes a step that held ``bounds`` (low, high) tokens out of them, the packing before is kept."""
    groups, win, head_t = packed
    before = [gr.copy() for gr in groups]
    improve(ep, prog, win, groups, head)
    if head_t is None:
        groups, _, win, head_t = _try_head_elsewhere(ep, prog, Packed(groups, idle(groups, ep.world_size), win, None),
                                                     head, t_star)
    low, cap = bounds
    if not low <= _tokens(ep, groups, head, mb_tok) <= cap and low <= _tokens(ep, before, head, mb_tok) <= cap:
        return before, packed[1], packed[2]
    return groups, win, head_t


def _take_all(ep: EpochArrays, win: np.ndarray, t_star: float, head: int) -> tuple[float, list[Group], dict | None]:
    """The epoch's last step takes all that is left (``win``): T* stretches by 10% up to END_STRETCHES times
    until the placed groups hold it all; what still has no room (its p has no ranks beside the others) joins
    the fullest group of a larger p its seq_group can run at (``join_head``: its setting there, the memory
    rule), longest first. Should that fail, the same with the head left out of the packing (it then joins
    too). Returns (T*, groups, {micro-batch: its time in the group it joined}), the dict None when some
    micro-batch fits nowhere (the step is then planned like any other)."""
    t0 = t_star
    for defer in (False, True):
        t_star = t0
        for _ in range(END_STRETCHES):
            packed = pack(ep, win, t_star, head, defer_head=True) if defer else _pack_head(ep, win, t_star, head)
            groups = placed_groups(ep, packed, head)[0] if any(head in gr.items for gr in packed) else packed
            taken = {k for gr in groups for k in gr.items}
            if len(taken) >= len(win) or not groups:
                break
            t_star *= 1.1
        if len(taken) >= len(win):
            return t_star, groups, {}
        joined: dict[int, float] = {}
        for k in sorted((k for k in win.tolist() if k not in taken), key=lambda k: -ep.mb_t_list[k]):
            jt = join_head(ep, groups, k, math.inf) if groups else None
            if jt is None:
                break
            joined[k] = jt[1]
        else:
            if any(head in gr.items for gr in groups) and len(placed_groups(ep, groups, head)[0]) == len(groups):
                return max(t_star, max(gr.load for gr in groups)), groups, joined
    return _all_on_widest(ep, win, t0, head)


def _all_on_widest(ep: EpochArrays, win: np.ndarray, t0: float, head: int) -> tuple[float, list[Group], dict | None]:
    """``_take_all``'s last resort: one group of the window's widest micro-batch (largest p), which every other
    joins (``join_head``: its seq_group's setting at that p; a p = 8 kind and p = 1 kinds left at the epoch's
    end cannot share 8 ranks otherwise). The step is then planned like any other where one cannot join."""
    k0 = max(win.tolist(), key=lambda k: (ep.mb_p[k], ep.mb_t_list[k]))
    groups = [Group(ep.mb_p[k0], ep.mb_r[k0], ep.mb_t_list[k0], [k0])]
    joined: dict[int, float] = {}
    for k in sorted((k for k in win.tolist() if k != k0), key=lambda k: -ep.mb_t_list[k]):
        jt = join_head(ep, groups, k, math.inf)
        if jt is None:
            return t0, _pack_head(ep, win, t0, head), None
        joined[k] = jt[1]
    return max(t0, groups[0].load), groups, joined


def _pack_head(ep: EpochArrays, win: np.ndarray, t_star: float, head: int) -> list[Group]:
    """The packing of ``win`` at ``t_star`` that takes the head (the head first when it was left out)."""
    groups = pack(ep, win, t_star, head)
    if not any(head in gr.items for gr in groups):
        groups = pack(ep, win, t_star, head, head_first=True)
    return groups


def _reach_low(ep: EpochArrays, prog: EpochProgress, mb_tok: np.ndarray, head: int, packed: tuple,
               sizes: tuple[float, float, float], low: float, modes: tuple[str, ...]) -> tuple:
    """``packed`` (T*, window, groups) of a step at a global batch whose placed groups hold fewer than ``low``
    tokens (the head's group took all ranks and the window held no more of its kind, the window stopped before
    a longer micro-batch, or the head's kind leaves its p alone on the ranks): for each of ``modes``
    (``_low_stretch``, LOW_MODES) the first packing within ``low`` and the upper bound (``sizes``: tokens
    wanted, the upper bound, GPU-s per token); the first mode's unless it holds more than TOKEN_SLACK x the
    wanted tokens, then the one nearest them. Else ``packed`` (the data allow no such step). Returns (T*,
    window, groups, the head's (group, time) or None, whether ``_lift_low`` should try the other modes)."""
    if _tokens(ep, packed[2], head, mb_tok) >= low:
        return (*packed, None, False)
    want, cap, per_token = sizes
    sc = scan(ep, prog, head, lambda t: WINDOW_WORK_FACTOR * ep.world_size * max(t, 2 * cap * per_token))
    best, best_tok = None, math.inf
    for mode in modes:
        got = _low_stretch(ep, sc, mb_tok, head, (packed[0], mode), (want, cap), low)
        # the first mode's step unless it holds far more than wanted (running ahead of step x target): then
        # the nearest to the wanted tokens
        if got is not None and abs(got[1] - want) < abs(best_tok - want):
            best, best_tok = got
        if best_tok <= TOKEN_SLACK * want:
            break
    # (flagged for ``_lift_low``: no step within the bounds, or one far past the wanted tokens)
    return (*best, best_tok > TOKEN_SLACK * want) if best is not None else (*packed, None, True)


def _low_stretch(ep: EpochArrays, sc: Scan, mb_tok: np.ndarray, head: int, start: tuple[float, str],
                 sizes: tuple[float, float], low: float) -> tuple | None:
    """One of ``_reach_low``'s modes (``start``: the T* it stretches from, the mode): T* grows by 10% at most
    LOW_STRETCHES times, each packed with the head in its own group, else joining another (``_low_pack``);
    ((T*, window, groups, head's (group, time) or None), tokens) of the first within ``low`` and the upper
    bound, else None. Windows: plain (on to twice the upper bound), skip (passing over micro-batches longer than
    T*: they wait for a later step, the running total stays on step x target), jump (T* jumps to the
    micro-batch that stopped the window: the step takes it)."""
    (t_star, mode), (want, cap) = start, sizes
    # (the plain window reaches on to twice the upper bound; the others hold little more than the wanted tokens:
    # the packing takes about all of a window that passed over its long ones)
    reach = 2 * cap if mode == "plain" else min(cap, TOKEN_SLACK * want)
    for _ in range(LOW_STRETCHES):
        t_star *= 1.1
        win, blocked = _low_window(ep, sc, mb_tok, t_star, want, reach, mode == "skip")
        if win is None:
            return None  # (skip: no micro-batch longer than T* in reach, the plain window was this one)
        got = _low_pack(ep, win, t_star, head, mb_tok, (low, cap))
        if got is not None:
            return got
        if mode == "jump" and blocked[0] > t_star:
            # 10% more adds nothing until T* (and the window's tokens) reach the micro-batch that stopped it
            t_star, reach = max(t_star, blocked[0] / 1.1), min(cap, max(reach, blocked[1]))
    return None


LOW_MODES = ("plain", "skip", "jump")
"""``_reach_low``'s windows (``_low_stretch``), in order."""


def _low_window(ep: EpochArrays, sc: Scan, mb_tok: np.ndarray, t_star: float, want: float, cap: float,
                skip: bool) -> tuple[np.ndarray | None, tuple[float, float]]:
    """``_reach_low``'s window at ``t_star`` over the scan ``sc`` (``token_target``: about ``want`` tokens, on to
    ``cap``), and the time of the micro-batch after it and the tokens through that one (0, 0 at the scan's end).
    ``skip``: from the scanned micro-batches no longer than T* (the head always), None when that is all of them."""
    idx, cumw = sc.idx, sc.cumw
    if skip:
        keep = ep.mb_t[idx] <= t_star * (1 + 1e-9)
        keep[0] = True
        if keep.all():
            return None, (0.0, 0.0)
        idx = idx[keep]
        cumw = np.cumsum(ep.mb_work[idx])
    _, m, j_long = token_target(cumw, ep.mb_t[idx], mb_tok[idx], ep.world_size, want, cap, WINDOW_WORK_FACTOR,
                                t_min=t_star)
    if m >= len(idx):
        return window(idx, m, j_long), (0.0, 0.0)
    return window(idx, m, j_long), (float(ep.mb_t[idx[m]]), float(mb_tok[idx[: m + 1]].sum()))


def _low_pack(ep: EpochArrays, win: np.ndarray, t_star: float, head: int, mb_tok: np.ndarray,
              bounds: tuple[float, float]) -> tuple | None:
    """``win`` packed at ``t_star`` with the head in its own group, else with the head joining a group of another
    p (its setting there, the memory rule) even past T*: ((T*, window, groups, the head's (group, time) or None),
    tokens) for the first whose placed groups hold ``bounds`` (low, high) tokens, else None."""
    low, cap = bounds
    groups = _pack_head(ep, win, t_star, head)
    if low <= (tok := _tokens(ep, groups, head, mb_tok)) <= cap:
        return (t_star, win, groups, None), tok
    if len(win) > 1:
        groups = pack(ep, win, t_star, head, defer_head=True)
        head_t = join_head(ep, groups, head, math.inf) if groups else None
        if head_t is not None and low <= (tok := _tokens(ep, groups, head, mb_tok)) <= cap:
            return (max(t_star, max(gr.load for gr in groups)), win, groups, head_t), tok
    return None


def _tokens(ep: EpochArrays, groups: list[Group], head: int, mb_tok: np.ndarray) -> int:
    """Tokens of the micro-batches in the ``groups`` that placement keeps (fillers may add more)."""
    return held_tokens(placed_groups(ep, groups, head)[0], mb_tok)


def fill_share(ep: EpochArrays, placed: list[Group]) -> float:
    """The share of W x the step's time that the ``placed`` groups (as ``build.placed_groups``
    keeps them) fill with work at their micro-batches' own settings (time x p, ``EpochArrays.mb_work``)."""
    t_step = max((gr.load for gr in placed), default=0.0)
    if t_step <= 0:
        return 0.0
    work = sum(float(ep.mb_work[gr.items].sum()) for gr in placed)
    return work / (ep.world_size * t_step)
