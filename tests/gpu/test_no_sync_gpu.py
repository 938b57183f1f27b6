"""On CUDA, a micro-batch's forward and backward make no host-device sync (``set_sync_debug_mode("error")``
turns any sync into an error), for both reference models, with padding, packing and recompute, with
SDPA (and flash-attn when installed). The CPU counterpart is tests/unit/test_no_host_sync.py."""

from __future__ import annotations

import pytest
import torch

from dcp.data import collate_tokens, collate_video
from dcp.models import build_model
from dcp.runtime.context import SPContext

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _batch(name: str, device: str):
    gen = torch.Generator().manual_seed(0)
    if name.startswith("t1d"):
        batch = collate_tokens([torch.randint(0, 256, (n,), generator=gen) for n in (77, 130, 5)])
    else:
        shapes = [(5, 24), (3, 31)]
        batch = collate_video([(torch.randn(t, s, 8, generator=gen), torch.randn(t, s, 8, generator=gen))
                               for t, s in shapes])
    return batch.to(device)  # moving the batch is the data loader's copy, outside the micro-batch


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
@pytest.mark.parametrize("recompute_layers", [0, 2])
def test_micro_batch_makes_no_sync(name, recompute_layers):
    model = build_model(name).to("cuda")
    batch = _batch(name, "cuda")
    ctx = SPContext.single(recompute_layers=recompute_layers)
    loss, count = model(batch, ctx)  # warm-up: lazy CUDA init, kernel selection
    (loss / count).backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, count = model(batch, ctx)
        (loss / count).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.isfinite(loss).item()
