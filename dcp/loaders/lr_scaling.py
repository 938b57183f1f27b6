"""Learning rate scaled by the realised batch size of each step (linear or square-root rule).

With token-budget batching the number of samples per step varies (many short samples, few long ones).
``BatchSizeScaledLR`` wraps a torch optimizer, or a torch LR scheduler, and sets every parameter group's
LR to ``scheduled_lr * scale(batch_size / reference_batch_size)`` for the step about to run:

* linear: ``scale(k) = k`` (Goyal et al., "Accurate, Large Minibatch SGD");
* sqrt:   ``scale(k) = sqrt(k)`` (Krizhevsky, "One weird trick ...": keeps gradient variance constant).

The wrapped scheduler always sees the *unscaled* LRs: before it steps, the wrapper restores them, so
schedulers that read ``group['lr']`` (ExponentialLR, chained schedulers) do not compound the scaling.
Call order per optimizer step (never per micro-batch): ``optimizer.step(); wrapper.step(next_batch_size)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dcp.loaders._common import fail_arg
from dcp.planner.step_tokens import LR_RULES, lr_factor

SCALING_METHODS = LR_RULES  # the one list of rules, with the manager's (dcp.planner.step_tokens)


def scale_lr(reference_batch_size: int, batch_size: int, lr: float, method: str = "linear") -> float:
    """``lr`` for a step of ``batch_size`` samples, given it was tuned for ``reference_batch_size``."""
    if reference_batch_size < 1:
        fail_arg("reference_batch_size", reference_batch_size, "must be >= 1", "pass the batch size lr was tuned for")
    if batch_size < 0:
        fail_arg("batch_size", batch_size, "must be >= 0", "pass the number of samples of the step")
    if method not in SCALING_METHODS:
        fail_arg("method", method, f"is not one of {list(SCALING_METHODS)}", "pick one of those names")
    return lr * lr_factor(batch_size, reference_batch_size, method)  # the one rule, shared with the manager


class BatchSizeScaledLR:
    """LR-scheduler wrapper: the base schedule times a factor from each step's realised batch size.

    ``base`` is a ``torch.optim.Optimizer`` (constant base LR) or a ``torch.optim.lr_scheduler`` scheduler.
    ``batch_sizes`` (optional) lists the global batch size of every step, e.g.
    ``[s.batch_size for s in plan_variable_batches(...)]``; then ``step()`` needs no argument. The batch
    size of step 0 is applied on construction.
    """

    def __init__(
        self,
        base: Any,
        *,
        reference_batch_size: int,
        method: str = "linear",
        batch_sizes: Sequence[int] | None = None,
        first_batch_size: int | None = None,
    ) -> None:
        if method not in SCALING_METHODS:
            fail_arg("method", method, f"is not one of {list(SCALING_METHODS)}", "pick one of those names")
        if reference_batch_size < 1:
            fail_arg("reference_batch_size", reference_batch_size, "must be >= 1",
                     "pass the batch size the base LR was tuned for")
        if batch_sizes is not None and len(batch_sizes) == 0:
            fail_arg("batch_sizes", [], "is empty", "pass one batch size per step, or None")
        if batch_sizes is None and first_batch_size is None:
            fail_arg("first_batch_size", None, "is required when batch_sizes is None",
                     "pass the batch size of the first step (or the whole batch_sizes list)")
        self.scheduler = base if hasattr(base, "optimizer") and hasattr(base, "get_last_lr") else None
        self.optimizer = base.optimizer if self.scheduler is not None else base
        if not hasattr(self.optimizer, "param_groups"):
            fail_arg("base", type(base).__name__, "is neither a torch optimizer nor an LR scheduler",
                     "pass an optimizer or a torch.optim.lr_scheduler scheduler")
        self.reference_batch_size = reference_batch_size
        self.method = method
        self.batch_sizes = list(batch_sizes) if batch_sizes is not None else None
        self.last_step = 0
        self._unscaled = [float(g["lr"]) for g in self.optimizer.param_groups]
        self._apply(self._batch_size_for(0, first_batch_size))

    def _batch_size_for(self, step: int, given: int | None) -> int:
        if given is not None:
            return int(given)
        if self.batch_sizes is None:
            fail_arg("batch_size", None, "is required when the wrapper has no batch_sizes list",
                     "call step(next_batch_size)")
        if step >= len(self.batch_sizes):
            fail_arg("step", step, f"is past the end of batch_sizes ({len(self.batch_sizes)} steps)",
                     "pass a batch_sizes list covering every step, or pass step(next_batch_size)")
        return self.batch_sizes[step]

    def _apply(self, batch_size: int) -> None:
        self.batch_size = batch_size
        for group, lr in zip(self.optimizer.param_groups, self._unscaled, strict=True):
            group["lr"] = scale_lr(self.reference_batch_size, batch_size, lr, self.method)

    def step(self, next_batch_size: int | None = None) -> None:
        """Advance the base schedule one optimizer step and scale the LR for the next step's batch size."""
        batch_size = self._batch_size_for(self.last_step + 1, next_batch_size)  # fail before changing state
        # the base scheduler must see its own, unscaled LRs (some compute the next LR from group['lr'])
        for group, lr in zip(self.optimizer.param_groups, self._unscaled, strict=True):
            group["lr"] = lr
        if self.scheduler is not None:
            self.scheduler.step()
        self._unscaled = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.last_step += 1
        self._apply(batch_size)

    def get_last_lr(self) -> list[float]:
        """The scaled LRs in use now, one per parameter group."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_unscaled_lr(self) -> list[float]:
        """What the base schedule alone would use now."""
        return list(self._unscaled)

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_step": self.last_step, "batch_size": self.batch_size, "unscaled": list(self._unscaled),
            "reference_batch_size": self.reference_batch_size, "method": self.method,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("reference_batch_size", "method"):
            if state.get(key) != getattr(self, key):
                fail_arg(f"state_dict['{key}']", state.get(key), f"differs from this wrapper's {getattr(self, key)!r}",
                         "resume with the same LR-scaling settings as the saved run")
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.last_step = int(state["last_step"])
        self._unscaled = [float(x) for x in state["unscaled"]]
        self._apply(int(state["batch_size"]))

