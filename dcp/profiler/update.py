"""Measured once-per-step costs: the gradient sync over all ranks and the optimizer update.

The dual-layer rows time what one micro-batch costs; a step also pays, once, the gradient collective and
the optimizer update. ``measure_step_update`` times both on the job's own ranks, for the model's
parameter count, without touching the model or its optimizer:

- gradient sync: the ddp engine's own sequence (flatten the gradients, SUM all-reduce over the world
  group, copy back); ZeRO-1's reduce-scatter + all-gather move the same bytes;
- optimizer update: a fresh optimizer of the job's class and defaults (AdamW when none is given) stepping
  over stand-in parameters: tensors shaped like the model's for the ddp engine (per-tensor overhead is a
  large part of a small model's update), one flat 1/W shard for ZeRO-1 (DeepSpeed flattens it).

Stand-ins stop at ``max_elements`` (whole tensors, at least one) and the measured time is scaled linearly
by the true element count (both are bandwidth-bound at that size), so profiling a large model inside a training run never
allocates another copy of its parameters and optimizer state. Every rank must call it (collective); each
figure is the median over ``iters`` timed repetitions, then the MAX over ranks, identical everywhere.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

MAX_ELEMENTS = 1 << 24
"""Largest stand-in buffer (elements); 64 MiB in fp32."""


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """Once-per-step times measured on the job's ranks (seconds; the slowest rank's)."""

    grad_sync_s: float
    """All-reduce of the gradients over all ranks (0 on one rank)."""
    optimizer_step_s: float
    """Optimizer update of this rank's parameters (all of them for ddp, a 1/W shard for ZeRO-1)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Any, iters: int, device: torch.device) -> float:
    """Median seconds of ``iters`` calls of ``fn`` after one warm-up, the device drained around each."""
    fn()  # warm-up: first-call allocation and communicator set-up
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_step_update(
    module: torch.nn.Module,
    *,
    world_size: int,
    optimizer: torch.optim.Optimizer | None = None,
    engine: str = "ddp",
    iters: int = 5,
    max_elements: int = MAX_ELEMENTS,
) -> StepUpdate:
    """Time the step's gradient sync and optimizer update for ``module`` on ``world_size`` ranks."""
    if iters < 1:
        raise ValueError(f"iters ({iters}) must be >= 1: pass how many timed repetitions to take the median of")
    engine = "fsdp2" if engine == "fsdp2-zero3" else engine  # the same sharded update
    if engine not in ("ddp", "deepspeed", "fsdp2"):
        raise ValueError(f"engine ({engine!r}) is not 'ddp', 'deepspeed' or 'fsdp2': pass the runtime's engine name")
    params = [p for p in module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    if numel == 0:
        return StepUpdate(grad_sync_s=0.0, optimizer_step_s=0.0)
    first = params[0]
    device, dtype = first.device, first.dtype

    # Stand-ins shaped like the update the engine runs. The ddp engine keeps every parameter tensor and
    # updates them one by one (per-tensor optimizer overhead counts: AdamW over 30 small tensors costs ~3x
    # one flat tensor of the same size on CPU), and flattens the gradients into one buffer for the
    # all-reduce and copies them back. ZeRO-1 updates a flat fp32 shard of 1/W of the parameters.
    if engine == "deepspeed":
        total = math.ceil(numel / world_size)
        shapes = [(min(total, max_elements),)]
    elif engine == "fsdp2":  # every parameter's 1/W shard, updated tensor by tensor
        total, shapes, kept = math.ceil(numel / world_size), [], 0
        for p in params:
            shard = math.ceil(p.numel() / world_size)
            if kept and kept + shard > max_elements:
                break
            shapes.append((shard,))
            kept += shard
    else:
        total, shapes, kept = numel, [], 0
        for p in params:
            if kept and kept + p.numel() > max_elements:
                break
            shapes.append(tuple(p.shape))
            kept += p.numel()
    stand_ins = [torch.zeros(shape, device=device, dtype=dtype, requires_grad=True) for shape in shapes]
    for t in stand_ins:
        t.grad = torch.full_like(t, 1e-3)
    scale = total / sum(t.numel() for t in stand_ins)

    sync_s = 0.0
    if world_size > 1:
        from dcp.distributed.comm import all_reduce_grads_flat, copy_flat_into_grads

        def all_reduce_grads(tensors: list[torch.Tensor] = stand_ins) -> None:
            flat, _ = all_reduce_grads_flat(tensors)
            copy_flat_into_grads(tensors, flat)

        # the whole gradient crosses the network whatever the engine: scale by its size (fsdp2's all-gather plus
        # reduce-scatter move the bytes of one all-reduce)
        sync_s = median_time(all_reduce_grads, iters, device) * numel / sum(t.numel() for t in stand_ins)

    try:
        opt = type(optimizer)(stand_ins, **optimizer.defaults) if optimizer is not None else None
    except TypeError:  # an optimizer whose constructor does not take its own defaults back
        opt = None
    opt = opt or torch.optim.AdamW(stand_ins)
    opt_s = median_time(opt.step, iters, device) * scale
    del opt, stand_ins

    figures = [sync_s, opt_s]
    if world_size > 1:
        import torch.distributed as dist

        from dcp.distributed.comm import all_reduce_values

        figures = all_reduce_values(figures, dist.ReduceOp.MAX)
    return StepUpdate(grad_sync_s=float(figures[0]), optimizer_step_s=float(figures[1]))
