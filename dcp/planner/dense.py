"""A dense window for a step at a global batch whose T* a long micro-batch sets (``dcp.planner.step._other_targets``).

A 16-rank sample of 43 s in a 32-rank step needs 16 x 43 GPU-s of work beside it; within the step's most tokens
(``planning.step_tokens_bounds``) the release-order window holds mostly short samples, cheap per token, whose
work cannot fill those ranks (t1d-balanced at 32 H200, seed 0: a p = 8 group 27 s busy in a 43 s step, three such
steps 10-16% idle, 1.8% of the epoch's GPU time). ``dense_window`` takes the micro-batches of the most work per
token first, from a scan reaching further, up to the step's most tokens: long samples, which a later step would
run at the same cost, fill its ranks within its batch, and the steps after it keep the short samples.
"""

from __future__ import annotations

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.tuning import DENSE_LONG, DENSE_REACH, DENSE_WORK
from dcp.planner.window import scan


def dense_window(ep: EpochArrays, prog: EpochProgress, head: int, t_star: float, sizes: tuple[float, float],
                 mb_tok: np.ndarray) -> np.ndarray | None:
    """The window (micro-batch indices, release order) of the head and the scanned micro-batches no longer than
    ``t_star`` with the most GPU-work per token, up to ``sizes[1]`` tokens in all; the scan reaches DENSE_WORK x
    W x ``t_star`` of work and DENSE_REACH x ``sizes[1]`` tokens. ``sizes``: (GPU-s of the step's wanted tokens,
    its most tokens). None when ``t_star`` is below DENSE_LONG x the wanted work over the world or the head is
    longer than ``t_star``."""
    want_work, most = sizes
    if t_star * ep.world_size < DENSE_LONG * want_work or ep.mb_t[head] > t_star * (1 + 1e-9):
        return None
    sc = scan(ep, prog, head, lambda t: DENSE_WORK * ep.world_size * t_star)
    tok = mb_tok[sc.idx]
    n = max(1, int(np.searchsorted(np.cumsum(tok), DENSE_REACH * most, side="right")))
    idx, tok = sc.idx[:n], tok[:n]
    ok = np.flatnonzero(ep.mb_t[idx] <= t_star * (1 + 1e-9))
    ok = ok[ok > 0]  # (position 0 is the head, always taken)
    order = ok[np.argsort(-ep.mb_work[idx[ok]] / np.maximum(tok[ok], 1), kind="stable")]
    take = order[np.cumsum(tok[order]) <= most - tok[0]]
    return np.sort(np.concatenate([idx[:1], idx[take]]))

