"""CUDA checks (skipped without a GPU): flash-attn against SDPA (kernel and both full models, with
padding so the varlen path runs), and the CUDA SDPA path against the CPU fp32 reference."""

from __future__ import annotations

import pytest
import torch

from dcp.data import collate_tokens, collate_video
from dcp.models import build_model
from dcp.runtime.attention import local_attention, resolve_backend
from dcp.runtime.context import SPContext

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _batch(name: str):
    gen = torch.Generator().manual_seed(0)
    if name.startswith("t1d"):
        return collate_tokens([torch.randint(0, 256, (n,), generator=gen) for n in (77, 130, 5)])
    shapes = [(5, 24), (3, 31)]
    return collate_video([(torch.randn(t, s, 8, generator=gen), torch.randn(t, s, 8, generator=gen))
                          for t, s in shapes])


def _run(name: str, device: str, dtype: torch.dtype, attention: str):
    model = build_model(name).to(device=device, dtype=dtype)
    loss, count = model(_batch(name).to(device), SPContext.single(attention=attention))
    (loss / count).backward()
    return loss.detach().float().cpu(), int(count), [p.grad.float().cpu() for p in model.parameters()]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("causal", [True, False])
def test_flash_kernel_matches_sdpa_with_padding(causal):
    pytest.importorskip("flash_attn")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(3, 64, 4, 32, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    mask = torch.arange(64, device="cuda")[None, :] < torch.tensor([64, 17, 40], device="cuda")[:, None]
    assert resolve_backend("auto", q) == "flash"
    flash = local_attention(q, k, v, causal=causal, doc_lens=((64,), (17,), (40,)), backend="flash")
    sdpa = local_attention(q, k, v, causal=causal, key_padding_mask=mask, backend="sdpa")
    assert _rel_err(flash.float(), sdpa.float()) < 1e-2
    assert (flash[~mask] == 0).all()  # padded queries are zero on both paths


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_flash_model_matches_sdpa_model(name):
    pytest.importorskip("flash_attn")
    f_loss, f_count, f_grads = _run(name, "cuda", torch.bfloat16, "flash")
    s_loss, s_count, s_grads = _run(name, "cuda", torch.bfloat16, "sdpa")
    assert f_count == s_count
    torch.testing.assert_close(f_loss, s_loss, rtol=2e-2, atol=0)
    for a, b in zip(f_grads, s_grads, strict=True):
        assert _rel_err(a, b) < 5e-2


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_cuda_sdpa_fp32_matches_cpu(name):
    c_loss, c_count, c_grads = _run(name, "cpu", torch.float32, "sdpa")
    g_loss, g_count, g_grads = _run(name, "cuda", torch.float32, "sdpa")
    assert c_count == g_count
    torch.testing.assert_close(g_loss, c_loss, rtol=1e-4, atol=1e-4)
    for a, b in zip(g_grads, c_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("doc_lens", [None, [[300, 212], [512]]])
def test_grouped_query_attention_at_sp1_on_cuda(doc_lens):
    """Grouped-query k/v (H/H_kv = 4, Llama-3-8B's ratio) through ulysses_attention at SP 1 on CUDA in bf16,
    packed documents included, against an independent reference: fp32 SDPA on each document with its own
    grouped-query mapping (``enable_gqa``), gradients too."""
    import torch.nn.functional as F

    from dcp.runtime.ulysses import ulysses_attention

    gen = torch.Generator(device="cuda").manual_seed(3)
    b, s, heads, kv_heads, d = 2, 512, 16, 4, 64
    q, up = (torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(b, s, kv_heads, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    grouped = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ulysses_attention(*grouped, SPContext.single(attention="sdpa"), causal=True, doc_lens=doc_lens)
    (out.float() * up.float()).sum().backward()
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    rows = []
    for row, docs in enumerate(doc_lens or [[s]] * b):
        pieces, off = [], 0
        for n in docs:
            qd, kd, vd = (t[row:row + 1, off:off + n].transpose(1, 2) for t in ref_in)  # [1, heads, n, d]
            pieces.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=True).transpose(1, 2))
            off += n
        rows.append(torch.cat(pieces, dim=1))
    ref = torch.cat(rows, dim=0)
    (ref * up.float()).sum().backward()
    assert out.shape == (b, s, heads, d) and out.dtype == torch.bfloat16
    assert _rel_err(out.detach().float(), ref.detach()) < 1e-2
    for g, r in zip(grouped, ref_in, strict=True):
        assert g.grad.shape == r.shape and _rel_err(g.grad.float(), r.grad) < 2e-2
