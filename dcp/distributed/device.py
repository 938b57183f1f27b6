"""Where a run computes and in what precision.

``runtime.precision`` is 'auto' (bf16 on CUDA, fp32 elsewhere), 'bf16' or 'fp32'. bf16 keeps fp32 master
weights and optimizer state: the ddp engine runs its forward under ``torch.autocast(bfloat16)`` over fp32
parameters (on CPU too), DeepSpeed runs its own bf16 mode (bf16 module, fp32 master shards in ZeRO-1).
Losses and token counts are accumulated in fp64 / int64 whatever the precision.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch

PRECISIONS = ("auto", "bf16", "fp32")
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """'bf16' or 'fp32' for ``precision`` on ``device`` ('auto': bf16 on CUDA, fp32 elsewhere)."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"runtime.precision ({precision!r}) is not one of {list(PRECISIONS)}: pick one of those"
        )
    if precision != "auto":
        return precision
    return "bf16" if torch.device(device).type == "cuda" else "fp32"


def compute_dtype(precision: str) -> torch.dtype:
    """torch dtype of a resolved precision ('bf16' or 'fp32')."""
    if precision not in _DTYPES:
        raise ValueError(f"precision ({precision!r}) must be resolved to 'bf16' or 'fp32': call resolve_precision")
    return _DTYPES[precision]


def autocast(precision: str, device: torch.device | str, *, cache: bool = False) -> contextlib.AbstractContextManager:
    """``torch.autocast(device_type, bfloat16)`` for 'bf16'; a no-op context for 'fp32'.

    Autocast's weight-cast cache is off by default. A training forward uses each weight once, so the cache
    saves no cast; what it does is keep every layer's bf16 weight copy alive until the forward ends, also
    for a checkpointed layer, which would otherwise keep only its input: on an H100, 8 recomputed layers of
    Transformer-1D 5B held 1.3-1.5 GiB more than Eq. 6 predicted. Without it, a layer's bf16 weight copies
    live exactly as long as the layer keeps them for backward, which the profiler counts in its m_act.
    (``advanced.cache_weight_casts`` turns it on for micro-batches without recomputed layers, whose copies the
    ddp engine then keeps for the step's later micro-batches: dcp.runtime.weight_casts.)"""
    if compute_dtype(precision) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, cache_enabled=cache)


def module_device(module: Any) -> torch.device:
    """Device of a module's first parameter (or buffer); CPU for a module without either."""
    for tensors in (module.parameters(), module.buffers()):
        t = next(iter(tensors), None)
        if t is not None:
            return t.device
    return torch.device("cpu")


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without a host-device sync: a host tensor bound for CUDA is pinned and copied
    non-blocking (ordered on the current stream before later kernels); anything else is a plain ``.to``."""
    device = torch.device(device)
    if t.device == device:
        return t
    pin = device.type == "cuda" and t.device.type == "cpu"
    return (t.pin_memory() if pin else t).to(device, non_blocking=pin)


def move_batch(batch: Any, device: torch.device) -> Any:
    """``batch`` on ``device``; host batches are pinned and copied without blocking the host.

    A Batch (dataclass with tensor ``inputs`` / ``targets``) is copied field by field from pinned memory
    (``non_blocking=True``: no host-device synchronisation, the copy is ordered on the current stream before
    the forward's kernels). Other objects with ``.to(device)`` are moved with it; anything else is returned
    as is. Nothing is done on CPU or when the tensors already live on ``device``.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return batch
    if dataclasses.is_dataclass(batch) and isinstance(getattr(batch, "inputs", None), torch.Tensor):
        changes = {}
        for name in ("inputs", "targets"):
            t = getattr(batch, name, None)
            if isinstance(t, torch.Tensor) and t.device != device:
                changes[name] = to_device_async(t, device)
        return dataclasses.replace(batch, **changes) if changes else batch
    if hasattr(batch, "to"):
        return batch.to(device)
    return batch


class Span:
    """A timed region; ``seconds()`` gives its length (on CUDA it waits for the region's end event)."""

    __slots__ = ("_start", "_end", "_seconds")

    def __init__(self, seconds: float | None = None, start: Any = None, end: Any = None) -> None:
        self._seconds, self._start, self._end = seconds, start, end

    def seconds(self) -> float:
        if self._seconds is None:
            self._end.synchronize()  # the one host-device wait, taken when the figure is read
            self._seconds = self._start.elapsed_time(self._end) / 1e3
        return self._seconds


class Stopwatch:
    """Times regions on a device without host-device synchronisation inside them.

    CPU (and other non-CUDA devices): ``time.perf_counter`` at start and stop. CUDA: a pair of timing events
    recorded on the current stream, so the span is the GPU's time for the region's work (kernel launches
    are asynchronous: a host clock would time the launches, not the work); it is resolved only when
    ``Span.seconds()`` is read, e.g. when a logged step's stats are exchanged anyway.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def start(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, token: Any) -> Span:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            return Span(start=token, end=end)
        return Span(seconds=time.perf_counter() - token)
