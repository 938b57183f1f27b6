"""Tokens per optimizer step as a user setting (``planning.tokens_per_step``): rounds grouped into steps.

A planner emits *rounds*: StepPlans, each one layout of SP groups over all ranks. With ``tokens_per_step`` set,
consecutive rounds form one optimizer step (they share its step index; ``dcp.sim.cluster.merge_phases`` and the
manager run them back to back with one gradient sync), so that every step holds about the target:

- a step closes where the epoch's running total of tokens is nearest k x target (k steps so far), the rule of
  ``dcp.planner.peers.common.cut_steps`` applied online: the epoch's mean stays on the target instead of
  drifting by half a round per step;
- never above ``high`` x target (it closes before a round that would pass it) and never below ``low`` x target
  while rounds remain; the epoch's last step, when below ``low``, joins the step before it if the two stay
  within ``high``.

A round larger than ``high`` x target cannot be mended here: the planner caps its rounds' tokens
(``round_token_cap``). Grouping is lazy (one step held back), so plans still stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan


def round_token_cap(tokens_per_step: int, bounds: tuple[float, float]) -> int:
    """Most tokens one round may hold so that a step of it stays within the bounds (0: no cap, setting unset)."""
    return int(tokens_per_step * bounds[1]) if tokens_per_step > 0 else 0


def renumbered(plan: StepPlan, step: int) -> StepPlan:
    """The same round as part of optimizer step ``step``."""
    if plan.step == step:
        return plan
    return StepPlan.from_arrays(
        plan.epoch, step, plan.world_size, plan.method, first_rank=plan.first_rank, sp_size=plan.sp_size,
        recompute_layers=plan.recompute_layers, ga_steps=plan.ga_steps, mb_time_s=plan.mb_time_s,
        mb_seq_group=plan.mb_seq_group, mb_size=plan.mb_size, sample_ids=plan.sample_id_array,
        seq_lens=plan.seq_len_array)


def _steps(rounds: Iterable[StepPlan], target: float, low: float, high: float) -> Iterator[list[StepPlan]]:
    """Rounds grouped into steps (lists), before the last-step merge."""
    cur: list[StepPlan] = []
    cur_tok = done_tok = 0
    k = 0  # steps closed
    for r in rounds:
        t = r.tokens
        if cur:
            goal = (k + 1) * target
            nearer_without = abs(done_tok + cur_tok - goal) <= abs(done_tok + cur_tok + t - goal)
            if cur_tok + t > high * target or (nearer_without and cur_tok >= low * target):
                yield cur
                k += 1
                done_tok += cur_tok
                cur, cur_tok = [], 0
        cur.append(r)
        cur_tok += t
    if cur:
        yield cur


def group_rounds(rounds: Iterable[StepPlan], tokens_per_step: int, bounds: tuple[float, float]) -> Iterator[StepPlan]:
    """The rounds, renumbered into optimizer steps of about ``tokens_per_step`` tokens (module docstring);
    ``tokens_per_step`` 0: unchanged (every round its own step, as the planner numbered it)."""
    if tokens_per_step <= 0:
        yield from rounds
        return
    low, high = bounds
    target = float(tokens_per_step)
    # two steps held back: the last one, when short, may join the one before it
    prev: list[StepPlan] | None = None
    cur: list[StepPlan] | None = None
    step = 0
    for group in _steps(rounds, target, low, high):
        if prev is not None:
            yield from (renumbered(r, step) for r in prev)
            step += 1
        prev, cur = cur, group
    if cur is None:
        return
    if prev is not None:
        short = sum(r.tokens for r in cur) < low * target
        if short and sum(r.tokens for r in prev + cur) <= high * target:
            prev, cur = prev + cur, None
        yield from (renumbered(r, step) for r in prev)
        step += 1
    if cur is not None:
        yield from (renumbered(r, step) for r in cur)


def step_tokens(plans: Iterable[StepPlan]) -> np.ndarray:
    """Tokens of every optimizer step (rounds sharing a step index summed), in step order."""
    out: dict[int, int] = {}
    for p in plans:
        out[p.step] = out.get(p.step, 0) + p.tokens
    return np.asarray([out[k] for k in sorted(out)], dtype=np.int64)


def summary(plans: Iterable[StepPlan], tokens_per_step: int = 0) -> str:
    """'tokens/step min M / median M / max M' (and the target when set), for ``dcp plan`` and ``dcp simulate``."""
    tok = step_tokens(plans)
    if not len(tok):
        return "tokens/step: no steps"
    text = (f"tokens/step min {int(tok.min()):,} / median {float(np.median(tok)):,.0f} / max {int(tok.max()):,} "
            f"(mean {float(tok.mean()):,.0f}, {len(tok)} steps)")
    return text + (f", target {tokens_per_step:,}" if tokens_per_step else "")


def desired_tokens(step: int, done_tokens: int, tokens_per_step: int, bounds: tuple[float, float]) -> float:
    """Tokens the next step should hold so that the epoch's running total stays on step x target: the target
    corrected by what the steps so far missed or exceeded, within the bounds."""
    want = (step + 1) * tokens_per_step - done_tokens
    return float(min(max(want, bounds[0] * tokens_per_step), bounds[1] * tokens_per_step))


def cut_by_tokens(tokens: Sequence[int], tokens_per_step: float, bounds: tuple[float, float]) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive items (samples or micro-batches in release order), one per step: each
    takes items while that brings it nearer the tokens ``desired_tokens`` asks (the running total stays on
    step x target), never past ``high`` x target unless one item alone is larger; a remainder below ``low`` x
    target joins the step before it when the two stay within ``high``, as does a step cut short before an item
    larger than ``high`` (``_merge_short``)."""
    low, high = bounds[0] * tokens_per_step, bounds[1] * tokens_per_step
    n = len(tokens)
    rest = np.concatenate([np.cumsum(np.asarray(tokens, dtype=np.int64)[::-1])[::-1], [0]]).tolist()
    cuts: list[tuple[int, int]] = []
    i, done = 0, 0
    while i < n:
        want = desired_tokens(len(cuts), done, int(tokens_per_step), bounds)
        a, tok = i, tokens[i]
        i += 1
        while i < n:
            t = tokens[i]
            if not (rest[i] < low and tok + rest[i] <= high):  # else: what is left joins this step
                if tok + t > high or abs(tok + t - want) > abs(tok - want):
                    break
            tok += t
            i += 1
        cuts.append((a, i))
        done += tok
    return _merge_short(cuts, rest, low, high)


def _merge_short(cuts: list[tuple[int, int]], rest: list[int], low: float, high: float) -> list[tuple[int, int]]:
    """A step left below ``low`` (it closed before an item larger than the upper bound) joins the step before
    it, or else the one after it, when the two stay within ``high``."""
    tok = [rest[a] - rest[e] for a, e in cuts]
    k = 0
    while k < len(cuts):
        if tok[k] < low and len(cuts) > 1:
            for j in (k - 1, k + 1):
                if 0 <= j < len(cuts) and tok[j] + tok[k] <= high:
                    lo, hi = min(j, k), max(j, k)
                    cuts[lo : hi + 1] = [(cuts[lo][0], cuts[hi][1])]
                    tok[lo : hi + 1] = [tok[lo] + tok[hi]]
                    k = lo
                    break
            else:
                k += 1
            continue
        k += 1
    return cuts


def slot_steps(micro_batches: Sequence[MicroBatch], slots: Sequence[int], sp_size: int, recompute_layers: int, *,
               world_size: int, epoch: int, method: str, tokens_per_step: int,
               bounds: tuple[float, float]) -> Iterator[StepPlan]:
    """A fixed-SP baseline (bucket, packed) at a global batch: its micro-batches in release order are cut into
    steps by ``cut_by_tokens``; each step's micro-batches go longest first to the slot (an aligned block of
    ``sp_size`` ranks) with the least work so far, so slots accumulate gradients over several micro-batches
    (ga > 1) where the batch holds more micro-batches than slots. Ranks no slot covers idle."""
    covered = np.zeros(world_size, dtype=bool)
    for st in slots:
        covered[st : st + sp_size] = True
    idle = [GroupPlan(r, 1, 0, ()) for r in np.flatnonzero(~covered).tolist()]
    cuts = cut_by_tokens([mb.tokens for mb in micro_batches], tokens_per_step, bounds)
    for step, (a, e) in enumerate(cuts):
        loads = [0.0] * len(slots)
        runs: list[list[MicroBatch]] = [[] for _ in slots]
        for mb in sorted(micro_batches[a:e], key=lambda m: -m.time_s):
            j = min(range(len(slots)), key=lambda j: loads[j])
            loads[j] += mb.time_s
            runs[j].append(mb)
        groups = [GroupPlan(st, sp_size, recompute_layers, tuple(run)) for st, run in zip(slots, runs, strict=True)]
        yield StepPlan(epoch, step, world_size, method, sorted(groups + idle, key=lambda g: g.first_rank))


def micro_batch_tokens(flat_lens: np.ndarray, mb_flat: np.ndarray, mb_count: np.ndarray) -> np.ndarray:
    """Tokens of every micro-batch whose samples are the runs ``flat_lens[mb_flat : mb_flat + mb_count]``."""
    cs = np.concatenate([[0], np.cumsum(flat_lens, dtype=np.int64)])
    return cs[mb_flat + mb_count] - cs[mb_flat]


def token_target(cumw: np.ndarray, t_all: np.ndarray, tok_all: np.ndarray, world_size: int, desired: float,
                 cap: float, window_factor: float) -> tuple[float, int, int]:
    """A DCP step at a global batch: (T*, window length, position of the window's longest micro-batch) over
    the scanned micro-batches in release order (cumulative GPU-work ``cumw``, times ``t_all``, tokens
    ``tok_all``; the first is the head).

    The batch is the prefix whose tokens are nearest ``desired`` (at least the head, at most ``cap``); T* is
    its work spread over the world, at least its longest micro-batch. The window the step packs from reaches
    on to ``window_factor`` x W x T* of work for choice, never past ``cap`` tokens, and stops before a
    micro-batch longer than T* (the step must take the window's longest)."""
    n = len(t_all)
    cumtok = np.cumsum(tok_all)
    j = min(int(np.searchsorted(cumtok, desired)), n - 1)
    if 0 < j and desired - cumtok[j - 1] < cumtok[j] - desired:
        j -= 1
    while j > 0 and cumtok[j] > cap:
        j -= 1
    t_star = max(float(t_all[: j + 1].max()), float(cumw[j]) / world_size)
    m = min(int(np.searchsorted(cumw, window_factor * world_size * t_star)) + 1,
            int(np.searchsorted(cumtok, cap, side="right")), n)
    m = max(m, j + 1)
    over = np.flatnonzero(t_all[j + 1 : m] > t_star * (1 + 1e-9))
    if over.size:
        m = j + 1 + int(over[0])
    return t_star, m, int(np.argmax(t_all[:m]))


LR_RULES = ("linear", "sqrt", "none")
"""How a step's learning rate follows its batch (``runtime.lr_scaling``, ``dcp.loaders.lr_scaling``)."""


def lr_factor(batch: float, reference: float, method: str) -> float:
    """The LR multiplier of a step of ``batch`` (tokens or samples) for an LR tuned at ``reference``: linear
    ``k`` (Goyal et al.), sqrt ``sqrt(k)`` (Krizhevsky), none 1, with k = batch / reference."""
    if method == "linear":
        return batch / reference
    if method == "sqrt":
        return math.sqrt(batch / reference)
    if method == "none":
        return 1.0
    raise ValueError(f"lr scaling method ({method!r}) is not one of {list(LR_RULES)}: pick one of those names")
