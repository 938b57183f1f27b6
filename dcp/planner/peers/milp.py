"""FlexSP's phase problem as a MILP (``scipy.optimize.milp``, HiGHS), over length buckets as the paper does.

Variables: per candidate group slot (W / p slots of every allowed size p) a binary "used"; per (bucket, slot)
the integer count of the bucket's sequences the slot runs; the makespan C. Constraints: the used groups hold
at most W ranks; every bucket's sequences are assigned; a slot runs sequences only if used, only of buckets
that fit its size, and at most its token capacity; every slot's time, the per-micro-batch part once plus each
sequence's time without it (``PhaseProblem``'s linear model), is <= C. Objective: min C. Slots of one size are
used in order (symmetry breaking).

With one bucket per sequence the optimum is exact for the linear model; ``flexsp`` solves phases with a
heuristic, which tests/unit/test_planner_peers.py checks against this optimum on small cases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dcp.planner.peers.flexsp import PhaseProblem
from dcp.planner.stream import PlanningError


@dataclass(frozen=True, slots=True)
class MilpResult:
    makespan_s: float
    """The optimum's (or the best found within the time limit's) makespan under the linear model."""
    counts: tuple[int, ...]
    """Groups used per size (ascending sizes)."""
    optimal: bool
    """True when HiGHS proved optimality within the time limit."""


def buckets_of(prob: PhaseProblem, num_buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Length buckets (the paper's): sequences sorted by length cut into ``num_buckets`` runs of equal count.
    Returns (count, tokens per sequence (the bucket's longest: memory stays safe), time per size (the bucket's
    mean), ok per size (every member fits))."""
    order = np.argsort(prob.lens, kind="stable")
    parts = [p for p in np.array_split(order, min(num_buckets, len(order))) if len(p)]
    count = np.asarray([len(p) for p in parts])
    tokens = np.asarray([int(prob.lens[p].max()) for p in parts])
    t = np.stack([np.where(prob.ok[p], prob.t[p], 0.0).mean(axis=0) for p in parts])
    ok = np.stack([prob.ok[p].all(axis=0) for p in parts])
    return count, tokens, t, ok


def solve_phase_milp(prob: PhaseProblem, world_size: int, *, num_buckets: int = 0,
                     time_limit_s: float = 10.0) -> MilpResult | None:
    """Minimum makespan of one phase (module docstring); ``num_buckets`` 0: one bucket per sequence (exact).
    None when HiGHS finds no feasible assignment in time."""
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise PlanningError("the FlexSP phase MILP needs scipy (>= 1.9), which is not installed: "
                            "pip install 'dcp[peers]' (or scipy)") from None

    if num_buckets:
        count, tokens, t, ok = buckets_of(prob, num_buckets)
    else:
        count, tokens, t, ok = np.ones(len(prob.lens), dtype=np.int64), prob.lens, prob.t, prob.ok
    sizes = prob.sizes
    slots = [(k, p) for k, p in enumerate(sizes) for _ in range(world_size // p)]
    B, S = len(count), len(slots)
    nx = B * S  # x[b, j] at b * S + j, then u[j] at nx + j, then C
    nvar = nx + S + 1
    rows, lo, hi = [], [], []

    def row(entries: dict[int, float], low: float, high: float) -> None:
        r = np.zeros(nvar)
        for i, v in entries.items():
            r[i] = v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    row({nx + j: float(p) for j, (_, p) in enumerate(slots)}, -np.inf, float(world_size))
    for b in range(B):
        row({b * S + j: 1.0 for j in range(S)}, float(count[b]), float(count[b]))
    for j, (k, _) in enumerate(slots):
        for b in range(B):
            row({b * S + j: 1.0, nx + j: -float(count[b])}, -np.inf, 0.0)
        if np.isfinite(prob.cap[k]) and prob.cap[k] < 2**61:
            row({**{b * S + j: float(tokens[b]) for b in range(B)}, nx + j: -float(prob.cap[k])}, -np.inf, 0.0)
        timing = {b * S + j: float(t[b, k] - prob.over[k]) for b in range(B) if ok[b, k]}
        row({**timing, nx + j: float(prob.over[k]), nvar - 1: -1.0}, -np.inf, 0.0)
        if j + 1 < S and slots[j + 1][0] == k:
            row({nx + j: -1.0, nx + j + 1: 1.0}, -np.inf, 0.0)
    upper = np.zeros(nvar)
    for b in range(B):
        for j, (k, _) in enumerate(slots):
            upper[b * S + j] = count[b] if ok[b, k] else 0
    upper[nx : nx + S] = 1
    upper[-1] = np.inf
    integrality = np.ones(nvar)
    integrality[-1] = 0
    cost = np.zeros(nvar)
    cost[-1] = 1.0
    res = milp(cost, constraints=LinearConstraint(np.asarray(rows), lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(nvar), upper), options={"time_limit": time_limit_s})
    if res.x is None:
        return None
    used = res.x[nx : nx + S] > 0.5
    counts = tuple(int(sum(1 for j, (k2, _) in enumerate(slots) if k2 == k and used[j])) for k in range(len(sizes)))
    return MilpResult(makespan_s=float(res.x[-1]), counts=counts, optimal=res.status == 0)
