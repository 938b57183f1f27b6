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
    pytest.mark.xdist_group("gpu"),  # one xdist worker runs them in turn (gpu_checks.sh suite-xdist)
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
    packed documents included: equal to attending with k/v repeated by hand, gradients too."""
    from dcp.runtime.ulysses import ulysses_attention

    gen = torch.Generator(device="cuda").manual_seed(3)
    b, s, heads, kv_heads, d = 2, 512, 16, 4, 64
    q, up = (torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(b, s, kv_heads, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    ctx = SPContext.single(attention="sdpa")
    grouped = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ulysses_attention(*grouped, ctx, causal=True, doc_lens=doc_lens)
    (out.float() * up.float()).sum().backward()
    expanded = [t.clone().requires_grad_() for t in (q, k, v)]
    rep = heads // kv_heads
    ref = local_attention(expanded[0], expanded[1].repeat_interleave(rep, dim=2),
                          expanded[2].repeat_interleave(rep, dim=2), causal=True, doc_lens=doc_lens,
                          key_padding_mask=None, backend="sdpa")
    (ref.float() * up.float()).sum().backward()
    assert out.shape == (b, s, heads, d) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # same kernels on the same repeated heads
    for g, e in zip(grouped, expanded, strict=True):  # bf16 defaults: a backward kernel may sum in any order
        torch.testing.assert_close(g.grad, e.grad)
