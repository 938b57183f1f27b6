"""The epoch's last two steps at a global batch (``planning.tokens_per_step``), planned together.

Step by step, the penultimate step takes the tokens that keep the running total on step x target and the last
step takes all that is left: whatever the earlier choices leave, however badly its micro-batches share the
ranks (text at 32 H200: a last step 13% idle, 1.3 points of the epoch's time). Once the step being planned is
the penultimate one (what is left after its wanted tokens fits one step), ``plan_tail`` plans the epoch to its
end from several wanted tokens for that step (``TAIL_WANTS`` x the wanted ones, the last step's share within
the bounds), each on a copy of the progress, and keeps the tail that ends the epoch in as many steps as the
plain one in the least time (the sum of its steps' times). A few of them plan the penultimate step with no lower
bound of its own (``TAIL_REACH``): its window may then reach all that is left, where a long sample late in the
release order otherwise runs alone in the last step. The steps are the same count, so the epoch's mean
tokens per step is unchanged; another tail is kept only with every step within the bounds. Below 512 ranks
(``dcp.planner.assemble``), as the other targets of ``dcp.planner.step``.
"""

from __future__ import annotations

import numpy as np

from dcp.planner.epoch import EpochArrays, EpochProgress
from dcp.planner.plan import StepPlan
from dcp.planner.step import plan_step
from dcp.planner.step_tokens import desired_tokens

TAIL_WANTS = (0.8, 0.9, 1.1, 1.2)
"""The penultimate step's other wanted tokens, x the running total's (``desired_tokens``). At ``dcp bench peers``'s
setup each dataset's shortest tail wanted 0.8 (text), 0.9 (t2d-short, t2d-balanced), 1.1 (t2d-long) or 1.2
(t1d-short, t1d-balanced) x; 0.7 and 1.3 won nowhere and cost two more step plans each."""
TAIL_REACH = (1.2,)
"""Wanted tokens (x the running total's) at which the penultimate step is also planned with a lower bound of 0: its
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


def is_penultimate(step: int, done: int, tokens_per_step: int, bounds: tuple[float, float], left: float) -> bool:
    """True when step ``step`` (``done`` tokens trained before it, ``left`` left in the epoch) is the epoch's
    penultimate one: it is not the last (``step._token_step`` takes all that is left when that is at most the
    upper bound and at most its wanted tokens + the lower bound) and the step after it, once this one took its
    wanted tokens, would be."""
    low, cap = bounds[0] * tokens_per_step, bounds[1] * tokens_per_step
    want = desired_tokens(step, done, tokens_per_step, bounds)
    after = desired_tokens(step + 1, done + round(want), tokens_per_step, bounds)
    return left > min(cap, want + low) and left - want <= min(cap, after + low)


def plan_tail(ep: EpochArrays, prog: EpochProgress, step: int, done: int, tokens_per_step: int,
              bounds: tuple[float, float], mb_tok: np.ndarray) -> list[StepPlan]:
    """The StepPlans from ``step`` (``done`` tokens trained before it) to the epoch's end, ``prog`` advanced past
    them: the plain tail (the step at its ``desired_tokens``) or, where one is shorter by TAIL_GAIN, the tail
    whose first step wants another share of what is left (module docstring)."""
    low, cap = bounds[0] * tokens_per_step, bounds[1] * tokens_per_step
    want = desired_tokens(step, done, tokens_per_step, bounds)
    left = float(mb_tok.sum()) - done
    sizes = (tokens_per_step, bounds, mb_tok)
    best = _tail(ep, prog, step, done, want, sizes)
    n, best_t = len(best[0]), _time(best[0])
    tries = [(want * x, low) for x in TAIL_WANTS] + [(want * x, 0.0) for x in TAIL_REACH]
    if not _within(best[0], low, cap):
        tries.append((left, low))  # (all that is left in one step: its lower bound the last step's share)
    for w, first_low in tries:
        if not (low <= w <= cap and (w == left or low <= left - w <= cap)):
            continue
        alt = _tail(ep, prog, step, done, w, sizes, first_low)
        if not (alt[2] and _within(alt[0], low, cap)):
            continue
        # each step within the bounds first; then as many steps as the plain tail (the epoch's mean tokens per
        # step unchanged) in less time
        if (not _within(best[0], low, cap) or (len(best[0]) != n and len(alt[0]) == n)
                or (len(alt[0]) == len(best[0]) and _time(alt[0]) < best_t * (1 - TAIL_GAIN))):
            best, best_t = alt, _time(alt[0])
    plans, after, _ = best
    prog.consumed[:] = after.consumed
    prog.scan_hint = after.scan_hint
    return plans


def _tail(ep: EpochArrays, prog: EpochProgress, step: int, done: int, first_want: float,
          sizes: tuple[int, tuple[float, float], np.ndarray], first_low: float | None = None
          ) -> tuple[list[StepPlan], EpochProgress, bool]:
    """The steps from ``step`` to the epoch's end on a copy of ``prog``, the first wanting ``first_want`` tokens
    (with ``first_low`` as its lower bound when given) and the others their ``desired_tokens``; at most TAIL_STEPS
    of them. Returns (plans, the copy, whether they end the epoch)."""
    tokens_per_step, bounds, mb_tok = sizes
    own = EpochProgress(len(prog.consumed))
    own.consumed[:] = prog.consumed
    own.scan_hint = prog.scan_hint
    plans: list[StepPlan] = []
    head = own.consumed.find(0)
    while head >= 0 and len(plans) < TAIL_STEPS:
        want = first_want if not plans else desired_tokens(step, done, tokens_per_step, bounds)
        low = first_low if not plans and first_low is not None else bounds[0] * tokens_per_step
        plan = plan_step(ep, own, step, head, (want, bounds[1] * tokens_per_step, mb_tok, low, tokens_per_step))
        plans.append(plan)
        done += plan.tokens
        step += 1
        head = own.consumed.find(0, head)
    return plans, own, head < 0


def _within(plans: list[StepPlan], low: float, cap: float) -> bool:
    return all(low <= p.tokens <= cap for p in plans)


def _time(plans: list[StepPlan]) -> float:
    return sum(p.step_time_s for p in plans)
