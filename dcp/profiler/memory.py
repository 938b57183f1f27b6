"""Memory meters for the dual-layer profiler.

Two ways to answer "how many bytes does this region keep for backward, and what is its peak":

- :class:`AllocatorMeter` (CUDA): the caching allocator's counters. ``memory_allocated`` before/after a
  region gives what it keeps; ``max_memory_allocated`` after ``reset_peak_memory_stats`` gives its peak,
  transient buffers included.
- :class:`SavedTensorMeter` (CPU, or anywhere): bytes of the tensors autograd saves for backward,
  counted through ``torch.autograd.graph.saved_tensors_hooks``. Tensors that share a storage count once
  (a view saved by three ops costs one storage), and parameters (or any storage passed as ``exclude``)
  are not activations. Each saved tensor is wrapped in a small holder whose destructor gives its bytes
  back, so the meter also knows the *live* saved bytes at any moment and their peak: when backward
  frees a graph node, its holders die and the bytes leave the count.

A CPU has no device memory limit; ``SavedTensorMeter(capacity_bytes=...)`` emulates one by raising
:class:`EmulatedOutOfMemory` as soon as the live bytes plus a fixed base (parameters, gradients,
optimizer state) would exceed it. The profiler treats that exactly like ``torch.OutOfMemoryError`` on a
GPU: the candidate is marked infeasible and profiling goes on.

Note: non-reentrant ``torch.utils.checkpoint`` packs the recomputed tensors with its own hooks, which
hide them from this meter; the profiler therefore runs its layers itself (it never relies on checkpoint
to observe memory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


class EmulatedOutOfMemory(RuntimeError):
    """Live saved bytes plus the base exceeded the emulated capacity (CPU stand-in for a GPU OOM)."""


def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "this candidate does not fit" (GPU OOM and the CPU emulation)."""
    errors: list[type[BaseException]] = [EmulatedOutOfMemory]
    for owner, name in ((torch, "OutOfMemoryError"), (torch.cuda, "OutOfMemoryError")):
        err = getattr(owner, name, None)
        if isinstance(err, type) and err not in errors:
            errors.append(err)
    return tuple(errors)


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """Identity of a tensor's storage while it is alive: (device, data pointer)."""
    st = t.untyped_storage()
    return (str(t.device), st.data_ptr())


def storage_bytes(t: torch.Tensor) -> int:
    """Bytes of the whole storage behind ``t`` (a saved view keeps all of it alive)."""
    return t.untyped_storage().nbytes()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the local shard of a DTensor (fsdp2's parameters, gradients and optimizer
    state), else ``t``."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def unique_storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages among ``tensors`` (non-tensors are skipped; a DTensor counts its local
    shard)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = local(t)
            seen.setdefault(storage_key(t), storage_bytes(t))
    return sum(seen.values())


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside nested tuples/lists/dicts/dataclasses (aux values passed to layers)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in tensors_in(v)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name))]
    return []


@dataclass(kw_only=True, slots=True, frozen=True)
class StateBytes:
    """Memory outside activations: parameters, their gradients, and optimizer state (bytes per rank)."""

    params_bytes: int
    """Bytes of the model's parameters."""
    grads_bytes: int
    """Bytes of their gradients (one per trainable parameter, same dtype)."""
    optimizer_bytes: int
    """Bytes of optimizer state (measured from an optimizer, or estimated per parameter)."""

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, optimizer_bytes_per_param: int = 8
) -> StateBytes:
    """Parameters + gradients + optimizer state of ``model``.

    With an ``optimizer`` whose state exists (after its first step) the state tensors are counted; before
    that, or without one, ``optimizer_bytes_per_param`` (Adam in fp32: 8) times the trainable parameter
    count is used, so the figure does not depend on whether a step has run yet.
    """
    params = [p for p in model.parameters()]
    params_b = unique_storage_bytes(params)
    trainable = [p for p in params if p.requires_grad]
    grads_b = sum(local(p).numel() * p.element_size() for p in trainable)
    opt_b = 0
    if optimizer is not None:
        opt_b = unique_storage_bytes(t for s in optimizer.state.values() for t in tensors_in(s) if t.dim() > 0)
    if opt_b == 0:
        opt_b = sum(local(p).numel() for p in trainable) * optimizer_bytes_per_param
    return StateBytes(params_bytes=params_b, grads_bytes=grads_b, optimizer_bytes=opt_b)


class _Held:
    """A saved tensor inside the autograd graph; gives its storage back to the meter when freed."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor: torch.Tensor, key: tuple[str, int] | None, meter: SavedTensorMeter) -> None:
        self.tensor = tensor
        self.key = key
        self.meter = meter

    def __del__(self) -> None:
        if self.key is not None:
            self.meter._release(self.key)


class SavedTensorMeter:
    """Counts unique storages saved for backward inside ``with meter:`` (see the module docstring).

    ``saved_bytes`` is the sum over every distinct storage saved while the meter was active (what the
    region's graph holds right after its forward); ``live_bytes`` / ``peak_bytes`` follow frees during
    backward. Storages in ``exclude`` (parameters, inputs counted elsewhere) are never counted.
    """

    def __init__(
        self,
        *,
        exclude: Iterable[torch.Tensor] = (),
        capacity_bytes: float | None = None,
        base_bytes: float = 0.0,
    ) -> None:
        self._exclude = {storage_key(t) for t in exclude}
        self._live: dict[tuple[str, int], list[int]] = {}  # key -> [refcount, bytes]
        self.saved_storages: dict[tuple[str, int], int] = {}
        """Every distinct storage saved while active: key -> bytes (see storage_key)."""
        self.capacity_bytes = capacity_bytes
        self.base_bytes = float(base_bytes)
        self.saved_bytes = 0
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks: Any = None

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stop counting these storages from now on (they are accounted elsewhere)."""
        self._exclude.update(storage_key(t) for t in tensors)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _pack(self, t: torch.Tensor) -> _Held:
        key = storage_key(t)
        if key in self._exclude or t.device.type == "meta":
            return _Held(t, None, self)
        entry = self._live.get(key)
        if entry is None:
            nbytes = storage_bytes(t)
            over = self.capacity_bytes is not None and self.base_bytes + self.live_bytes + nbytes > self.capacity_bytes
            if over:
                raise EmulatedOutOfMemory(
                    f"saved activations ({(self.live_bytes + nbytes) / 2**20:.1f} MiB) plus state "
                    f"({self.base_bytes / 2**20:.1f} MiB) exceed the emulated capacity "
                    f"({self.capacity_bytes / 2**20:.1f} MiB)"
                )
            self._live[key] = [1, nbytes]
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            if key not in self.saved_storages:
                self.saved_storages[key] = nbytes
                self.saved_bytes += nbytes
        else:
            entry[0] += 1
        return _Held(t, key, self)

    def _release(self, key: tuple[str, int]) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self._live[key]
            self.live_bytes -= entry[1]

    @staticmethod
    def _unpack(held: _Held) -> torch.Tensor:
        return held.tensor

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None


class AllocatorMeter:
    """CUDA allocator counters around a region: kept bytes (after - before) and peak above the start."""

    def __init__(self, device: torch.device | int | None = None) -> None:
        self.device = device
        self.start_bytes = 0
        self.end_bytes = 0
        self.peak_bytes = 0

    def __enter__(self) -> AllocatorMeter:
        torch.cuda.synchronize(self.device)
        self.start_bytes = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize(self.device)
        self.end_bytes = torch.cuda.memory_allocated(self.device)
        self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self.start_bytes

    @property
    def kept_bytes(self) -> int:
        """Bytes allocated inside the region that are still alive at its end."""
        return self.end_bytes - self.start_bytes


def free_cached_memory() -> None:
    """After an OOM: drop references the caller released and return cached blocks to the device."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
