"""The "fsdp2" engine: parameters, gradients and optimizer state sharded over the data-parallel ranks with
torch's public ``torch.distributed.fsdp.fully_shard``, under DCP's unequal micro-batch counts.

Why the semantics are what they are. FSDP all-gathers a block's parameters in its forward and reduce-scatters
its gradients in its backward; both are collectives over every data-parallel rank. DCP's ranks run DIFFERENT
numbers of micro-batches in one step (their groups' ga_steps) and some run none. If parameters were resharded
after every forward (ZeRO-3), a rank with 3 micro-batches would start 3 rounds of all-gathers and a rank with 1
would start 1: the ranks wait in mismatched collectives and hang (measured: 2 gloo ranks, 3 vs 1 micro-batches).
So the default mode ("fsdp2") keeps every rank's collectives at exactly one round per step, whatever its ga_steps:

- parameters are all-gathered once, at the rank's first forward of the step, and kept (unsharded) for the
  step's later micro-batches: ``reshard_after_forward=False`` and no resharding after a non-final backward
  (ZeRO-2 style: parameter memory is full during the step, gradients and optimizer state stay sharded);
- gradients accumulate locally (``set_requires_gradient_sync(False)``) and are reduce-scattered only in the
  backward of the rank's LAST micro-batch of the step, which also reshards the parameters;
- a rank with no micro-batch in the step (idle) runs one zero-weight forward/backward of the dataset's
  shortest sample on its own (SP size 1) so it issues the same all-gathers and reduce-scatters; its gradient
  contribution is an exact zero.

ZeRO-3 mode ("fsdp2-zero3", ``reshard_after_forward=True``): every parameter is resharded after its block's forward and after
each backward, and gradients are reduce-scattered in every backward, so a rank holds only its shards plus the
block in flight. That costs collectives per micro-batch (an all-gather in forward, one in backward and a
reduce-scatter), so every rank runs the same number of micro-batch SLOTS in a step: the largest ga_steps of the
step's groups (``StepPlan``). A rank with fewer micro-batches (or none) fills its remaining slots after its own with
zero-weight forward/backward passes of the dataset's shortest sample at SP size 1, so each rank's FSDP collectives
are the same sequence: per slot, one all-gather per unit in forward, one per unit in backward, one reduce-scatter
per unit. Their gradient contribution is an exact zero; their cost is the padding compute plus (slots x 3) rounds
of parameter-sized traffic per step instead of 2.
``fully_shard`` averages gradients over the ranks: ``sync_divisor`` is the world size (as for DeepSpeed).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dcp.distributed.device import autocast, resolve_precision
from dcp.runtime.context import SPContext
from dcp.runtime.engine_base import Engine, EngineError

__all__ = ["FSDP2Engine", "shard_units"]


def shard_units(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks sharded one by one (each gathered and freed as a unit): every module held in an
    ``nn.ModuleList`` (the transformer layers of the reference models and of Hugging Face models)."""
    return [m for sub in module.modules() if isinstance(sub, torch.nn.ModuleList) for m in sub]


class FSDP2Engine(Engine):
    """``fully_shard`` over all ranks; one all-gather round and one reduce-scatter round per DCP step."""

    name = "fsdp2"

    def __init__(self, module: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, *,
                 precision: str = "fp32", reshard_after_forward: bool = False) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise EngineError("runtime.engine ('fsdp2') needs torch.distributed initialised: launch with torchrun "
                              "(or dcp.distributed.launch) or use engine 'ddp' on one process")
        if optimizer is None:
            raise EngineError("optimizer (None) is required: pass a torch optimizer built on model.parameters()")
        if optimizer.state:
            raise EngineError("optimizer has state already: build it fresh on model.parameters() and load a "
                              "checkpoint after set_manager (fully_shard replaces the parameters)")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device = next(module.parameters()).device
        precision = resolve_precision(precision, device)
        with torch.no_grad():  # same start everywhere: fully_shard keeps each rank's slice of its own copy
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        names = {id(p): n for n, p in module.named_parameters()}
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        # bf16: fully_shard casts the gathered parameters to bf16 for compute and reduces fp32 gradients into
        # the fp32 shards (the master weights the optimizer updates); fp32: no policy
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if precision == "bf16" else MixedPrecisionPolicy())
        for unit in shard_units(module):
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        # fully_shard registers new (DTensor) parameters: point the caller's optimizer (and so its LR
        # scheduler, which holds the optimizer) at them, by name
        sharded = dict(module.named_parameters())
        for group in optimizer.param_groups:
            group["params"] = [sharded[names[id(p)]] for p in group["params"]]
        super().__init__(module, optimizer, lr_scheduler, precision=precision)
        self.sync_divisor = dist.get_world_size()
        self.zero3 = reshard_after_forward
        self.name = "fsdp2-zero3" if reshard_after_forward else "fsdp2"
        """ZeRO-3 mode: resharded after every forward and backward, gradients reduce-scattered per micro-batch slot."""
        self._idle_batch: Any = None
        self._own = 0  # backwards of this rank's own micro-batches in the open step (ZeRO-3's slot count)

    def _autocast(self, cache: bool = False) -> Any:
        # the MixedPrecisionPolicy computes in bf16 already; the models compute their losses in fp32 themselves
        return autocast("fp32", self.device)

    def _backward(self, loss: torch.Tensor) -> None:
        self._own += 1
        self._set_last(self.zero3 or self._manager().in_last_micro_batch())
        loss.backward()

    def _set_last(self, last: bool) -> None:
        """Reduce-scatter and reshard in this backward: only the step's last one of this rank (ZeRO-2: one round
        per step), or every one (ZeRO-3: every rank runs the same number of slots)."""
        self.module.set_requires_gradient_sync(last)
        self.module.set_reshard_after_backward(last)
        self.module.set_is_last_backward(last)

    def _slots(self) -> int:
        """Micro-batch slots of the open step (ZeRO-3): the largest ga_steps among the plan's groups."""
        plan = self._manager().plan
        return max((len(g.micro_batches) for g in plan.groups), default=0) if plan is not None else 0

    def _zero_slot(self) -> None:
        # One forward/backward of the dataset's shortest sample on its own (SP size 1, no collectives but FSDP's),
        # weighted by 0: it issues the same all-gathers and reduce-scatters as a real micro-batch.
        mgr = self._manager()
        if self._idle_batch is None:
            data = mgr.dataset
            lengths = list(data.lengths())
            i = min(range(len(lengths)), key=lengths.__getitem__)
            self._idle_batch = data.collate([data[i]]).to(self.device)
        out = mgr.forward_fn(self.forward_model, self._idle_batch, SPContext.single())
        loss = out[0] if isinstance(out, tuple) else out
        self._set_last(True)
        (loss * 0.0).backward()

    def step(self) -> bool:
        if self.zero3 and self._manager().at_boundary():
            for _ in range(self._slots() - self._own):  # the slots this rank has no micro-batch for
                self._zero_slot()
        return super().step()

    def idle_step(self) -> None:
        # An idle rank still has to issue the step's all-gathers and reduce-scatters (ZeRO-2: one round; ZeRO-3:
        # one per slot of the step)
        for _ in range(self._slots() if self.zero3 else 1):
            self._zero_slot()
        super().idle_step()

    def _sync_step(self) -> None:
        self._own = 0
        super()._sync_step()

    def _fill_missing_grads(self) -> None:
        pass  # every sharded parameter got its (reduce-scattered) gradient in the step's last backward

    def _reduce(self) -> None:
        pass  # the gradients were reduce-scattered (averaged over the ranks) in the step's last backward

    def _checked_grads(self) -> list[torch.Tensor]:
        # each rank checks its own shards: the guard's flag all-reduce makes the decision the same everywhere
        return [g.to_local() if hasattr(g, "to_local") else g
                for g in (p.grad for p in self.module.parameters()) if g is not None]

    def _update(self) -> None:
        self.optimizer.step()
        lr = getattr(self._manager(), "_lr", None)
        if lr is not None:
            lr.restore()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
