"""Engine adapters: run forward/backward/step for the manager with one gradient sync per DCP step.

DCP's ranks accumulate DIFFERENT numbers of micro-batches in one step (their groups' ga_steps), and a rank
may have none at all (the partial last step of an epoch). Every rank must still join exactly one gradient
sync per step, over all W ranks, after its own micro-batches. The adapters below therefore decouple the
sync from backward:

- ``DDPEngine`` ("ddp"): plain data parallelism with a bucketed all-reduce (SUM) of the step's gradients.
  torch's DistributedDataParallel ties its all-reduce to a backward pass (``no_sync()`` only postpones it to
  the next backward), so a rank with no micro-batch in a step could only join the sync by running a fake
  forward/backward; doing the all-reduce ourselves is simpler, exact, and costs the same bytes (parameters
  and buffers are broadcast from rank 0 at start, as DDP does). Like DDP, it overlaps the all-reduce with
  backward: during this rank's LAST micro-batch of the step, a bucket's all-reduce starts as soon as all of
  its parameters have their final gradient (buckets hold the parameters in reverse order, the order
  backward produces them, and start strictly in bucket order, so every rank issues the same collectives
  in the same order); ``step()`` starts the buckets not started yet (an idle rank: all of them), waits and
  updates. So between a rank's last backward of a step and its ``step()`` nothing else may run a collective
  on the engine's group (the manager's loop runs none there; SP groups are groups of their own).
- ``DeepSpeedEngine`` ("deepspeed", ZeRO-1): public API only. ``managed_gradient_accumulation: false``
  (DeepSpeed >= 0.19.4) makes ``backward`` accumulate locally and ``step()`` the caller-owned boundary that
  reduces gradients (averaged over W) and updates; ``backward(loss, scale_wrt_gas=False)`` keeps DeepSpeed
  from dividing by its own gradient_accumulation_steps. Batch-size fields are derived in one place,
  ``deepspeed_config``.

``sync_divisor`` tells the manager how the engine combines gradients (1 = sum, W = average), so that
loss weights ``sync_divisor / N_step`` give the gradient of the step's mean loss either way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dcp.config import GRAD_BUCKET_MIB
from dcp.distributed.comm import all_reduce_grads_flat, check_backend_device, copy_flat_into_grads
from dcp.distributed.device import autocast, module_device, resolve_precision
from dcp.runtime.engine_base import Engine, EngineError

if TYPE_CHECKING:
    pass

ENGINES = ("ddp", "deepspeed", "fsdp2", "fsdp2-zero3")
__all__ = ["ENGINES", "DDPEngine", "DeepSpeedEngine", "Engine", "EngineError", "all_reduce_grads_flat",
           "build_engine", "copy_flat_into_grads", "deepspeed_config"]


class DDPEngine(Engine):
    """Data parallelism with one bucketed SUM all-reduce of the gradients per DCP step."""

    name = "ddp"
    sync_divisor = 1

    def __init__(self, module: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, *,
                 group: Any = None, bucket_cap_mb: float = GRAD_BUCKET_MIB, precision: str = "fp32") -> None:
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            # DDP's hooks all-reduce on every backward; with unequal ga_steps per rank the ranks would run
            # different numbers of collectives and hang. DCP owns the (single) gradient sync per step.
            raise EngineError(
                "model (DistributedDataParallel) must be the plain module: pass model.module to set_manager; "
                "DCP's ddp engine does the one gradient all-reduce per step itself"
            )
        super().__init__(module, optimizer, lr_scheduler, precision=precision)
        if optimizer is None:
            raise EngineError("optimizer (None) is required: pass optimizer=torch.optim.SGD(model.parameters(), ...)")
        self.group = group
        self._distributed = dist.is_available() and dist.is_initialized()
        if self._distributed:
            # bf16 runs autocast over fp32 parameters: gradients, the all-reduce and the optimizer stay
            # fp32 (the master weights). NCCL needs the parameters on this rank's GPU.
            try:
                check_backend_device(str(dist.get_backend(group)), self.device, "model parameters")
            except ValueError as exc:
                raise EngineError(str(exc)) from None
            with torch.no_grad():
                # Same start everywhere, as DDP guarantees: global rank 0's parameters and buffers win.
                src = dist.get_global_rank(group, 0) if group is not None else 0
                for t in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(t.data, src=src, group=group)
        params = [p for p in module.parameters() if p.requires_grad]
        # reverse order: backward produces the last layers' gradients first, so their buckets fill first
        self._buckets = self._make_buckets(params[::-1], bucket_cap_mb)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self._buckets) for p in bucket}
        self._started: list[tuple[torch.Tensor, Any]] = []
        """(flat buffer, work) of the buckets whose all-reduce has started this step, in bucket order."""
        self._pending = [0] * len(self._buckets)
        """Per bucket: parameters whose final gradient of the step has not arrived yet (while armed)."""
        self._armed = False
        self._final: set[int] = set()
        if self._distributed:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_final_grad)

    @staticmethod
    def _make_buckets(params: list[torch.nn.Parameter], cap_mb: float) -> list[list[torch.nn.Parameter]]:
        buckets: list[list[torch.nn.Parameter]] = []
        size = 0
        cap = cap_mb * 2**20
        for p in params:
            nbytes = p.numel() * p.element_size()
            same_kind = buckets and buckets[-1][0].dtype == p.dtype and buckets[-1][0].device == p.device
            if not same_kind or size + nbytes > cap:
                buckets.append([])
                size = 0
            buckets[-1].append(p)
            size += nbytes
        return buckets

    def _backward(self, loss: torch.Tensor) -> None:
        if not (self._distributed and self._manager().in_last_micro_batch()):
            loss.backward()
            return
        # the rank's last backward of the step: each bucket's all-reduce starts inside it (_on_final_grad)
        self._pending = [len(bucket) for bucket in self._buckets]
        self._final.clear()
        self._armed = True
        try:
            loss.backward()
        finally:
            self._armed = False

    def _on_final_grad(self, param: torch.Tensor) -> None:
        """post-accumulate-grad hook: ``param`` has its gradient of this backward."""
        if not self._armed:
            return
        if id(param) in self._final:
            raise EngineError(
                "a parameter received a second gradient in the last micro-batch's backward after its bucket's "
                "all-reduce had started: call backward once per micro-batch (sum the losses first)"
            )
        self._final.add(id(param))
        self._pending[self._bucket_of[id(param)]] -= 1
        self._start_ready_buckets()

    def _start_ready_buckets(self, *, all_: bool = False) -> None:
        """Start the all-reduce of every complete bucket (every bucket when ``all_``), strictly in bucket order."""
        while len(self._started) < len(self._buckets):
            i = len(self._started)
            if not all_ and self._pending[i] > 0:
                return
            self._started.append(all_reduce_grads_flat(self._buckets[i], self.group, async_op=True, release=True))

    def _fill_missing_grads(self) -> None:
        # a bucket started under the backward holds its gradients in its flat buffer (``release``): not missing
        started = {id(p) for bucket in self._buckets[:len(self._started)] for p in bucket}
        for p in self.module.parameters():
            if p.requires_grad and p.grad is None and id(p) not in started:
                p.grad = torch.zeros_like(p)

    def _reduce(self) -> None:
        if self._distributed:
            self._start_ready_buckets(all_=True)  # those the backward did not start (an idle rank: all)
            for bucket, (flat, work) in zip(self._buckets, self._started, strict=True):
                work.wait()
                copy_flat_into_grads(bucket, flat)
            self._started = []

    def _update(self) -> None:
        self.optimizer.step()
        lr = getattr(self._manager(), "_lr", None)
        if lr is not None:
            lr.restore()  # runtime.lr_scaling: the scheduler steps from the scheduled LR, never the scaled one
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()  # once per optimizer step, never per micro-batch
        self.optimizer.zero_grad(set_to_none=True)


def deepspeed_config(world_size: int, *, zero_stage: int = 1, user_config: dict[str, Any] | None = None,
                     precision: str = "fp32") -> dict:
    """The DeepSpeed config dict; the ONLY place batch and accumulation settings are derived.

    DCP chooses micro-batch sizes and ga_steps per step and per group, so DeepSpeed's own batch fields
    cannot describe them; they only feed DeepSpeed's sample counters. We declare one sample per rank per
    step (micro 1, gas 1, train_batch_size W, which satisfies DeepSpeed's
    train_batch_size = micro * gas * W check) and hand the accumulation boundary to the caller with
    managed_gradient_accumulation=false. Gradient clipping defaults to off (DeepSpeed's default is 1.0,
    which would silently change the exact mean-loss gradient); set it in ``user_config`` if wanted.
    ``precision`` ('bf16' or 'fp32', resolved) sets DeepSpeed's own bf16 mode: a bf16 module with fp32
    master weights and optimizer state in the ZeRO-1 shards; a user config that says otherwise is refused.
    """
    if precision not in ("bf16", "fp32"):
        raise EngineError(f"precision ({precision!r}) must be 'bf16' or 'fp32' here: resolve runtime.precision first")
    if zero_stage not in (0, 1):
        raise EngineError(
            f"zero_stage ({zero_stage}) is not supported: DCP's DeepSpeed adapter covers ZeRO-0/1; for sharded "
            "gradients and parameters use runtime.engine = 'fsdp2'"
        )
    fixed = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "managed_gradient_accumulation": False,
    }
    user = dict(user_config or {})
    clash = sorted(k for k in fixed if k in user and user[k] != fixed[k])
    if clash:
        raise EngineError(
            f"deepspeed config keys {clash} are set by DCP (it picks micro-batch sizes and ga_steps per step): "
            "remove them from the config you pass"
        )
    zero = {"stage": zero_stage, **user.pop("zero_optimization", {})}
    if zero.get("stage") != zero_stage:
        raise EngineError(f"zero_optimization.stage ({zero.get('stage')}) must be {zero_stage}: use ZeRO-1 (for "
                          "sharded gradients and parameters use runtime.engine = 'fsdp2')")
    want_bf16 = precision == "bf16"
    for key, want in (("bf16", want_bf16), ("fp16", False)):
        got = bool(user.get(key, {}).get("enabled", False)) if isinstance(user.get(key), dict) else None
        if got is not None and got != want:
            raise EngineError(
                f"deepspeed config {key}.enabled ({got}) contradicts runtime.precision ({precision!r}): DCP sets "
                "the precision from runtime.precision; remove the key or change runtime.precision"
            )
    cfg = {"gradient_clipping": 0.0, "steps_per_print": 2**31 - 1, "zero_allow_untested_optimizer": True}
    cfg.update(user)
    cfg.update(fixed)
    cfg["bf16"] = {**(user.get("bf16") or {}), "enabled": want_bf16}
    cfg["zero_optimization"] = zero
    return cfg


class DeepSpeedEngine(Engine):
    """DeepSpeed ZeRO-1 through its public API; gradients are averaged over W by DeepSpeed."""

    name = "deepspeed"

    def __init__(self, module: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, *,
                 world_size: int, config: dict[str, Any] | None = None, precision: str = "fp32") -> None:
        device = module_device(module)
        if device.type == "cpu":
            # DeepSpeed picks its accelerator once, at import; a CPU run (gloo) needs its CPU accelerator even
            # on a host with GPUs, or it would place the model on cuda:<local rank>.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        try:
            import deepspeed
            from deepspeed.accelerator import get_accelerator
        except ImportError as exc:
            raise EngineError(f"runtime.engine ('deepspeed') needs DeepSpeed ({exc}): pip install deepspeed") from None
        if optimizer is None:
            raise EngineError("optimizer (None) is required: pass a torch optimizer (ZeRO-1 shards its state)")
        check_accelerator(get_accelerator().device_name(), device)
        precision = resolve_precision(precision, device)
        self.ds_config = deepspeed_config(world_size, user_config=config, precision=precision)
        ds, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
            model=module, optimizer=optimizer, lr_scheduler=lr_scheduler, config=self.ds_config,
            dist_init_required=False,
        )
        if not (hasattr(ds, "managed_gradient_accumulation") and ds.managed_gradient_accumulation() is False):
            # Older DeepSpeed ignores the key and reduces after every backward: ranks with unequal
            # ga_steps would then run mismatched collectives (hang) or average wrong gradients.
            raise EngineError(
                f"DeepSpeed {getattr(deepspeed, '__version__', '?')} does not honour "
                "managed_gradient_accumulation=false, which DCP needs for unequal ga_steps per rank: "
                "pip install 'deepspeed>=0.19.4'"
            )
        super().__init__(module, ds_optimizer, ds_scheduler, precision=precision)
        self.ds = ds
        self.sync_divisor = world_size

    @property
    def forward_model(self) -> Callable[..., Any]:
        return self.ds

    def _autocast(self, cache: bool = False) -> Any:
        # DeepSpeed's bf16 mode already runs a bf16 module; the reference models compute their losses in
        # fp32 themselves, so no autocast on top (DeepSpeed has its own torch_autocast option for that).
        return autocast("fp32", self.device)

    def _backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss, scale_wrt_gas=False)

    def _fill_missing_grads(self) -> None:
        pass  # DeepSpeed's ZeRO optimizer owns the gradient buffers: never assign .grad behind its back

    def idle_step(self) -> None:
        # ZeRO-1 sets up its reduction buckets in backward, so a rank without micro-batches runs a backward
        # of an exact zero that touches every parameter (no model forward), then joins the reduction.
        zero = sum((p.reshape(-1)[:1] * 0.0).sum() for p in self.module.parameters() if p.requires_grad)
        self.ds.backward(zero, scale_wrt_gas=False)
        super().idle_step()

    def _reduce(self) -> None:
        pass  # DeepSpeed reduces inside its step()

    def _checked_grads(self) -> list[torch.Tensor]:
        return []  # ZeRO owns the gradient buffers and reduces them inside step(): the guard checks the losses

    def _update(self) -> None:
        # Unmanaged accumulation: step() reduces the locally accumulated gradients over all ranks, applies
        # the update, steps the LR scheduler once and zeroes the gradients.
        self.ds.step()


def check_accelerator(accelerator: str, device: torch.device) -> None:
    """Raise EngineError when DeepSpeed's accelerator ('cpu', 'cuda', ...) is not where the model lives."""
    if accelerator != device.type:
        raise EngineError(
            f"DeepSpeed's accelerator ({accelerator!r}) differs from the model's device ({device}): DeepSpeed picks it "
            f"at its first import; set DS_ACCELERATOR={device.type} before importing deepspeed (CPU runs: "
            "DS_ACCELERATOR=cpu) or move the model to the accelerator's device"
        )


def build_engine(name: str, module: torch.nn.Module, optimizer: Any, lr_scheduler: Any, *, world_size: int,
                 deepspeed_config: dict[str, Any] | None = None, precision: str = "fp32") -> Engine:
    """An engine by name (runtime.engine): 'ddp', 'deepspeed' or 'fsdp2'; ``precision`` is runtime.precision."""
    if name in ("fsdp2", "fsdp2-zero3"):
        from dcp.runtime.fsdp import FSDP2Engine  # lazily: it needs torch.distributed.fsdp

        return FSDP2Engine(module, optimizer, lr_scheduler, precision=precision,
                           reshard_after_forward=name == "fsdp2-zero3")
    if name == "ddp":
        return DDPEngine(module, optimizer, lr_scheduler, precision=precision)
    if name == "deepspeed":
        return DeepSpeedEngine(module, optimizer, lr_scheduler, world_size=world_size, config=deepspeed_config,
                               precision=precision)
    raise EngineError(f"engine ({name!r}) is not one of {list(ENGINES)}: pick one of those or pass an Engine")
