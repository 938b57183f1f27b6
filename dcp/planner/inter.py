"""DCP-inter: gradient-accumulation steps g_i per SP group, balancing one optimizer step. Exact.

Problem (paper Eq. 3, GPU-weighted as DESIGN.md section 3 asks). Group i has a micro-batch time
``T_i > 0``, ``p_i`` ranks and ``cap_i`` micro-batches available. Choose integers g_i with

    1 <= g_i <= cap_i,        T* := max_i g_i T_i <= gmax * T_max        (T_max = max_i T_i)

minimising the GPU-weighted idle fraction ``I(g) = sum_i p_i (T* - g_i T_i) / (P T*)`` (P = sum_i p_i),
i.e. maximising ``B(g) / T*`` with busy GPU-time ``B(g) = sum_i p_i g_i T_i``; among equal idle
fractions prefer the larger B (more work per optimizer step, so fewer steps).

Theorem. Let ``G(t)_i = min(cap_i, floor(t / T_i))``. The optimum is attained at ``g = G(t)`` for some t
in the candidate set ``C = {k T_j : 1 <= k <= cap_j, T_max <= k T_j <= gmax T_max}``.

Proof. Take any feasible g and let t = T* = max_i g_i T_i, attained by group j: t = g_j T_j with
1 <= g_j <= cap_j and T_max <= t <= gmax T_max (t >= T_max because every g_i >= 1), so t is in C.
For every i, g_i T_i <= t gives g_i <= floor(t / T_i), and g_i <= cap_i, hence g_i <= G(t)_i. Also
G(t)_i T_i <= t for all i and G(t)_j = g_j (because g_j T_j = t exactly), so max_i G(t)_i T_i = t:
G(t) is feasible, has the same step time t and B(G(t)) >= B(g). Therefore I(G(t)) <= I(g), with
B(G(t)) >= B(g) when the idle fractions are equal: G(t) is at least as good as g under the objective
and its tie-break. Enumerating t over C (at most sum_j cap_j values, de-duplicated) and evaluating
G(t) is therefore exact, and costs O(|C| * kinds) instead of the paper's prod_i cap_i combinations.

Groups with identical (T_i, cap_i) get identical g_i in G(t), so they are merged into one weighted
"kind" first; 4096 data-parallel groups of a few seq_groups become a handful of kinds.

Then the paper's Gmin rule (Appendix C): if every g_i < gmin, all g_i are multiplied by
ceil(gmin / max_i g_i) (and clipped to cap_i, since no more micro-batches exist). That scaling keeps the
ratios, hence the idle fraction, and may exceed the Gmax cap on purpose: Gmin wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

_REL_EPS = 1e-9
"""Relative slack for floor(t / T_i): k*T_j / T_j must give k despite rounding."""
_CHUNK = 2048
"""Candidate step times evaluated per vectorised block (bounds memory at kinds x _CHUNK floats)."""


def idle_fraction(g: Sequence[int], times_s: Sequence[float], sp_sizes: Sequence[int]) -> float:
    """GPU-weighted idle fraction ``sum_i p_i (T* - g_i T_i) / (sum_i p_i T*)`` with T* = max g_i T_i."""
    if not len(g) == len(times_s) == len(sp_sizes):
        raise ValueError(
            f"g ({len(g)}), times_s ({len(times_s)}) and sp_sizes ({len(sp_sizes)}) must have equal lengths: "
            "pass one entry per SP group"
        )
    if not g:
        return 0.0
    busy = [gi * t for gi, t in zip(g, times_s, strict=True)]
    t_star = max(busy)
    if t_star <= 0:
        return 0.0
    total = sum(sp_sizes)
    return sum(p * (t_star - b) for p, b in zip(sp_sizes, busy, strict=True)) / (total * t_star)


def _validate(times: np.ndarray, sps: np.ndarray, caps: np.ndarray | None, gmin: int, gmax: int) -> None:
    if gmin < 1 or gmax < 1:
        raise ValueError(f"gmin ({gmin}) and gmax ({gmax}) must be >= 1: use e.g. gmin=1, gmax=4")
    if not (np.all(np.isfinite(times)) and np.all(times > 0)):
        raise ValueError(f"times_s ({times.tolist()[:8]}...) must be finite and > 0: check the profile table")
    if np.any(sps < 1):
        raise ValueError(f"sp_sizes ({sps.tolist()[:8]}...) must be >= 1: pass each group's rank count")
    if caps is not None and np.any(caps < 1):
        raise ValueError(
            f"caps ({caps.tolist()[:8]}...) must be >= 1: a group always holds at least its first micro-batch"
        )


def solve_ga_steps(
    times_s: Sequence[float],
    sp_sizes: Sequence[int],
    *,
    gmin: int,
    gmax: int,
    caps: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """Exact ga_steps per group (see the module docstring for the problem and the optimality proof)."""
    n = len(times_s)
    if len(sp_sizes) != n or (caps is not None and len(caps) != n):
        raise ValueError(
            f"times_s ({n}), sp_sizes ({len(sp_sizes)}) and caps ({None if caps is None else len(caps)}) "
            "must have equal lengths: pass one entry per SP group"
        )
    if n == 0:
        return ()
    times = np.asarray(times_s, dtype=np.float64)
    sps = np.asarray(sp_sizes, dtype=np.float64)
    cap_arr = None if caps is None else np.asarray(caps, dtype=np.int64)
    _validate(times, sps, cap_arr, gmin, gmax)
    g_hi = _gmax_bound(times, gmax)
    if cap_arr is not None:
        g_hi = np.minimum(g_hi, cap_arr)
    # Merge identical (T, bound) groups into weighted kinds.
    keys = np.stack([times, g_hi.astype(np.float64)], axis=1)
    kinds, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    weights = np.bincount(inverse, weights=sps, minlength=len(kinds))
    g_kinds = _solve_kinds(kinds[:, 0], kinds[:, 1].astype(np.int64), weights)
    return _apply_gmin(g_kinds[inverse], gmin, cap_arr)


def solve_ga_kinds(
    times_s: Sequence[float], weights: Sequence[float], caps: Sequence[int], *, gmin: int, gmax: int
) -> tuple[int, ...]:
    """solve_ga_steps for groups already merged into kinds: kind i stands for groups of micro-batch time
    times_s[i] and cap caps[i] whose sp sizes sum to weights[i]. Same answer, no per-group work."""
    if not len(times_s) == len(weights) == len(caps):
        raise ValueError(
            f"times_s ({len(times_s)}), weights ({len(weights)}) and caps ({len(caps)}) must have equal lengths: "
            "pass one entry per kind"
        )
    if not len(times_s):
        return ()
    times = np.asarray(times_s, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    cap_arr = np.asarray(caps, dtype=np.int64)
    _validate(times, w, cap_arr, gmin, gmax)
    g = _solve_kinds(times, np.minimum(_gmax_bound(times, gmax), cap_arr), w)
    return _apply_gmin(g, gmin, cap_arr)


def _gmax_bound(times: np.ndarray, gmax: int) -> np.ndarray:
    """Largest g_i with g_i * T_i <= gmax * T_max (at least 1)."""
    bound = np.floor(gmax * float(times.max()) / times * (1 + _REL_EPS)).astype(np.int64)
    return np.maximum(bound, 1)


def _apply_gmin(g: np.ndarray, gmin: int, caps: np.ndarray | None) -> tuple[int, ...]:
    """The paper's Gmin rule: when every g_i < gmin, scale all by ceil(gmin / max g) (clipped to caps)."""
    m = int(g.max())
    if m < gmin:
        g = g * math.ceil(gmin / m)
        if caps is not None:
            g = np.minimum(g, caps)
    return tuple(g.tolist())


def _solve_kinds(k_time: np.ndarray, k_cap: np.ndarray, k_weight: np.ndarray) -> np.ndarray:
    """Optimal g per kind, given each kind's upper bound k_cap (cap and Gmax already applied)."""
    t_max = float(k_time.max())
    total_p = float(k_weight.sum())
    # Candidate step times t = k * T_j with T_max <= t and k <= bound_j (so t <= gmax * T_max).
    cands = []
    for tj, cj in zip(k_time.tolist(), k_cap.tolist(), strict=True):
        k_lo = max(1, math.ceil(t_max / tj * (1 - _REL_EPS)))
        if k_lo <= cj:
            cands.append(np.arange(k_lo, cj + 1, dtype=np.float64) * tj)
    cand = np.unique(np.concatenate(cands)) if cands else np.array([t_max])
    best = None  # (idle, -busy, g per kind)
    for lo in range(0, len(cand), _CHUNK):
        c = cand[lo : lo + _CHUNK]
        g = np.floor(c[None, :] / k_time[:, None] * (1 + _REL_EPS)).astype(np.int64)
        g = np.clip(g, 1, k_cap[:, None])
        work = g * k_time[:, None]
        t_star = work.max(axis=0)
        busy = (k_weight[:, None] * work).sum(axis=0)
        idle = 1.0 - busy / (total_p * t_star)
        # Lexicographic (idle, -busy) with a small tolerance on idle so rounding does not break ties.
        near = np.flatnonzero(idle <= idle.min() + 1e-12)
        i = int(near[np.argmax(busy[near])])
        val = (float(idle[i]), -float(busy[i]), g[:, i].copy())
        if best is None or val[0] < best[0] - 1e-12 or (val[0] <= best[0] + 1e-12 and val[1] < best[1]):
            best = val
    assert best is not None
    return best[2]
