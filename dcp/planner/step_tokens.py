"""Tokens per optimizer step as a user setting (``planning.tokens_per_step``, docs/planner.md).

Every method's steps hold about the target, each within ``planning.step_tokens_bounds`` of it and the epoch's
mean on it: ``cut_by_tokens`` cuts items (samples, micro-batches) in release order into about total / target
steps of an equal share each; ``step_budget`` sizes a DCP step (an equal share of what is left over the epoch's steps left, within the bounds); ``slot_steps`` puts the fixed-SP baselines' micro-batches of a
step on their slots; ``token_target`` sizes a DCP step for the tokens it wants. ``step_tokens`` and
``summary`` report tokens per step; ``batch_tokens`` resolves the global batch a user states (or its default);
``lr_factor`` is the LR rule of ``runtime.lr_scaling`` (shared with
``dcp.loaders.lr_scaling``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from dcp.config import LR_SCALING, DCPConfig
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan


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


DEFAULT_SAMPLES_PER_RANK = 16
"""The default global batch in samples per rank: enough whole samples on each rank for the planner to balance
ranks within +-10% step bounds (32 simulated H200, 30k samples, seed 0, DCP-intra's fraction of the ideal bound
at 4 / 16 samples per rank: t1d-short 0.887 / 0.968, t1d-long 0.908 / 0.966, t2d-short 0.888 / 0.978)."""

DEFAULT_LONGEST_SHARE = 8
"""The default global batch holds at least this many times the longest sample, so that the step holding it has
tokens for the ranks beside its SP group: text (a 122,908-token longest, a 455-token mean) reads 0.72 of the
ideal bound at 16 samples per rank and 0.93 at 8x its longest. Such a step can still idle: t1d-balanced's
500k-token sample on 16 of 32 ranks for 43 s idled 18% of its step at 6x, t1d-short's (seed 2) 22-26% at 8x."""

DEFAULT_MIN_STEPS = 16
"""The default batch above is cut to 1 / this of the epoch's tokens, down to its floor (``SMALL_SAMPLES_PER_RANK``
x W samples of the mean length, at least the longest sample): a small epoch keeps its steps."""

SMALL_SAMPLES_PER_RANK = 4
"""The floor of the default batch in samples per rank (with 1 per rank, bucket's b-sample micro-batches
fell to 0.68x of the target on a 400-sample test epoch at W = 8; at 4 they held 0.94x-1.0x)."""


def batch_tokens(config: DCPConfig, lengths: Sequence[int], world_size: int) -> tuple[int, str]:
    """The global batch in tokens every method plans at, and the one line that states it.

    ``planning.tokens_per_step`` as set; ``planning.samples_per_step`` as that many samples of the epoch's mean
    length; neither: DEFAULT_SAMPLES_PER_RANK x W samples of the mean length, at least DEFAULT_LONGEST_SHARE x the
    longest sample, at most 1 / DEFAULT_MIN_STEPS of the epoch, and at least SMALL_SAMPLES_PER_RANK x W samples
    of the mean length and the longest sample. A sample count is held as a token target because every method
    cuts, packs and bounds its steps by tokens (``cut_by_tokens``, ``step_budget``, the tail): a target of
    n x mean gives round(N / n) steps, n samples each on average, while the bounds keep each step's tokens (what
    the loss and the learning rate are weighted by) near the batch's. The default depends only on the data and W, never on the method or
    the profile, so every method trains the same recipe."""
    cfg = config.planning
    lens = np.asarray(lengths, dtype=np.int64)
    mean = float(lens.mean()) if len(lens) else 1.0
    if cfg.tokens_per_step:
        return cfg.tokens_per_step, f"global batch: {cfg.tokens_per_step:,} tokens per step (planning.tokens_per_step)"
    if cfg.samples_per_step:
        tok = max(1, round(cfg.samples_per_step * mean))
        return tok, (f"global batch: {cfg.samples_per_step} samples per step = {tok:,} tokens at the mean length "
                     f"{mean:,.0f} (planning.samples_per_step)")
    if config.advanced.default_batch == "method":
        return 0, "global batch: each method's own steps (advanced.default_batch = \"method\")"
    longest = int(lens.max()) if len(lens) else 1
    wide = max(round(DEFAULT_SAMPLES_PER_RANK * world_size * mean), DEFAULT_LONGEST_SHARE * longest)
    floor = max(1, round(SMALL_SAMPLES_PER_RANK * world_size * mean), longest)
    tok = max(floor, min(wide, int(lens.sum()) // DEFAULT_MIN_STEPS))
    return tok, (f"global batch: {tok:,} tokens per step = {tok // max(1, world_size):,} per rank (default: "
                 f"{DEFAULT_SAMPLES_PER_RANK} x {world_size} ranks x the mean length {mean:,.0f}, at least "
                 f"{DEFAULT_LONGEST_SHARE} x the longest sample {longest:,}, at most 1/{DEFAULT_MIN_STEPS} of the "
                 f"epoch, at least {SMALL_SAMPLES_PER_RANK} x the ranks x the mean and the longest); change it with "
                 "planning.samples_per_step = N or planning.tokens_per_step = N")


def with_batch(config: DCPConfig, lengths: Sequence[int], world_size: int) -> DCPConfig:
    """``config`` with ``planning.tokens_per_step`` set to ``batch_tokens`` (samples_per_step cleared), what
    every planning method reads."""
    import dataclasses

    tok, _ = batch_tokens(config, lengths, world_size)
    if config.planning.tokens_per_step == tok:
        return config
    return config.replace(planning=dataclasses.replace(config.planning, tokens_per_step=tok, samples_per_step=0))


TAKE_MORE = 0.5
"""``step_budget``: a step still to come is counted on for the epoch's mean and this share of its way on to the upper
bound (at +-10%: 1.05 x). Not all of it: a step's packing lands a few percent under the tokens it wants (DCP-inter at
W = 8 wanting 1.1 x held 0.94-1.03 x), so a deficit left for the last steps came back as a short extra step (0.2 x);
nor much less at wide bounds: at [0.5, 2.0] a floor raised at 1.05 x made a step leave a p = 8 micro-batch alone
for the next one, where all 8 ranks ran it at 0.24 x."""


def epoch_steps(total: float, tokens_per_step: float) -> int:
    """The steps an epoch of ``total`` tokens takes at the target: round(total / target), at least 1 (its mean
    within 1 / (2N) of the target)."""
    return max(1, round(total / tokens_per_step))


def step_budget(step: int, done: float, total: float, tokens_per_step: int,
                bounds: tuple[float, float]) -> tuple[float, float, float]:
    """(wanted, fewest, most) tokens of step ``step``, ``done`` of the epoch's ``total`` tokens trained before it.

    The epoch takes ``epoch_steps`` (N) steps of total / N tokens on average; what is left goes to the steps left
    (``_steps_left``: fewer or more where that keeps them nearer the bounds). Wanted: what leaves each step after
    this one the epoch's mean (on schedule, the running total on step x total / N: a step behind or ahead of it
    asks for the difference now, within the bounds). Fewest: the lower bound, raised to what leaves the steps
    after this one at most the mean and TAKE_MORE of its way to the upper bound each (a short rest is taken now,
    spread over the steps before the last, not left as a tiny step). Most: the upper bound (the room a step ahead
    of the schedule may take is ``step_room``'s); the last step takes all that is left."""
    low, high = bounds[0] * tokens_per_step, bounds[1] * tokens_per_step
    left, n = total - done, epoch_steps(total, tokens_per_step)
    k = _steps_left(left, n - step, low, high)
    if k == 1:
        return left, left, max(high, left)
    mean = total / n
    fewest = min(high, max(low, left - (k - 1) * (mean + TAKE_MORE * max(0.0, high - mean))))
    return min(max(left - (k - 1) * mean, fewest), high), fewest, high


def _steps_left(left: float, planned: int, low: float, high: float) -> int:
    """The steps ``left`` tokens take: the ``planned`` ones, fewer while the steps left cannot each hold ``low`` and
    one fewer is no further out of the bounds, more while they cannot each stay within ``high`` and one more is
    nearer them (the last step: 1.3 x in one step rather than two of 0.65 x; 1.6 x in two of 0.8 x)."""

    def off(k: int) -> float:  # how far (relative) an equal share of k steps lies out of the bounds
        share = left / k
        return max(share / high - 1, 1 - share / low, 0.0)

    k = max(1, planned)
    while k > 1 and left < k * low and off(k - 1) <= off(k):
        k -= 1
    while left > k * high and off(k + 1) < off(k):
        k += 1
    return k


def cut_by_tokens(tokens: Sequence[int], tokens_per_step: float, bounds: tuple[float, float]) -> list[tuple[int, int]]:
    """[start, end) runs of consecutive items (samples or micro-batches in release order), one per step, the epoch
    in about round(total / target) steps (``epoch_steps``): each step takes items while that brings it nearer its
    share (``step_budget``: what is left over the steps left), always up to its fewest tokens (what leaves the
    steps after it no more than they can hold), never past its most unless one item alone is larger; a remainder
    below ``low`` x target joins the step before it when the two stay within the most, as does a step cut short
    before an item larger than ``high`` (``_merge_short``)."""
    low, high = bounds[0] * tokens_per_step, bounds[1] * tokens_per_step
    n = len(tokens)
    rest = np.concatenate([np.cumsum(np.asarray(tokens, dtype=np.int64)[::-1])[::-1], [0]]).tolist()
    total = rest[0] if n else 0
    cuts: list[tuple[int, int]] = []
    i = 0
    while i < n:
        # (an equal share of what is left, not a running total on step x target: that drifted by a whole step on
        # coarse items, 19 steps of a 20-target epoch, and left a 0.1 x last step at +-10%)
        want, fewest, most = step_budget(len(cuts), total - rest[i], total, tokens_per_step, bounds)
        a, tok = i, tokens[i]
        i += 1
        while i < n:
            t = tokens[i]
            if not (rest[i] < low and tok + rest[i] <= most):  # else: what is left joins this step
                if tok + t > most or (tok >= fewest and abs(tok + t - want) > abs(tok - want)):
                    break
            tok += t
            i += 1
        cuts.append((a, i))
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
                 cap: float, window_factor: float, t_min: float = 0.0) -> tuple[float, int, int]:
    """A DCP step at a global batch: (T*, window length, position of the window's longest micro-batch) over
    the scanned micro-batches in release order (cumulative GPU-work ``cumw``, times ``t_all``, tokens
    ``tok_all``; the first is the head).

    The batch is the prefix whose tokens are nearest ``desired`` (at least the head, at most ``cap``); T* is
    its work spread over the world, at least its longest micro-batch and ``t_min``. The window the step packs from reaches
    on to ``window_factor`` x W x T* of work for choice, never past ``cap`` tokens, and stops before a
    micro-batch longer than T* (the step must take the window's longest)."""
    n = len(t_all)
    cumtok = np.cumsum(tok_all)
    j = min(int(np.searchsorted(cumtok, desired)), n - 1)
    if 0 < j and desired - cumtok[j - 1] < cumtok[j] - desired:
        j -= 1
    while j > 0 and cumtok[j] > cap:
        j -= 1
    t_star = max(float(t_all[: j + 1].max()), float(cumw[j]) / world_size, t_min)
    m = _window_len(cumw, t_all, cumtok, window_factor * world_size * t_star, t_star, cap, j + 1)
    return t_star, m, int(np.argmax(t_all[:m]))


def _window_len(cumw: np.ndarray, t_all: np.ndarray, cumtok: np.ndarray, work: float, t_star: float, cap: float,
                first: int) -> int:
    """How many scanned micro-batches a step's window holds: those up to ``work`` of cumulative work, at most
    ``cap`` tokens, at least ``first`` (micro-batches no longer than T*), ending before the first micro-batch
    past ``first`` that is longer than T*."""
    m = max(first, min(int(np.searchsorted(cumw, work)) + 1, int(np.searchsorted(cumtok, cap, side="right")),
                       len(t_all)))
    over = np.flatnonzero(t_all[first:m] > t_star * (1 + 1e-9))
    return first + int(over[0]) if over.size else m


TOKEN_TARGETS = (0.6, 0.7, 0.8, 0.9, 1.1, 1.25, 1.5)
"""The other targets (x T*) a step at a global batch is planned at when its balanced plan still idles more than
RETRY_IDLE (``dcp.planner.step._other_targets``)."""


TOKEN_LAG = 0.02
"""Those other plans may hold fewer (more) tokens than wanted while the epoch's running total stays within this
share of step x target of it: the epoch's mean stays within about this share of the target."""


MEAN_TOLERANCE = 0.02
"""The epoch's mean tokens per step may be this share off the user's target: ``step_room``'s step count."""
GIVE_BACK = 0.05
"""``step_room``: the steps still needed may each hold this share of the target less than it (a step that must take a
long sample of 0.75-1.0 x cannot hold much less). Small long-tailed epochs (``tests/unit/test_planner_step_bounds.py``'s,
seeds 0-159, 960 epochs) out of the bounds or the mean: 0.0: 1, 0.05: 0, 0.1: 2, 0.15: 5, 0.2: 7."""


def step_room(step: int, done: float, total: float, tokens_per_step: int) -> tuple[float, float]:
    """(TOKEN_LAG's tokens at step ``step``, the most tokens the step may hold), ``done`` of the epoch's ``total``
    tokens trained before it. The most: what leaves the steps still needed to keep the epoch's mean within
    MEAN_TOLERANCE of the target (the fewest steps that do) at least (1 - GIVE_BACK) x target each; a step that
    took more would leave the later ones unable to give it back (one long sample each, 0.75-1.0 x: a 40-step
    epoch ended after 38, its mean 5.3% over). Where no step count meets MEAN_TOLERANCE (19.5 x the target: 19
    steps are 2.6% over it, 20 are 2.4% under), the planned count (``epoch_steps``); left unbounded there, t1d-balanced
    at 96 simulated H200 (seed 1) ended a step early with its last step at 1.14 x."""
    lag, k = TOKEN_LAG * (step + 1) * tokens_per_step, total / tokens_per_step
    fewest = math.ceil(k / (1 + MEAN_TOLERANCE) - 1e-9)
    if fewest > math.floor(k / (1 - MEAN_TOLERANCE) + 1e-9):
        fewest = epoch_steps(total, tokens_per_step)
    return lag, total - done - max(0, fewest - step - 1) * (1 - GIVE_BACK) * tokens_per_step


def window_at(cumw: np.ndarray, t_all: np.ndarray, tok_all: np.ndarray, world_size: int, t_star: float,
              cap: float, window_factor: float) -> tuple[float, int, int] | None:
    """(T*, window length, position of its longest micro-batch) of a step at target ``t_star`` over the scanned
    micro-batches (as ``token_target``'s): the window reaches ``window_factor`` x W x T* of work, at most
    ``cap`` tokens, and stops before a micro-batch longer than T*; None when the head (position 0) is longer
    than T*."""
    if t_all[0] > t_star * (1 + 1e-9):
        return None
    m = _window_len(cumw, t_all, np.cumsum(tok_all), window_factor * world_size * t_star, t_star, cap, 1)
    return t_star, m, int(np.argmax(t_all[:m]))


def short_target(cumw: np.ndarray, t_all: np.ndarray, tok_all: np.ndarray, world_size: int,
                 sizes: tuple[float, float], t_first: float, window_factor: float) -> tuple[float, int, int] | None:
    """(T*, window length, position of its longest) of the short target, over the scanned
    micro-batches (as ``token_target``'s; ``sizes``: the wanted tokens, the window's most): the wanted tokens'
    work over the world, at least the head's time, the window stopping before a longer micro-batch (it waits for
    a step it sets, ``window_at``); None where ``token_target``'s ``t_first`` is no longer. Such a micro-batch
    leaves the other groups idle for the difference: at 1024 ranks (``dcp bench planner``'s data, an epoch) the
    median step idled 11% from ``t_first`` and 1.4% from this, 10% more tokens/s (priced)."""
    want, top = sizes
    j = min(int(np.searchsorted(np.cumsum(tok_all), want)), len(tok_all) - 1)
    t_short = max(float(t_all[0]), float(cumw[j]) / world_size)
    if t_first <= t_short * (1 + 1e-9):
        return None
    return window_at(cumw, t_all, tok_all, world_size, t_short, top, window_factor)


def thin_window(ep, win: np.ndarray, t_star: float, head: int) -> np.ndarray | None:
    """``win`` with its widest kind (the largest p, when one group of it holds at least a quarter of the world)
    cut to what one group of that p holds at ``t_star`` (release order; the head always kept): the others wait
    for a later step. None when nothing is cut."""
    p_win = ep.mb_p_np[win]
    p_top = int(p_win.max())
    if 4 * p_top < ep.world_size:
        return None
    wide = np.flatnonzero(p_win == p_top)
    t = ep.mb_t[win[wide]]
    keep = np.cumsum(t) <= t_star * (1 + 1e-9)
    keep |= win[wide] == head
    if keep.all():
        return None
    out = np.ones(len(win), dtype=bool)
    out[wide[~keep]] = False
    return win[out]


LR_RULES = LR_SCALING
"""How a step's learning rate follows its batch (``runtime.lr_scaling``, ``dcp.loaders.lr_scaling``): the config's
one list of rule names."""


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
