"""No host reads of tensor values inside a micro-batch (on CUDA each one is a host-device sync).

A dispatch mode fails on every op that hands a tensor's value to the host or makes an output size depend
on values: ``.item()``/``bool()``/``int()`` (``_local_scalar_dense``), ``nonzero``, boolean indexing,
``masked_select``, and tensors built from host data (``torch.tensor(list)``, ``as_tensor``: a blocking
host-to-device copy on CUDA); ``tolist`` is patched since it does not dispatch. The forward AND backward
of both reference models run under it, with padding, packing and recompute. tests/gpu checks the same
with ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dcp.data import collate_tokens, collate_video
from dcp.models import build_model
from dcp.runtime.context import SPContext

_HOST_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.lift_fresh.default,
    torch.ops.aten.lift_fresh_copy.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
}


class HostReadError(AssertionError):
    pass


class NoHostReads(TorchDispatchMode):
    """Raise HostReadError on any op that reads a tensor value on the host."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise HostReadError(f"{func} reads a tensor value on the host (a sync on CUDA)")
        if func is torch.ops.aten.index.Tensor and any(
                i is not None and i.dtype == torch.bool for i in args[1]):
            raise HostReadError("boolean indexing reads the mask on the host (a sync on CUDA)")
        return func(*args, **kwargs)


@pytest.fixture
def no_tolist(monkeypatch):
    def refuse(self):
        raise HostReadError("Tensor.tolist reads values on the host")

    monkeypatch.setattr(torch.Tensor, "tolist", refuse)


def test_the_guard_catches_host_reads(no_tolist):
    mask = torch.ones(3, dtype=torch.bool)
    for read in (lambda: bool(mask.all()), lambda: int(mask.sum()), lambda: mask.nonzero(),
                 lambda: torch.as_tensor([1, 2]), lambda: torch.zeros(3)[mask], lambda: mask.tolist()):
        with pytest.raises(HostReadError), NoHostReads():
            read()


def _batches(name):
    g = torch.Generator().manual_seed(0)
    if name.startswith("t1d"):
        return [collate_tokens([torch.randint(0, 256, (n,), generator=g) for n in lens])
                for lens in ((7, 7), (9, 4, 6))]  # equal lengths; unequal (packed into documents)
    shapes = [[(2, 4), (2, 4)], [(3, 5), (2, 3)]]
    return [collate_video([(torch.randn(t, s, 8, generator=g), torch.randn(t, s, 8, generator=g))
                           for t, s in sh]) for sh in shapes]


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
@pytest.mark.parametrize("recompute_layers", [0, 2])
def test_forward_and_backward_read_nothing_on_the_host(name, recompute_layers, no_tolist):
    model = build_model(name, num_layers=2)
    ctx = SPContext.single(recompute_layers=recompute_layers, attention="sdpa")
    for batch in _batches(name):
        with NoHostReads():
            loss, count = model(batch, ctx)
            (loss / count).backward()
        assert all(p.grad is not None for p in model.parameters())
