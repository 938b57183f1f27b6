"""The epoch's last two steps at a global batch (``planning.tokens_per_step``), planned together.

Step by step, the penultimate step takes its ``step_budget`` (the running total on step x the epoch's mean) and
the last step takes all that is left: whatever the earlier choices leave, however badly its micro-batches share the
ranks (text at 32 H200: a last step 13% idle, 1.3 points of the epoch's time). Once the step being planned is
the penultimate one (what is left after its wanted tokens fits one step), ``plan_tail`` plans the epoch to its
end from several wanted tokens for that step (``TAIL_WANTS`` x the wanted ones, the last step's share within
the bounds), each on a copy of the progress, and keeps the tail that ends the epoch in its planned steps (``epoch_steps``) in
the least time (the sum of its steps' times). A few of them plan the penultimate step with no lower
bound of its own (``TAIL_REACH``): its window may then reach all that is left, where a long sample late in the
release order otherwise runs alone in the last step. The steps are the planned count, so the epoch's mean
tokens per step stays on the target; another tail is kept only with every step within the bounds. From 512 ranks
(``dcp.planner.assemble``) the other shares are tried only where the plain tail leaves the bounds.
"""

from __future__ import annotations

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.group import Budget
from dcp.planner.plan import StepPlan
from dcp.planner.step import plan_step
from dcp.planner.step_tokens import epoch_steps, step_budget

TAIL_WANTS = (0.8, 0.9, 1.1, 1.2)
"""The penultimate step's other wanted tokens, x its ``step_budget``'s. At ``dcp bench peers``'s
setup each dataset's shortest tail wanted 0.8 (text), 0.9 (t2d-short, t2d-balanced), 1.1 (t2d-long) or 1.2
(t1d-short, t1d-balanced) x; 0.7 and 1.3 won nowhere and cost two more step plans each."""
TAIL_REACH = (1.2,)
"""Wanted tokens (x its ``step_budget``'s) at which the penultimate step is also planned with a lower bound of 0: its
window reaches the whole rest of the epoch (``step._token_step`` keeps the lower bound's tokens for the last step
otherwise) and nothing stretches it to the bound (both steps must land within the bounds to be kept). Text at 32
H200, seed 4: a p = 8 sample of 4.2 s began at 1.64 x the target into a rest of 2.15 x, past the window's
1.65 x, and ran in a last step 20% idle; with it 0.932 -> 0.940 of the ideal bound (seed 2: 0.932 -> 0.941). 1.2 x
was the shortest on every set where these won (text seeds 2 and 4, t1d-balanced, t2d-short; 1.0, 0.8, 0.9 and
1.1 x tried too, 1.1 x tied on one): the others would cost two step plans each."""
TAIL_GAIN = 1e-3
"""Another tail replaces the plain one only when it is at least this share shorter (ties keep the plain one)."""
TAIL_STEPS = 4
"""A candidate tail that has not ended the epoch after this many steps is dropped (the plain one takes 2)."""


def is_penultimate(step: int, done: int, total: float, tokens_per_step: int, bounds: tuple[float, float]) -> bool:
    """True when step ``step`` (``done`` of the epoch's ``total`` tokens trained before it) is the epoch's
    penultimate one: it is not the last (``step._token_step`` takes all that is left when that is at most the
    step's most tokens and at most its wanted + fewest, ``step_budget``) and the step after it, once this one took
    its wanted tokens, would be."""
    left = total - done
    want, fewest, most = step_budget(step, done, total, tokens_per_step, bounds)
    after, after_fewest, after_most = step_budget(step + 1, done + round(want), total, tokens_per_step, bounds)
    return left > min(most, want + fewest) and left - want <= min(after_most, after + after_fewest)


def plan_tail(ep: EpochArrays, prog: EpochProgress, step: int, done: int, tokens_per_step: int,
              bounds: tuple[float, float], mb_tok: np.ndarray, for_time: bool = True) -> list[StepPlan]:
    """The StepPlans from ``step`` (``done`` tokens trained before it) to the epoch's end, ``prog`` advanced past
    them: the plain tail (the step at its ``step_budget``) or, where one is shorter by TAIL_GAIN, the tail
    whose first step wants another share of what is left (module docstring). ``for_time`` False: the other
    shares are tried only when the plain tail leaves the bounds (from 512 ranks, where each costs seconds)."""
    low, cap = bounds[0] * tokens_per_step, bounds[1] * tokens_per_step
    want = step_budget(step, done, float(mb_tok.sum()), tokens_per_step, bounds)[0]
    left = float(mb_tok.sum()) - done
    sizes = (tokens_per_step, bounds, mb_tok)
    best = _tail(ep, prog, step, done, want, sizes)
    n, best_t = max(1, epoch_steps(float(mb_tok.sum()), tokens_per_step) - step), _time(best[0])
    within = _within(best[0], low, cap)
    tries = ([(want * x, low) for x in TAIL_WANTS] + [(want * x, 0.0) for x in TAIL_REACH]
             if for_time or not within else [])
    if not within:
        tries.append((left, low))  # (all that is left in one step: its lower bound the last step's share)
    # a wanted share past what leaves both steps within the bounds is tried at the nearest one that does
    # (t2d-balanced at 32 H200, seed 1: 0.9 x the budget, below the lower bound, became it, and the tail
    # 1.067 / 0.877 x the batch became 0.902 / 1.043 x)
    lo_w, hi_w = max(low, left - cap), min(cap, left - low)
    seen = set()
    for w, first_low in tries:
        if w != left:
            w = min(max(w, lo_w), hi_w)
        if not (low <= w <= cap if w == left else lo_w <= hi_w) or (w, first_low) in seen:
            continue
        seen.add((w, first_low))
        alt = _tail(ep, prog, step, done, w, sizes, first_low)
        if not (alt[2] and _within(alt[0], low, cap)):
            continue
        # each step within the bounds first; then the epoch's planned steps (``epoch_steps``: its mean tokens per
        # step on the target) in less time
        if (not _within(best[0], low, cap) or (len(best[0]) != n and len(alt[0]) == n)
                or (len(alt[0]) == len(best[0]) and _time(alt[0]) < best_t * (1 - TAIL_GAIN))):
            best, best_t = alt, _time(alt[0])
    plans, after, _ = best
    prog.consumed[:] = after.consumed
    prog.scan_hint = after.scan_hint
    return plans


def plan_budgeted(ep: EpochArrays, prog: EpochProgress, step: int, head: int,
                  budget: Budget, low: float) -> StepPlan:
    """``plan_step`` at ``budget``. Its fewest tokens
    (``step_budget``) can lie above the lower bound ``low``, a hope that whole micro-batches may not meet: a plan
    that then falls below ``low`` too (its packing's own, the stretches to the raised floor failing) is planned
    again at ``low`` and the one holding more tokens kept (W = 2, 8 samples per step: 0.73 x at a floor of 1.02 x,
    0.96 x at 0.9 x)."""
    if budget.fewest <= low:
        return plan_step(ep, prog, step, head, budget)
    own = _copy(prog)
    plan = plan_step(ep, own, step, head, budget)
    if plan.tokens < low:
        other = _copy(prog)
        alt = plan_step(ep, other, step, head, budget._replace(fewest=low))
        if alt.tokens > plan.tokens:
            plan, own = alt, other
    prog.consumed[:] = own.consumed
    prog.scan_hint = own.scan_hint
    return plan


def _copy(prog: EpochProgress) -> EpochProgress:
    own = EpochProgress(len(prog.consumed))
    own.consumed[:] = prog.consumed
    own.scan_hint = prog.scan_hint
    return own


def _tail(ep: EpochArrays, prog: EpochProgress, step: int, done: int, first_want: float,
          sizes: tuple[int, tuple[float, float], np.ndarray], first_low: float | None = None
          ) -> tuple[list[StepPlan], EpochProgress, bool]:
    """The steps from ``step`` to the epoch's end on a copy of ``prog``, the first wanting ``first_want`` tokens
    (with ``first_low`` as its lower bound when given) and the others their ``step_budget``; at most TAIL_STEPS
    of them. Returns (plans, the copy, whether they end the epoch)."""
    tokens_per_step, bounds, mb_tok = sizes
    own = _copy(prog)
    plans: list[StepPlan] = []
    head = own.consumed.find(0)
    total = float(mb_tok.sum())
    while head >= 0 and len(plans) < TAIL_STEPS:
        want, low, most = step_budget(step, done, total, tokens_per_step, bounds)
        if not plans:
            want, low = first_want, low if first_low is None else first_low
        plan = plan_budgeted(ep, own, step, head, Budget(want, most, mb_tok, low, tokens_per_step),
                             bounds[0] * tokens_per_step)
        plans.append(plan)
        done += plan.tokens
        step += 1
        head = own.consumed.find(0, head)
    return plans, own, head < 0


def _within(plans: list[StepPlan], low: float, cap: float) -> bool:
    return all(low <= p.tokens <= cap for p in plans)


def _time(plans: list[StepPlan]) -> float:
    return sum(p.step_time_s for p in plans)
