"""The 'dcp' logger (rank prefix) and the per-step record rank 0 prints one line of."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass


class _RankFilter(logging.Filter):
    """Adds the rank prefix to every record of the handler it is attached to."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.prefix = f"[rank{rank}]"

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank_prefix = self.prefix
        return True


def get_logger(rank: int) -> logging.Logger:
    """The 'dcp' logger with one stderr handler whose lines start with ``[rankN]``.

    Idempotent: a second call (a second manager in the same process) replaces the prefix instead of
    adding a second handler. The level is left to the application (INFO is set only if unset).
    """
    logger = logging.getLogger("dcp")
    for h in logger.handlers:
        if getattr(h, "_dcp_rank_handler", False):
            h.filters.clear()
            h.addFilter(_RankFilter(rank))
            return logger
    handler = logging.StreamHandler(sys.stderr)
    handler._dcp_rank_handler = True  # type: ignore[attr-defined]
    handler.addFilter(_RankFilter(rank))
    handler.setFormatter(logging.Formatter("%(rank_prefix)s %(asctime)s dcp: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return logger


@dataclass(kw_only=True, slots=True, frozen=True)
class StepStats:
    """What one optimizer step did, gathered from all ranks (the same record on every rank)."""

    epoch: int
    """Epoch of the step (0-based)."""
    step: int
    """Optimizer step index within the epoch (0-based; StepPlan.step)."""
    global_step: int
    """Optimizer steps taken since the manager was created (or since the checkpoint it resumed from)."""
    loss: float
    """Mean loss of the step: sum of loss_sum over all ranks / sum of counts (NaN if nothing was counted)."""
    count: int
    """What the loss was averaged over, summed over all ranks: labelled tokens with runtime.loss_weighting =
    "tokens" (checked against the plan), samples with "samples"; 0 when nothing was counted."""
    tokens: int
    """Tokens of the step's samples by the planner's lengths (held near the global batch,
    planning.tokens_per_step / samples_per_step, within planning.step_tokens_bounds)."""
    step_time_s: float
    """Seconds of wall time from this step's start to the next step's start on this rank."""
    busy_s: tuple[float, ...]
    """Seconds per rank (index = rank): time inside ``mgr.profile`` blocks minus time inside the gradient sync
    and optimizer step; what ``measured_idle`` compares."""
    predicted_idle: float
    """The plan's GPU-weighted idle fraction, 0..1, from the profile table's times (StepPlan.idle_ratio_gpu)."""
    summary: str
    """SP sizes, ga steps and recompute layers of the step's groups, as text for the step's log line."""

    @property
    def tokens_per_s(self) -> float:
        """Tokens of the step over its wall time (0 for a zero time)."""
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def measured_idle(self) -> float:
        """GPU-weighted idle fraction measured: sum_r (max busy - busy_r) / (W * max busy)."""
        top = max(self.busy_s, default=0.0)
        if top <= 0:
            return 0.0
        return sum(top - b for b in self.busy_s) / (len(self.busy_s) * top)

    def line(self) -> str:
        """The one log line rank 0 prints for the step (every runtime.log_every steps)."""
        return (
            f"epoch {self.epoch} step {self.step} (global {self.global_step}) loss {self.loss:.4f} "
            f"tokens/s {self.tokens_per_s:,.0f} {self.summary} idle predicted {self.predicted_idle:.3f} "
            f"measured {self.measured_idle:.3f}"
        )
