"""The manager's per-step learning-rate scaling at a global batch in tokens (``runtime.lr_scaling``).

With ``planning.tokens_per_step`` set, steps hold that many tokens within ``planning.step_tokens_bounds``;
``StepTokensLR.apply(step_tokens)`` before a step's micro-batches sets every parameter group's LR to its
scheduled LR x the rule of ``step_tokens / tokens_per_step`` (``dcp.planner.step_tokens.lr_factor``, the rule
``dcp.loaders.lr_scaling`` uses too); ``restore()`` right after the optimizer update, before the engine steps
the LR scheduler, puts the scheduled LR back, so schedulers that read ``group['lr']`` (ExponentialLR, the
chainable forms) never compound the scaling.
"""

from __future__ import annotations

from typing import Any

from dcp.config import LR_SCALING, ConfigError
from dcp.planner.step_tokens import lr_factor


class StepTokensLR:
    """Scales an optimizer's LR per step by the step's tokens (module docstring)."""

    def __init__(self, optimizer: Any, *, tokens_per_step: int, method: str) -> None:
        if method not in LR_SCALING:
            raise ConfigError(f"runtime.lr_scaling ({method!r}) is not one of {list(LR_SCALING)}: pick one of those")
        if tokens_per_step < 1:
            raise ConfigError(f"planning.tokens_per_step ({tokens_per_step}) must be >= 1 for runtime.lr_scaling: "
                              "set the global batch the learning rate was tuned for")
        if not hasattr(optimizer, "param_groups"):
            raise ConfigError(f"optimizer ({type(optimizer).__name__}) has no param_groups: runtime.lr_scaling "
                              "needs a torch optimizer")
        self.optimizer, self.tokens_per_step, self.method = optimizer, tokens_per_step, method
        self._scheduled: list[float] | None = None

    def apply(self, step_tokens: int) -> None:
        self.restore()  # a step that never reached its update keeps no scaling
        self._scheduled = [float(g["lr"]) for g in self.optimizer.param_groups]
        k = lr_factor(int(step_tokens), self.tokens_per_step, self.method)
        for group, lr in zip(self.optimizer.param_groups, self._scheduled, strict=True):
            group["lr"] = lr * k

    def restore(self) -> None:
        if self._scheduled is None:
            return
        for group, lr in zip(self.optimizer.param_groups, self._scheduled, strict=True):
            group["lr"] = lr
        self._scheduled = None


def step_lr(config: Any, engine: Any) -> StepTokensLR | None:
    """The manager's scaler for ``runtime.lr_scaling`` (None for "none"). The deepspeed engine steps the LR
    scheduler inside its own update, where the scaling cannot be taken back first: refused with the fix."""
    method = config.runtime.lr_scaling
    if method == "none":
        return None
    if hasattr(engine, "ds"):
        raise ConfigError(f"runtime.lr_scaling ({method!r}) is not supported with the deepspeed engine (it steps "
                          "the LR scheduler inside its update): use runtime.engine = \"ddp\" or lr_scaling = \"none\"")
    return StepTokensLR(engine.optimizer, tokens_per_step=config.planning.tokens_per_step, method=method)
