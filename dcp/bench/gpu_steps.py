"""What one GPU does during a micro-batch, for ``dcp bench gpu``: host syncs, how busy the GPU is, host vs GPU time.

Each function takes its device explicitly; ``train_step`` is the whole-model forward + backward every check
times.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any


def sync_device(device: Any) -> None:
    """Wait for the device's queued work (CUDA); nothing on CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model: Any, batch: Any, ctx: Any, recompute_layers: int, precision: str, device: Any,
               reentrant: bool = False) -> None:
    """One whole-model forward + backward with the first ``recompute_layers`` layers checkpointed."""
    from torch.utils.checkpoint import checkpoint

    from dcp.distributed import autocast

    with autocast(precision, device):
        if reentrant and recompute_layers:
            # the saved-tensor meter (CPU) sees a reentrant checkpoint's recomputation; non-reentrant hides it
            def recompute(layer: Any, hidden: Any, c: Any, aux: Any) -> Any:
                return checkpoint(layer, hidden, c, aux, use_reentrant=True)

            loss, _ = model(batch, ctx, recompute=recompute)
        else:
            loss, _ = model(batch, ctx.replace(recompute_layers=recompute_layers))
    loss.backward()


SYNC_WARNING = "called a synchronizing cuda operation"
"""What torch's sync debug mode ('warn') says, lower-cased, once per host-device synchronisation."""


def count_cuda_syncs(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn's result, host-device synchronisations it made), counted with ``torch.cuda.set_sync_debug_mode``
    ('warn': one warning per sync, recorded here). The warnings fn raises otherwise are recorded too, and
    shown again afterwards without de-duplication."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    syncs = 0
    for w in caught:
        text = str(w.message).lower()
        if SYNC_WARNING in text:
            syncs += 1
        elif "synchronization debug mode is a prototype feature" not in text:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, syncs


def syncs_per_micro_batch(model: Any, batch: Any, device: Any, precision: str) -> int:
    """Host-device synchronisations during one forward + backward (CUDA only), counted with the sync
    debug mode: every sync raises a warning, which is recorded instead of printed."""
    from dcp.runtime.context import SPContext

    ctx = SPContext.single(attention="auto")
    train_step(model, batch, ctx, 0, precision, device)  # warm-up outside the counted region
    sync_device(device)
    _, syncs = count_cuda_syncs(lambda: train_step(model, batch, ctx, 0, precision, device))
    sync_device(device)
    model.zero_grad(set_to_none=True)
    return syncs


def busy_union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (kernels on several streams may overlap)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def gpu_busy_fraction(model: Any, batch: Any, device: Any, precision: str, reps: int = 7) -> float:
    """Kernel-busy time / wall time of one forward + backward of ``batch`` (CUDA only): see busy_and_wall_s."""
    return busy_and_wall_s(model, batch, device, precision, reps)[0]


def busy_and_wall_s(model: Any, batch: Any, device: Any, precision: str, reps: int = 7) -> tuple[float, float]:
    """(busy share, median wall seconds) of one forward + backward of ``batch``; the share is NaN off CUDA.

    The kernels' busy time is the union of their intervals in one step under torch.profiler; the wall time
    is the median of ``reps`` steps run WITHOUT the profiler, whose per-launch bookkeeping would stretch the
    wall of a launch-bound step (a 1024-token step read 0.51-0.74 busy under it on an H100, against 0.85
    with the wall taken apart)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from dcp.runtime.context import SPContext

    ctx = SPContext.single(attention="auto")
    for _ in range(2):
        train_step(model, batch, ctx, 0, precision, device)
    walls = []
    for _ in range(reps):
        sync_device(device)
        t0 = time.perf_counter()
        train_step(model, batch, ctx, 0, precision, device)
        sync_device(device)
        walls.append(time.perf_counter() - t0)
    wall_s = statistics.median(walls)
    if device.type != "cuda":
        model.zero_grad(set_to_none=True)
        return float("nan"), wall_s
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step(model, batch, ctx, 0, precision, device)
        sync_device(device)
    model.zero_grad(set_to_none=True)
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = min(1.0, busy_union_us(kernels) / (wall_s * 1e6)) if wall_s > 0 else float("nan")
    return busy, wall_s


def host_and_gpu_ms(model: Any, batch: Any, device: Any, precision: str, reps: int = 7) -> tuple[float | None, float | None]:
    """(host ms, GPU ms) of one forward + backward (CUDA only), medians: the host's time to enqueue the step
    while the GPU is held by a sleep kernel, and the GPU's time for it with its queue full. The busy share
    of a step run alone cannot exceed GPU / max(host, GPU): below 0.9 with host > GPU, the host is the limit.
    (None, None) when the hold never covered the host (it blocked inside the step, e.g. on a full launch
    queue), so that no such figure exists."""
    from dcp.profiler.clock import RegionClock
    from dcp.runtime.context import SPContext

    ctx = SPContext.single(attention="auto")
    clock = RegionClock("pipelined", device)
    host, gpu = [], []
    for i in range(reps + 2):
        clock.time(lambda: train_step(model, batch, ctx, 0, precision, device), "step")
        if i >= 2 and clock.last_covered:
            host.append(clock.last_host_s * 1e3)
            gpu.append(clock.last_device_s * 1e3)
    model.zero_grad(set_to_none=True)
    if not host:
        return None, None
    return statistics.median(host), statistics.median(gpu)
