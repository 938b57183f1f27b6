"""Step 1 and 2 of a DCP step: the window of micro-batches a step packs from, and its target time T*.

Window (``scan``): from the first unconsumed micro-batch (the head), unconsumed micro-batches in release order,
up to a GPU-work bound, never past ``lookahead_samples`` stream positions after the head. Target (``target``):
T* = k x T_long (T_long: the window's longest micro-batch, which the step takes; the largest k <= Gmax whose
window work and fill allow it), so the step stays within Gmax x its longest micro-batch; the window is cut to
WINDOW_WORK_FACTOR x W x T* of work. At the epoch's end what is left is spread over the last steps.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.tuning import LONG_IDLE, WINDOW_WORK_FACTOR


class Scan(NamedTuple):
    """The scanned micro-batches from the head, in release order."""

    idx: np.ndarray
    """Their indices."""
    cumw: np.ndarray
    """Cumulative GPU-work (time x p)."""
    cummax: np.ndarray
    """Running longest time."""
    all: bool
    """True when the scan reached the epoch's last micro-batch."""
    t: np.ndarray | None = None
    """Their times (``ep.mb_t[idx]``, read while scanning; ``target`` reads them again)."""
    capped: bool = False
    """True when the look-ahead bound (``lookahead_samples``), not the work, ended the scan before the epoch's end."""


def window(idx: np.ndarray, m: int, j_long: int) -> np.ndarray:
    """The first m scanned micro-batches, plus the scan's longest (position j_long) when it lies further:
    the step takes it, which bounds T* by Gmax x its time."""
    return idx[:m] if j_long < m else np.append(idx[:m], idx[j_long])


def scan(ep: EpochArrays, prog: EpochProgress, head: int, need: Callable[[float], float]) -> Scan:
    """Unconsumed micro-batches from ``head`` in release order, within the hard window bound, until their
    GPU-work (time x p) reaches ``need(cummax of times)`` or the bound ends."""
    ready, n = ep.ready, ep.num_micro_batches
    if ready[head] + ep.lookahead_samples >= ep.num_samples:
        end = n  # the stream is exhausted: every remaining micro-batch (partial ones too)
    else:
        end = bisect.bisect_left(ready, ready[head] + ep.lookahead_samples, lo=head)
    cons = prog.consumed_np()
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (indices, their work, their times)
    lo, chunk, done_w, done_t, capped = head, max(256, prog.scan_hint), 0.0, 0.0, end < n
    while lo < end:
        hi = min(end, lo + chunk)
        part = lo + np.flatnonzero(cons[lo:hi] == 0)
        parts.append((part, ep.mb_work[part], ep.mb_t[part]))
        lo, chunk = hi, chunk * 2
        if part.size:
            done_w += float(parts[-1][1].sum())
            done_t = max(done_t, float(parts[-1][2].max()))
            if done_w >= need(done_t):
                capped = False
                break
    if not parts:
        return Scan(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), lo >= n, None, capped)
    idx, w, t = (c[0] if len(c) == 1 else np.concatenate(c) for c in zip(*parts, strict=True))
    return Scan(idx, np.cumsum(w), np.maximum.accumulate(t), lo >= n, t, capped)


def target(ep: EpochArrays, sc: Scan) -> tuple[float, int, int]:
    """Step target time T*, the window length (micro-batches of the scan) to pack from, and the position of
    the window's longest micro-batch in the scan.

    T* = k x T_long with T_long the longest micro-batch of the scanned window (failing that, of its first
    part holding F x W x its own longest time) and the largest k <= Gmax for which the window has the work
    (F x W x T*) and the longest micro-batch's group can be filled with work of its kind (``LONG_IDLE``).
    The window always reaches the longest micro-batch, which the packing must take: the step then holds
    a micro-batch of at least T* / Gmax (the paper's Gmax bound). At the end of the epoch what is left is
    spread evenly over the last steps.
    """
    W = ep.world_size
    idx, cumw = sc.idx, sc.cumw
    n = len(idx)
    j1 = min(int(np.searchsorted(cumw >= WINDOW_WORK_FACTOR * W * sc.cummax, True)), n - 1)
    t_all = ep.mb_t[idx] if sc.t is None else sc.t
    best = None
    for j_long in dict.fromkeys((int(np.argmax(t_all)), int(np.argmax(t_all[: j1 + 1])))):
        best = _largest_k(ep, sc, t_all, j_long) or best  # k = 1 always qualifies: never None in practice
        if best is not None and (cumw[-1] >= W * best[0] or sc.all):
            break
    t_star, m, t_long, j_long = best
    if sc.all and cumw[-1] <= 2 * W * t_star:
        # End of the epoch: spread what is left evenly over the last steps rather than leave a stub.
        steps = math.ceil(cumw[-1] / (W * t_star))
        t_star, m = max(t_long, min(t_star, 1.02 * cumw[-1] / (W * steps))), n
    return t_star, m, j_long


def _largest_k(ep: EpochArrays, sc: Scan, t_all: np.ndarray, j_long: int) -> tuple[float, int, float, int] | None:
    """(k x T_long, window length, T_long, j_long) for the largest k <= Gmax the window allows with the
    micro-batch at scan position j_long as the step's longest."""
    W, f, idx, cumw = ep.world_size, WINDOW_WORK_FACTOR * ep.world_size, sc.idx, sc.cumw
    n = len(idx)
    t_long = float(t_all[j_long])
    kl = int(idx[j_long])
    p_l, r_l = ep.mb_p[kl], ep.mb_r[kl]
    if len({(s.sp_size, s.recompute_layers) for s in ep.settings.values()}) == 1:
        pool = np.cumsum(t_all)  # one primary (p, r) in the epoch: every micro-batch is of the longest's kind
    else:
        compat = (ep.mb_p_np[idx] == p_l) & (ep.mb_r_np[idx] <= r_l)
        pool = np.cumsum(np.where(compat, t_all, 0.0))
    for k in range(ep.gmax, 0, -1):
        tk = k * t_long
        if k > 1 and cumw[-1] < W * tk:
            continue  # not enough work left in the window to fill a step this long
        j = max(j_long, min(int(np.searchsorted(cumw, f * tk)), n - 1))  # the window reaches the longest
        # GPU-time the longest micro-batch's group would lack, as a share of the step's capacity
        if k == 1 or p_l * max(0.0, tk - pool[j]) <= LONG_IDLE * W * tk:
            return tk, j + 1, t_long, j_long
    return None
