"""Batch settings against the data they will plan, checked once before any work (the manager, ``dcp plan``).

``check_batch_settings(lengths, config, two_d=...)`` raises ConfigError (one line: field, value, rule, fix) for
a setting the data cannot hold, and returns one warning line per setting that has no effect or that the
planner will meet otherwise than written (the line says what happens instead):

- refused: ``planning.tokens_per_step`` whose upper bound (``step_tokens_bounds[1]`` x target) is below the
  longest sample. A step holds at least one whole sample, so the step of that sample would exceed the bound,
  and with ``runtime.lr_scaling`` its learning rate would be multiplied by more than the bound (``lr_factor``
  of tokens / target: 4096x for ``tokens_per_step = 1`` and 4k-token samples). With the target at or above
  ``longest / high``, no step holds more than high x target and the LR factor stays within the bounds; the fix
  named, ``longest / (high - low)``, also keeps the bounds wider than the longest sample (no warning below).
- warned: a target above the epoch's tokens (the epoch is one step); bounds narrower than the longest sample
  (where one whole sample jumps over the window, a step falls outside the bounds); bounds set without a
  target (no effect); token packs (``micro_batch_tokens = "auto"``) for 2D data or a baseline method (no effect).

Whether each setting's rule holds depends on the lengths, so these checks live here rather than in
``PlanningConfig.__post_init__`` (which refuses what the config alone gets wrong, e.g. equal bounds). Pure:
plain data in, strings out, tested in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dcp.config import DCPConfig, PlanningConfig
from dcp.validate import fail

TOKEN_PACK_METHODS = ("dcp-inter", "dcp-intra")
"""Methods whose micro-batches can be token packs (``dcp.planner.tokens``; the baselines keep b samples)."""
DEFAULT_BOUNDS = PlanningConfig.__dataclass_fields__["step_tokens_bounds"].default


def check_batch_settings(lengths: Sequence[int], config: DCPConfig, *, two_d: bool = False) -> list[str]:
    """Raise ConfigError for batch settings ``lengths`` cannot hold; return a warning line per setting without
    effect or met otherwise (module docstring). ``two_d``: the data has (T, S) shapes."""
    cfg, warnings = config.planning, []
    target, (low, high) = cfg.tokens_per_step, cfg.step_tokens_bounds
    longest, total = (max(lengths), sum(lengths)) if len(lengths) else (0, 0)
    if target and longest > high * target:
        lr = ""
        if config.runtime.lr_scaling != "none":
            lr = (f"; with runtime.lr_scaling {config.runtime.lr_scaling!r} its learning rate would be multiplied "
                  f"by the step's tokens / target (x{longest / target:,.4g} or more)")
        fail("planning.tokens_per_step", target,
             f"x step_tokens_bounds high ({high:g}) is below the longest sample ({longest:,} tokens): every step "
             f"holds at least one whole sample, so its step would hold {longest / target:,.4g}x the target{lr}",
             f"set tokens_per_step >= {math.ceil(longest / (high - low)):,} (or 0: each method's own step sizes)")
    if target and total and target > total:
        warnings.append(
            f"planning.tokens_per_step ({target:,}) is above the epoch's {total:,} tokens ({len(lengths):,} samples): "
            f"the epoch will be one step of {total:,} tokens; set tokens_per_step <= {total:,} for several steps")
    elif target and longest > (high - low) * target:
        warnings.append(
            f"planning.step_tokens_bounds ({[low, high]}) spans {(high - low) * target:,.0f} tokens at tokens_per_step "
            f"{target:,}, less than the longest sample ({longest:,}): steps will fall outside [{low * target:,.0f}, "
            f"{high * target:,.0f}] tokens where a whole sample jumps over that window (the epoch's mean stays on "
            f"the target); widen the bounds to span the longest sample, e.g. [{low:g}, {math.ceil(100 * (low + longest / target)) / 100:g}]")
    if not target and tuple(cfg.step_tokens_bounds) != DEFAULT_BOUNDS:
        warnings.append(
            f"planning.step_tokens_bounds ({[low, high]}) has no effect without planning.tokens_per_step: steps "
            "keep each method's own sizes; set tokens_per_step (the global batch in tokens) or drop the bounds")
    if cfg.micro_batch_tokens != "off" and (two_d or cfg.method not in TOKEN_PACK_METHODS):
        why = ("2D data (its micro-batches pad frames and spatial tokens separately)" if two_d
               else f"planning.method {cfg.method!r} (token packs are a DCP method's)")
        warnings.append(
            f"planning.micro_batch_tokens ({cfg.micro_batch_tokens!r}) has no effect for {why}: every micro-batch "
            'holds b samples; set micro_batch_tokens = "off"')
    return warnings
