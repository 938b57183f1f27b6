"""The engine base class (``Engine``) that every engine adapter derives from, and its error: what the paper's
loop calls ``model`` (``loss = model(batch); model.backward(loss); model.step()``), with the step's gradient sync
split into reduce, the non-finite guard's decision and update. The adapters live in ``dcp.runtime.engines``
(ddp, deepspeed) and ``dcp.runtime.fsdp`` (fsdp2), which both import this module, never each other."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dcp.distributed.device import autocast, module_device, resolve_precision
from dcp.runtime.weight_casts import CastHold

if TYPE_CHECKING:
    from dcp.runtime.hooks import EngineHooks


class EngineError(ValueError):
    """An engine cannot be built or used as asked; the message says why and how to fix it."""


class Engine:
    """What the paper's loop calls ``model``: ``loss = model(batch); model.backward(loss); model.step()``."""

    name = "base"
    sync_divisor = 1

    def __init__(self, module: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, *,
                 precision: str = "fp32") -> None:
        self.module = module
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.device = module_device(module)
        """Where the module computes (its first parameter's device); the manager accumulates there."""
        self.precision = resolve_precision(precision, self.device)
        """'bf16' or 'fp32' (runtime.precision resolved on ``device``)."""
        self._mgr: EngineHooks | None = None
        self._casts: bool | None = None
        """Whether the forward runs under an autocast context (``_autocast()`` is not a no-op); None: not known yet."""
        self.keep_weight_casts = False
        """advanced.cache_weight_casts (set by the manager): autocast's bf16 weight copies are made at a step's
        first micro-batch and reused by its later ones (dcp.runtime.weight_casts)."""
        self._hold = CastHold()
        self.optimizer_steps = 0
        """Optimizer updates applied so far (one per DCP step, whatever the ranks' ga_steps)."""

    # ----- what the manager calls ----------------------------------------------------------------
    def attach(self, manager: EngineHooks) -> None:
        """The manager this engine runs for (``dcp.runtime.hooks.EngineHooks``: the only calls it makes)."""
        self._mgr = manager

    @property
    def forward_model(self) -> Callable[..., Any]:
        """What ``forward_fn`` receives as the model (the module, or the DeepSpeed engine wrapping it)."""
        return self.module

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    # ----- the paper's loop ----------------------------------------------------------------------
    def _manager(self) -> EngineHooks:
        if self._mgr is None:
            raise EngineError("engine is not attached to a manager: build it through dcp.set_manager(...)")
        return self._mgr

    def __call__(self, batch: Any) -> torch.Tensor:
        """Forward of this rank's part of ``batch``; returns the (unweighted) loss_sum."""
        mgr = self._mgr if self._mgr is not None else self._manager()
        ctx = mgr.before_forward(batch)
        if self._casts is None:  # once: an fp32 forward needs no context at all (it runs per micro-batch)
            self._casts = self.uses_autocast()
        if self._casts:
            # advanced.cache_weight_casts: not for recomputed layers (a checkpointed layer keeps only its input, so
            # held copies of its weights would be memory the profiled rows do not have; a layer that is not
            # recomputed saves its bf16 weights for backward anyway) nor for a no-grad forward
            keep = self.keep_weight_casts and ctx.recompute_layers == 0 and torch.is_grad_enabled()
            if keep != self._hold.held:
                self._hold.take() if keep else self._hold.release()
            with self._autocast(cache=keep):
                out = mgr.forward_fn(self.forward_model, batch, ctx)
            if keep and mgr.in_last_micro_batch():
                self._hold.release()  # the step's last forward: its copies live only as long as backward needs them
        else:
            out = mgr.forward_fn(self.forward_model, batch, ctx)
        return mgr.after_forward(out)

    def _autocast(self, cache: bool = False) -> Any:
        """The forward's precision context (backward runs outside it, as torch.autocast recommends); ``cache``:
        autocast's weight-cast cache on (dcp.runtime.weight_casts)."""
        return autocast(self.precision, self.device, cache=cache)

    def uses_autocast(self) -> bool:
        """Whether the forward runs under autocast (bf16 on the ddp engine): where advanced.cache_weight_casts acts."""
        return not isinstance(self._autocast(), contextlib.nullcontext)

    def release_casts(self) -> None:
        """Drop the weight copies held across micro-batches (dcp.runtime.weight_casts), if any: at a step's
        update, and when the loop is left (get_data_iter's end, a break, an error)."""
        self._hold.release()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss * weight``: weight = sync_divisor / N_step (see dcp.runtime.weighting)."""
        mgr = self._mgr if self._mgr is not None else self._manager()
        self._backward(loss * mgr.loss_weight())

    def step(self) -> bool:
        """Sync gradients over all ranks and update, only after this rank's last micro-batch of the step.

        Returns True when the optimizer stepped, False on a non-boundary micro-batch (nothing happens).
        """
        mgr = self._mgr if self._mgr is not None else self._manager()
        if not mgr.at_boundary():
            return False
        watch = mgr.watch()
        token = watch.start()
        self._sync_step()
        mgr.step_done(watch.stop(token))
        return True

    def idle_step(self) -> None:
        """Join the step's gradient sync with zero gradients (a rank without micro-batches this step)."""
        self._sync_step()

    def _sync_step(self) -> None:
        """The step's gradient sync and update, busy rank or idle: one phase name on every rank, so a failure
        or timeout names only the rank that is elsewhere (an idle rank is not a suspect)."""
        self.release_casts()  # before the update changes the weights the cached copies were made from
        self._fill_missing_grads()
        mgr = self._manager()
        with mgr.collective("gradient sync"):
            self._reduce()
            # every rank takes the same decision (one flag all-reduce): applied, skipped, or NonFiniteError
            if not mgr.finite_step(self._checked_grads()):
                self._discard()
                return
            self._update()
        self.optimizer_steps += 1

    def _reduce(self) -> None:
        """The step's gradient reduction over the data-parallel ranks (may be started during backward)."""
        raise NotImplementedError

    def _update(self) -> None:
        """The optimizer step (and the LR scheduler's) from the reduced gradients, then the gradients zeroed."""
        raise NotImplementedError

    def _discard(self) -> None:
        """A skipped step (runtime.nonfinite = 'skip'): its gradients dropped, nothing updated."""
        lr = getattr(self._manager(), "_lr", None)
        if lr is not None:
            lr.restore()  # runtime.lr_scaling scaled this step's LR: the next step scales the scheduled one
        self.optimizer.zero_grad(set_to_none=True)

    def _checked_grads(self) -> list[torch.Tensor]:
        """The gradients the non-finite guard checks after ``_reduce``."""
        return [p.grad for p in self.module.parameters() if p.grad is not None]

    def _fill_missing_grads(self) -> None:
        # Parameters this rank did not touch (idle rank, unused branch) still take part in the collective
        # with zeros, so every rank reduces the same tensors in the same order.
        for p in self.module.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


__all__ = ["Engine", "EngineError"]
