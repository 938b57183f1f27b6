"""Collectives with tensors their group's backend accepts.

NCCL takes CUDA tensors only; gloo takes CPU tensors (and a few CUDA ops, which we do not rely on). The
manager's plan-check group is gloo on purpose (a timeout of its own, CPU-side digests) even when the
world group is NCCL, so every small collective asks :func:`backend_device` for its group instead of
assuming the run's device or the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def device_for_backend(backend: str, cuda_index: int | None = None) -> torch.device:
    """The device whose tensors ``backend`` (``dist.get_backend`` text) takes: CPU for gloo/mpi or a mixed
    'cpu:gloo,cuda:nccl' group, else CUDA (``cuda_index``, default the current device)."""
    name = backend.lower()
    if "gloo" in name or "mpi" in name or name.startswith("cpu:"):
        return torch.device("cpu")
    if "nccl" in name or "cuda:" in name:
        return torch.device("cuda", torch.cuda.current_device() if cuda_index is None else cuda_index)
    return torch.device("cpu")


def backend_device(group: Any = None) -> torch.device:
    """Device for tensors of a collective on ``group`` (None: the world group); CPU without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    return device_for_backend(str(dist.get_backend(group)))


def all_reduce_values(values: Sequence[float], op: Any = None, group: Any = None,
                      dtype: torch.dtype = torch.float64) -> list[float]:
    """All-reduce a few Python numbers on ``group`` (default op SUM) and return them as floats.

    The tensor is made on the group's backend device, so the same call works on a gloo group and on an
    NCCL one (one small host-device copy each way on CUDA: call it at step or phase boundaries only).
    """
    t = torch.tensor(list(values), dtype=dtype, device=backend_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op, group=group)
    return [float(v) for v in t.tolist()]


def all_reduce_grads_flat(tensors: list[torch.Tensor], group: Any = None, *, async_op: bool = False,
                          release: bool = False) -> tuple:
    """Start a SUM all-reduce of the ``.grad`` of ``tensors`` as one flat buffer: (flat, work or None).

    One collective per buffer instead of one per tensor; :func:`copy_flat_into_grads` writes the result
    back (after ``work.wait()`` when async). The buffer lives where the gradients live: NCCL groups need
    CUDA parameters, which the ddp engine checks once at start. The ddp engine runs this per bucket, the
    profiler times it.
    """
    flat = torch.cat([t.grad.reshape(-1) for t in tensors])
    if release:
        for t in tensors:
            t.grad = None
    work = dist.all_reduce(flat, group=group, async_op=async_op)
    return flat, work


def copy_flat_into_grads(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Write consecutive slices of ``flat`` back into the ``.grad`` of ``tensors`` (the inverse of the cat)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        piece = flat[offset : offset + n].view_as(t)
        if t.grad is None:
            t.grad = piece
        else:
            t.grad.copy_(piece)
        offset += n


def check_backend_device(backend: str, device: torch.device, what: str) -> None:
    """Raise ValueError when tensors on ``device`` cannot go through a ``backend`` collective."""
    want = device_for_backend(backend, cuda_index=0).type
    if want == "cuda" and device.type != "cuda":
        raise ValueError(
            f"{what} ({device}) cannot take part in a {backend} collective, which needs CUDA tensors: move the "
            "model to its rank's GPU (model.to(f'cuda:{LOCAL_RANK}')) before set_manager, or use the gloo backend"
        )
