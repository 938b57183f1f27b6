"""The small public protocol an engine drives the manager through (``EngineHooks``).

An engine (``dcp.runtime.engines``) runs ``loss = engine(batch); engine.backward(loss); engine.step()``;
for that it asks the manager for the micro-batch's SP context and loss weight, tells it the forward's
output and the end of the step's gradient sync, and runs that sync inside the manager's collective phase
(so a stalled rank is named). Nothing else of the manager is the engine's business.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from dcp.distributed.device import Span, Stopwatch
from dcp.runtime.context import SPContext


class EngineHooks(Protocol):
    """What ``Engine.attach`` receives (``DCPManager`` implements it)."""

    forward_fn: Callable[..., Any]
    """``(model, batch, ctx) -> loss_sum`` or ``(loss_sum, count)``."""
    dataset: Any
    """The run's dataset (``collate``, ``lengths``): the fsdp2 engine's idle rank runs one of its samples."""
    plan: Any
    """The open step's ``StepPlan`` (None outside a step): the fsdp2 engine's ZeRO-3 mode reads its largest
    ga_steps."""

    def before_forward(self, batch: Any) -> SPContext:
        """Set up ``batch`` (optimize_dynamics if the loop did not) and return its SP context."""
        ...

    def after_forward(self, out: Any) -> torch.Tensor:
        """Account the forward's ``(loss_sum, count)`` (or ``loss_sum``); return the loss_sum."""
        ...

    def loss_weight(self) -> float:
        """The factor backward applies to the current micro-batch's loss_sum (``sync_divisor / N_step``)."""
        ...

    def in_last_micro_batch(self) -> bool:
        """True during this rank's last micro-batch of the open step (its backward gives final gradients)."""
        ...

    def at_boundary(self) -> bool:
        """True when engine.step() must sync and update: the last micro-batch, set up by optimize_dynamics."""
        ...

    def watch(self) -> Stopwatch:
        """The run's stopwatch (CUDA events on GPUs, the host clock elsewhere)."""
        ...

    def step_done(self, sync: Span | float) -> None:
        """The step's gradient sync + update ran (it took ``sync``): the step is closed."""
        ...

    def finite_step(self, grads: list[torch.Tensor]) -> bool:
        """After the step's gradient reduction, before the update: True to apply the step; False to skip it
        (runtime.nonfinite = 'skip'); raises ``dcp.runtime.guard.NonFiniteError`` ('stop'). Collective: every
        rank calls it once per step and all get the same answer."""
        ...

    def collective(self, what: str, timeout_s: float | None = None) -> AbstractContextManager[Any]:
        """Context of a collective in phase ``what`` of the step: a failure names the rank that is elsewhere."""
        ...
