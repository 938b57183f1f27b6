"""Measured once-per-step costs: the gradient sync over all ranks and the optimizer update.

The dual-layer rows time what one micro-batch costs; a step also pays, once, the gradient collective and
the optimizer update. ``measure_step_update`` times both on the job's own ranks, for the model's
parameter count, without touching the model or its optimizer:

- gradient sync: a SUM all-reduce of a flat fp buffer of the model's gradient size over the world group
  (DCP's ddp engine runs exactly this; ZeRO-1's reduce-scatter + all-gather move the same bytes);
- optimizer update: a fresh optimizer of the job's class and defaults (AdamW when none is given) stepping
  over a flat stand-in parameter: the whole model for the ddp engine, this rank's 1/W shard for ZeRO-1.

Buffers are capped at ``max_elements`` and the measured time is scaled linearly by the true element
count (both are bandwidth-bound at that size), so profiling a large model inside a training run never
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


def _median_time(fn: Any, iters: int, device: torch.device) -> float:
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
    if engine not in ("ddp", "deepspeed"):
        raise ValueError(f"engine ({engine!r}) is not 'ddp' or 'deepspeed': pass the runtime's engine name")
    params = [p for p in module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    if numel == 0:
        return StepUpdate(grad_sync_s=0.0, optimizer_step_s=0.0)
    first = params[0]
    device, dtype = first.device, first.dtype

    sync_s = 0.0
    if world_size > 1:
        import torch.distributed as dist

        n = min(numel, max_elements)
        buf = torch.ones(n, device=device, dtype=dtype)
        sync_s = _median_time(lambda: dist.all_reduce(buf), iters, device) * (numel / n)
        del buf

    # ZeRO-1 updates a 1/W shard per rank; the ddp engine updates every parameter on every rank.
    shard = math.ceil(numel / world_size) if engine == "deepspeed" else numel
    n = min(shard, max_elements)
    stand_in = torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
    stand_in.grad = torch.full_like(stand_in, 1e-3)
    try:
        opt = type(optimizer)([stand_in], **optimizer.defaults) if optimizer is not None else None
    except TypeError:  # an optimizer whose constructor does not take its own defaults back
        opt = None
    opt = opt or torch.optim.AdamW([stand_in])
    opt_s = _median_time(opt.step, iters, device) * (shard / n)
    del opt, stand_in

    figures = [sync_s, opt_s]
    if world_size > 1:
        import torch.distributed as dist

        t = torch.tensor(figures, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        figures = t.tolist()
    return StepUpdate(grad_sync_s=float(figures[0]), optimizer_step_s=float(figures[1]))
