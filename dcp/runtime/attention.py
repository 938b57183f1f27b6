"""Local (single-rank) attention: PyTorch SDPA everywhere, flash-attn on CUDA when it is installed.

Layout is flash-attn's: q, k, v are [b, s, heads, head_dim]. ``key_padding_mask`` is a bool [b, s] with
True on real tokens; sequences are right-padded (lengths not divisible by sp_size, or shorter samples in
a micro-batch), so every query row keeps at least one valid key as long as every sample has >= 1 token.
Outputs at padded query positions are set to zero by both backends, so they agree exactly on what the
rest of the model sees.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F

from dcp.runtime.context import ATTENTION_BACKENDS

log = logging.getLogger("dcp")

_FLASH_DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def flash_attn_module() -> Any | None:
    """The flash_attn module, or None; the import (and the notice when it fails) happens once per process."""
    try:
        import flash_attn
    except ImportError:
        log.warning("flash-attn is not installed: attention uses PyTorch SDPA (pip install flash-attn for CUDA)")
        return None
    return flash_attn


def resolve_backend(backend: str, q: torch.Tensor) -> str:
    """'sdpa' or 'flash' for this tensor; 'auto' picks flash only where it can run (CUDA, fp16/bf16)."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend ({backend!r}) is not one of {list(ATTENTION_BACKENDS)}: pick one of those")
    if backend == "sdpa":
        return "sdpa"
    usable = q.is_cuda and q.dtype in _FLASH_DTYPES
    if backend == "auto":
        return "flash" if usable and flash_attn_module() is not None else "sdpa"
    if not usable:
        raise ValueError(
            f"attention backend ('flash') needs CUDA fp16/bf16 tensors, got {q.device} {q.dtype}: "
            "use attention='sdpa' or 'auto', or run in bf16 on a GPU"
        )
    if flash_attn_module() is None:
        raise ValueError("attention backend ('flash') needs flash-attn: pip install flash-attn, or use 'sdpa'/'auto'")
    return "flash"


def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of q [b, s, h, d] over k, v [b, s, h, d]; returns [b, s, h, d].

    ``key_padding_mask`` (bool [b, s], True = real token) masks padded keys and zeroes padded queries.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"q, k, v shapes ({tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}) must be equal and 4-D: "
            "pass [batch, seq, heads, head_dim] tensors"
        )
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != tuple(q.shape[:2]):
        raise ValueError(
            f"key_padding_mask shape ({tuple(key_padding_mask.shape)}) must be [batch, seq] = {tuple(q.shape[:2])}: "
            "pass one bool per token, True on real tokens"
        )
    if key_padding_mask is not None and bool(key_padding_mask.all()):
        key_padding_mask = None
    if resolve_backend(backend, q) == "flash":
        return _flash(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
    return _sdpa(q, k, v, causal=causal, key_padding_mask=key_padding_mask)


def _sdpa(q, k, v, *, causal: bool, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA wants [b, h, s, d]
    if key_padding_mask is None:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return out.transpose(1, 2)
    s = q.shape[1]
    mask = key_padding_mask[:, None, None, :]  # [b, 1, 1, s_k]
    if causal:
        mask = mask & torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(1, 2)
    return out * key_padding_mask[:, :, None, None].to(out.dtype)


def _flash(q, k, v, *, causal: bool, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    if key_padding_mask is None:
        return flash_attn_func(q, k, v, causal=causal)
    b, s, h, d = q.shape
    # Unpad: keep real tokens only, packed back to back; cu_seqlens marks where each sample starts.
    idx = key_padding_mask.reshape(-1).nonzero(as_tuple=True)[0]
    lens = key_padding_mask.sum(dim=1, dtype=torch.int32)
    cu = F.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    max_len = int(lens.max())
    qu, ku, vu = (t.reshape(b * s, h, d).index_select(0, idx) for t in (q, k, v))
    out_u = flash_attn_varlen_func(qu, ku, vu, cu, cu, max_len, max_len, causal=causal)
    out = torch.zeros(b * s, h, d, dtype=out_u.dtype, device=out_u.device)
    out = out.index_copy(0, idx, out_u)
    return out.reshape(b, s, h, d)
