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
    """Epoch of the step."""
    step: int
    """Step index within the epoch."""
    global_step: int
    """Optimizer steps taken since the manager was created (or since the checkpoint it resumed from)."""
    loss: float
    """Mean loss of the step: sum of loss_sum over all ranks / sum of counts (NaN if nothing was counted)."""
    count: int
    """Labelled tokens (the model's counts) over all ranks."""
    tokens: int
    """Tokens of the step's samples (planner lengths)."""
    step_time_s: float
    """Wall time from this step's start to the next step's start on this rank."""
    busy_s: tuple[float, ...]
    """Per rank: time inside ``mgr.profile`` blocks minus time inside the gradient sync and optimizer step."""
    predicted_idle: float
    """Plan's GPU-weighted idle fraction (StepPlan.idle_ratio_gpu)."""
    summary: str
    """SP sizes, ga steps and recompute layers of the step's groups."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def measured_idle(self) -> float:
        """GPU-weighted idle fraction measured: sum_r (max busy - busy_r) / (W * max busy)."""
        top = max(self.busy_s, default=0.0)
        if top <= 0:
            return 0.0
        return sum(top - b for b in self.busy_s) / (len(self.busy_s) * top)

    def line(self) -> str:
        return (
            f"epoch {self.epoch} step {self.step} (global {self.global_step}) loss {self.loss:.4f} "
            f"tokens/s {self.tokens_per_s:,.0f} {self.summary} idle predicted {self.predicted_idle:.3f} "
            f"measured {self.measured_idle:.3f}"
        )
