"""Batch settings against the data they will plan, checked once before any work (the manager, ``dcp plan``).

``check_batch_settings(lengths, config)`` raises ConfigError (one line: field, value, rule, fix) for
a setting the data cannot hold, and returns one warning line per setting that has no effect or that the
planner will meet otherwise than written (the line says what happens instead):

- refused: ``planning.tokens_per_step`` whose upper bound (``step_tokens_bounds[1]`` x target) is below the
  median sample: a step holds at least one whole sample, so most steps would break the bound (4096x the target
  for ``tokens_per_step = 1`` and 4k-token samples). Refused too, with ``runtime.lr_scaling`` on, an upper
  bound below the longest sample: that sample's step would multiply the learning rate past the bounds' factor
  (``lr_factor``). The fix named, ``longest / (high - low)``, keeps every step, and so its LR factor, within the
  bounds, with no warning below.
- warned: a target above the epoch's tokens (the epoch is one step); an upper bound below a long-tail sample
  (each such sample takes a step alone, above the bound); bounds narrower than the longest sample (where one
  whole sample jumps over the window, a step falls outside the bounds); bounds set without a target (no
  effect under ``default_batch = "method"``). Token packs (``micro_batch_tokens``, "auto" by default) are used where
  they can win and nowhere else (2D data, baselines): ``dcp plan`` says which (``dcp.planner.tokens.token_pack_line``).

Whether each setting's rule holds depends on the lengths, so these checks live here rather than in
``PlanningConfig.__post_init__`` (which refuses what the config alone gets wrong, e.g. equal bounds). Pure:
plain data in, strings out, tested in milliseconds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from dcp.config import DCPConfig, PlanningConfig
from dcp.planner.step_tokens import batch_tokens, lr_factor
from dcp.validate import fail

DEFAULT_BOUNDS = PlanningConfig.__dataclass_fields__["step_tokens_bounds"].default


def check_batch_settings(lengths: Sequence[int], config: DCPConfig) -> list[str]:
    """Raise ConfigError for batch settings ``lengths`` cannot hold; return a warning line per setting without
    effect or met otherwise (module docstring)."""
    cfg = config.planning
    low, high = cfg.step_tokens_bounds
    ordered = sorted(int(n) for n in lengths)
    # the default batch (neither field set) is derived at least as large as the longest sample
    # (step_tokens.batch_tokens), so only a batch the user states is checked against the data
    stated = batch_tokens(config, ordered, 1)[0] if (cfg.tokens_per_step or cfg.samples_per_step) and ordered else 0
    warnings = _target_checks(ordered, config, stated) if stated else []
    if not stated and config.advanced.default_batch == "method" and tuple(cfg.step_tokens_bounds) != DEFAULT_BOUNDS:
        warnings.append(
            f"planning.step_tokens_bounds ({[low, high]}) has no effect with advanced.default_batch \"method\" and "
            "no global batch: steps keep each method's own sizes; set samples_per_step or tokens_per_step, or drop "
            "the bounds")
    return warnings


def _target_checks(lengths: list[int], config: DCPConfig, target: int) -> list[str]:
    """The stated global batch (``target`` tokens: planning.tokens_per_step, or samples_per_step x the mean
    length) against the sorted ``lengths``: raises or returns warning lines."""
    cfg = config.planning
    low, high = cfg.step_tokens_bounds
    if not lengths:
        return []
    # the field the user set, and its value as written (a sample count is checked as its tokens)
    field, value = (("planning.tokens_per_step", target) if cfg.tokens_per_step
                    else ("planning.samples_per_step", cfg.samples_per_step))
    said = f"{field} ({value:,})" if cfg.tokens_per_step else f"{field} ({value:,} = {target:,} tokens)"
    longest, median, total, cap = lengths[-1], lengths[len(lengths) // 2], sum(lengths), high * target
    fix = f"set tokens_per_step >= {math.ceil(longest / (high - low)):,} (or 0 for the default batch)"
    where = f"x step_tokens_bounds high ({high:g}) is below"
    if median > cap:
        fail(field, value,
             f"{where} the median sample ({median:,} tokens): every step holds at least one whole sample, so most "
             f"steps would hold more than {high:g}x the target (the longest {_times(longest / target)}x)", fix)
    lr = config.runtime.lr_scaling
    if longest > cap and lr != "none":
        fail(field, value,
             f"{where} the longest sample ({longest:,} tokens) with runtime.lr_scaling {lr!r}: the step of that "
             f"sample alone would multiply the learning rate by x{_times(lr_factor(longest, target, lr))}, past the "
             f"bounds' x{_times(lr_factor(cap, target, lr))}", f'{fix}, or lr_scaling = "none"')
    if target > total:
        return [f"{said} is above the epoch's {total:,} tokens ({len(lengths):,} "
                f"samples): the epoch will be one step of {total:,} tokens; set tokens_per_step <= {total:,} for "
                "several steps"]
    if longest > cap:
        over = len(lengths) - bisect.bisect_right(lengths, cap)
        return [f"{said} {where} the longest sample ({longest:,} tokens): {over:,} "
                f"sample(s) above {cap:,.0f} tokens will each take a step alone, above the bounds; {fix}"]
    if longest > (high - low) * target:
        return [f"planning.step_tokens_bounds ({[low, high]}) spans {(high - low) * target:,.0f} tokens at "
                f"a global batch of {target:,} tokens, less than the longest sample ({longest:,}): steps will fall outside "
                f"[{low * target:,.0f}, {cap:,.0f}] tokens where a whole sample jumps over that window (the "
                "epoch's mean stays on the target); widen the bounds to span the longest sample, e.g. "
                f"[{low:g}, {math.ceil(100 * (low + longest / target)) / 100:g}]"]
    return []


def _times(x: float) -> str:
    """A factor for a message: 87,766 or 2.731."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.4g}"
