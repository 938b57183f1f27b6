"""One DCP step: window and target (``dcp.planner.window``), packing (``packing``), the re-packs that lower
its idle (``improve``, the head joining another group, other targets), then placement and the StepPlan
(``build``)."""

from __future__ import annotations

import math

import numpy as np

from dcp.planner.build import place_and_build
from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.improve import idle, improve, join_head, work
from dcp.planner.packing import pack
from dcp.planner.plan import StepPlan
from dcp.planner.tuning import HEAD_ALONE, RETRY_IDLE, RETRY_STRETCH, SHORTER_GAIN, WINDOW_WORK_FACTOR
from dcp.planner.window import Scan, scan, target, window


def plan_step(ep: EpochArrays, prog: EpochProgress, step: int, head: int) -> StepPlan:
    """The StepPlan of step ``step``, whose head (first unconsumed micro-batch) is ``head``."""
    f = WINDOW_WORK_FACTOR * ep.world_size
    sc = scan(ep, prog, head, lambda t: f * ep.gmax * t)
    t_star, m, j_long = target(ep, sc)
    win = window(sc.idx, m, j_long)
    groups = pack(ep, win, t_star, head)
    if not any(head in gr[3] for gr in groups):
        # The longest micro-batch left no ranks for the head (a tiny world): the head goes first, and the
        # step is capped by Gmax x the head's time.
        t_star = min(t_star, ep.gmax * ep.mb_t_list[head])
        groups = pack(ep, win, t_star, head, head_first=True)
    most = max(len(gr[3]) for gr in groups)
    if most < ep.gmin:
        # The paper's Gmin: every group runs fewer than gmin micro-batches; scale the step (Gmin wins over Gmax).
        t_star *= math.ceil(ep.gmin / most)
        # the rescan extends the first one (same head, same release order), so j_long still indexes it
        sc = scan(ep, prog, head, lambda t: f * t_star)
        win = window(sc.idx, min(int(np.searchsorted(sc.cumw, f * t_star)), len(sc.idx) - 1) + 1, j_long)
        groups = pack(ep, win, t_star, head)
    improve(ep, prog, win, groups, head)
    best = (groups, idle(groups, ep.world_size), win, None)
    best = _try_head_elsewhere(ep, prog, best, head, t_star)
    if best[1] > RETRY_IDLE and ep.gmin == 1:
        best = _try_targets(ep, prog, best, sc, m, j_long, head, t_star)
    groups, _, win, head_t = best
    prog.scan_hint = len(win)
    return place_and_build(ep, prog, step, head, win, groups, t_star, head_t)


def _try_head_elsewhere(ep: EpochArrays, prog: EpochProgress, best: tuple, head: int, t_star: float) -> tuple:
    """The head's own group can take the ranks a second group of the longest kind needed while its kind has
    too little work in the window to fill it (t1d-long: a p = 8 head beside one p = 16 group left the other
    16 ranks a third busy). When the step idles and the head's group is short (``HEAD_ALONE``): pack without
    it, then let it join the fullest group of a p its seq_group can run at (same memory rule, timed there);
    keep the less idle packing. ``best``: (groups, idle, window, head's (group, time) or None)."""
    groups, cur, win, _ = best
    hg = next((gr for gr in groups if head in gr[3]), None)
    if not (cur > RETRY_IDLE and len(win) > 1 and hg is not None
            and hg[2] < HEAD_ALONE * max(gr[2] for gr in groups)):
        return best
    alt = pack(ep, win, t_star, head, defer_head=True)
    head_t = join_head(ep, alt, head, t_star)
    if head_t is None:
        return best
    improve(ep, prog, win, alt, head)
    alt_idle = idle(alt, ep.world_size)
    # and no less work: a step that idles less only by being shorter pays the sync more often
    if (alt_idle < cur - 1e-9 and work(alt) >= work(groups) * (1 - 1e-9)
            and max(len(gr[3]) for gr in alt) >= ep.gmin):
        return alt, alt_idle, win, head_t
    return best


def _try_targets(ep: EpochArrays, prog: EpochProgress, best: tuple, sc: Scan, m: int, j_long: int, head: int,
                 t_star: float) -> tuple:
    """Discrete micro-batch times can leave every group of a common kind short of T* (five 6.7 s micro-batches
    in a 38.7 s step), the longest one's kind be too rare for k > 1, or the window hold too little short work
    for the ranks beside the longest kind's group (t1d-long: p = 4, 2, 1 groups a third busy): pack the other
    multiples k x T_long and slightly longer targets too, keep the least idle (ties: the first). Once limited
    to windows of coarse micro-batches (median > T*/10): with real-length prices and the calibrated H200
    model, doing it for all takes t1d-long DCP-intra from 5.0% to 2.8% idle at 32 GPUs."""
    f = WINDOW_WORK_FACTOR * ep.world_size
    t_long = float(ep.mb_t[best[2]].max())
    tries = [k * t_long for k in range(1, ep.gmax + 1)] + [t_star * (1 + x) for x in RETRY_STRETCH]
    for t_try in tries:
        if abs(t_try - t_star) <= 1e-9 * t_star:
            continue
        m_try = max(m, min(int(np.searchsorted(sc.cumw, f * t_try)), len(sc.idx) - 1) + 1)
        w_try = window(sc.idx, m_try, j_long)
        longest = float(ep.mb_t[w_try].max())
        if not longest <= t_try * (1 + 1e-9) <= ep.gmax * longest * (1 + 1e-9):
            continue
        alt = pack(ep, w_try, t_try, head)
        if not any(head in gr[3] for gr in alt):
            continue
        improve(ep, prog, w_try, alt, head)
        alt_idle = idle(alt, ep.world_size)
        # a shorter step must idle clearly less: it also pays the optimizer step more often
        if alt_idle < best[1] - (SHORTER_GAIN if t_try < t_star else 1e-9):
            best = (alt, alt_idle, w_try, None)
    return best
