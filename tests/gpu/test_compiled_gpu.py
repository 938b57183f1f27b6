"""runtime.compile on CUDA (skipped without a GPU): Inductor-compiled blocks against eager in bf16 (autocast over
fp32 weights, as the ddp engine runs), and no recompilation for a new document layout."""

from __future__ import annotations

import copy

import pytest
import torch

from dcp.data import collate_tokens
from dcp.distributed import autocast
from dcp.models import build_model
from dcp.runtime.compiled import compile_layers
from dcp.runtime.context import SPContext

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    with autocast("bf16", "cuda"):
        loss, count = model(batch, SPContext.single(attention="sdpa"))
    (loss / count).backward()
    return loss.detach().float(), [p.grad.float() for p in model.parameters()]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def test_inductor_blocks_match_eager_and_keep_their_graphs():
    torch._dynamo.reset()
    eager = build_model("t1d-tiny").cuda()
    compiled = copy.deepcopy(eager)
    compile_layers(compiled, "default")
    gen = torch.Generator().manual_seed(0)
    # one row (static, then dynamic), packed rows (twice: a view vs a new tensor after attention), then new ones
    layouts = [(64,), (96,), (50, 30, 16), (77, 130, 5), (128,), (9, 8, 7, 6), (200, 3)]
    for i, lengths in enumerate(layouts):
        batch = collate_tokens([torch.randint(0, 256, (n,), generator=gen) for n in lengths]).to("cuda")
        with torch._dynamo.config.patch(error_on_recompile=i >= 4):
            loss_c, grads_c = _step(compiled, batch)
        loss_e, grads_e = _step(eager, batch)
        # bf16: fused kernels round differently from eager's; a few parts in a thousand
        assert _rel_err(loss_c, loss_e) < 1e-2
        assert max(_rel_err(a, b) for a, b in zip(grads_c, grads_e, strict=True)) < 5e-2
    torch._dynamo.reset()
