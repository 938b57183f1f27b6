"""Local (single-rank) attention: PyTorch SDPA everywhere, flash-attn on CUDA when it is installed.

Layout is flash-attn's: q, k, v are [b, s, heads, head_dim]. Which tokens attend to which is given by
``doc_lens``, plain Python ints the host already has (the batch's lengths), never read from a tensor:

- ``doc_lens[i]`` lists the documents of batch row i, laid back to back from position 0; positions past
  their sum are padding. A right-padded sample is one document ``(n_i,)``; a packed row of several
  documents is ``(n_1, n_2, ...)``; a row that is all padding is ``()``.
- Attention runs inside each document only (causal inside it when ``causal``): a document never sees
  padding or another document, so no dense mask is ever built. Equal full-length rows run as one SDPA
  call (``is_causal``, no mask: SDPA keeps its flash kernel on CUDA); otherwise consecutive rows with the
  same documents share one SDPA call per document on slices, and with flash-attn installed (CUDA,
  fp16/bf16) all documents of the micro-batch run as one varlen call.
- Outputs at padded positions are exactly zero and padded q, k, v get zero gradients, which is what the
  dense masked path gave, so both agree on everything the rest of the model sees.

``key_padding_mask`` (bool [b, s], True on real tokens) is kept as the dense masked reference (tests, and
callers that only have a mask); it always applies the mask (no host read to skip it) and is 3.5x slower
per FLOP on CUDA (docs/runtime.md). Prefer ``doc_lens``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from dcp.distributed.device import to_device_async
from dcp.runtime.context import ATTENTION_BACKENDS

log = logging.getLogger("dcp")

_FLASH_DTYPES = (torch.float16, torch.bfloat16)

DocLens = tuple[tuple[int, ...], ...]
"""Per batch row: the lengths of its documents, back to back from position 0 (the rest is padding)."""


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


def padded_docs(seq_lens: Sequence[int]) -> DocLens:
    """``doc_lens`` of right-padded samples: one document of ``n`` tokens per row."""
    return tuple((int(n),) if n > 0 else () for n in seq_lens)


def check_doc_lens(doc_lens: Sequence[Sequence[int]], rows: int, seq_len: int, what: str = "doc_lens") -> DocLens:
    """``doc_lens`` as a tuple of int tuples; ValueError unless it has one entry per row, every document
    holds >= 1 token and every row's documents fit in ``seq_len``."""
    docs = doc_lens if isinstance(doc_lens, tuple) else tuple(tuple(row) for row in doc_lens)
    try:
        _layout(docs, rows, seq_len)
    except TypeError:  # rows given as lists: normalise once
        docs = tuple(tuple(int(n) for n in row) for row in docs)
        _layout(docs, rows, seq_len)
    except _BadDocs as bad:
        raise ValueError(f"{what}{bad}") from None
    return docs


class _BadDocs(ValueError):
    pass


@functools.lru_cache(maxsize=256)
def _layout(docs: DocLens, rows: int, seq_len: int) -> tuple[bool, tuple[tuple[int, int, tuple[int, ...]], ...]]:
    """(every row is one document of seq_len tokens, runs of equal rows); checked and cached per layout, so
    the layers of one micro-batch pay the Python walk over its rows once (T2D has b*T and b*S rows)."""
    if len(docs) != rows:
        raise _BadDocs(f" has {len(docs)} rows, the batch has {rows}: give one tuple of document lengths per row")
    runs: list[tuple[int, int, tuple[int, ...]]] = []
    for i, row in enumerate(docs):
        if any(n < 1 for n in row) or sum(row) > seq_len:
            raise _BadDocs(
                f"[{i}] ({row}) must hold lengths >= 1 summing to <= the sequence length ({seq_len}): "
                "drop empty documents and pass lengths of the (padded) sequence the tensors hold"
            )
        if runs and runs[-1][2] == row:
            runs[-1] = (runs[-1][0], i + 1, row)
        else:
            runs.append((i, i + 1, row))
    return all(row == (seq_len,) for row in docs), tuple(runs)


@torch.compiler.disable  # host-int layouts: a compiled block runs attention eagerly (dcp.runtime.compiled)
def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    doc_lens: Sequence[Sequence[int]] | None = None,
    key_padding_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of q [b, s, h, d] over k, v [b, s, h, d]; returns [b, s, h, d].

    ``doc_lens`` (module docstring): documents per row, host ints; None means every row is one document of
    s tokens. ``key_padding_mask``: the dense masked reference path instead (not both).
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"q, k, v shapes ({tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}) must be equal and 4-D: "
            "pass [batch, seq, heads, head_dim] tensors"
        )
    b, s = q.shape[:2]
    kind = resolve_backend(backend, q)
    if key_padding_mask is not None:
        if doc_lens is not None:
            raise ValueError("local_attention got both doc_lens and key_padding_mask: pass doc_lens only")
        if tuple(key_padding_mask.shape) != (b, s):
            raise ValueError(
                f"key_padding_mask shape ({tuple(key_padding_mask.shape)}) must be [batch, seq] = {(b, s)}: "
                "pass one bool per token, True on real tokens"
            )
        return _sdpa_masked(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
    docs = None if doc_lens is None else check_doc_lens(doc_lens, b, s)
    if docs is None or _layout(docs, b, s)[0]:  # no padding, one document per row: the plain kernel
        return _flash_dense(q, k, v, causal) if kind == "flash" else _sdpa_dense(q, k, v, causal)
    if not any(docs_row for docs_row in docs):
        # Nothing but padding (e.g. a rank whose spatial shard is all padding in Transformer-2D's temporal
        # attention). The zeros stay tied to q, k and v so the parameters that made them still get a (zero)
        # gradient on this rank: ZeRO's gradient hooks and buckets must fire identically on every rank, and a
        # parameter whose gradient is None on one rank desynchronises DeepSpeed's reduction.
        return _tied_zeros(q, k, v)
    if kind == "flash":
        return _flash_varlen(q, k, v, causal=causal, docs=docs)
    return _sdpa_docs(q, k, v, causal=causal, runs=_layout(docs, b, s)[1])


def _tied_zeros(q, k, v) -> torch.Tensor:
    """Zeros shaped like q that keep q, k and v in the autograd graph (their gradients are zeros, not None)."""
    return q * 0 + (k.sum() + v.sum()) * 0


def _sdpa_dense(q, k, v, causal: bool) -> torch.Tensor:
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA wants [b, h, s, d]
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def _sdpa_docs(q, k, v, *, causal: bool, runs) -> torch.Tensor:
    """One SDPA call per (run of equal rows, document) on slices; padding gets zeros, never computed."""
    s = q.shape[1]
    blocks = []
    for r0, r1, row in runs:
        pieces, off = [], 0
        for n in row:
            pieces.append(_sdpa_dense(q[r0:r1, off : off + n], k[r0:r1, off : off + n], v[r0:r1, off : off + n], causal))
            off += n
        if off < s:
            pieces.append(q.new_zeros(r1 - r0, s - off, *q.shape[2:]))
        blocks.append(torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0])
    return torch.cat(blocks, dim=0) if len(blocks) > 1 else blocks[0]


def _sdpa_masked(q, k, v, *, causal: bool, key_padding_mask: torch.Tensor) -> torch.Tensor:
    """The dense masked reference: padded keys masked, padded queries zeroed (slow on CUDA)."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    s = q.shape[1]
    mask = key_padding_mask[:, None, None, :]  # [b, 1, 1, s_k]
    if causal:
        mask = mask & torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(1, 2)
    return out * key_padding_mask[:, :, None, None].to(out.dtype)


def _flash_dense(q, k, v, causal: bool) -> torch.Tensor:
    from flash_attn import flash_attn_func

    return flash_attn_func(q, k, v, causal=causal)


def _flash_varlen(q, k, v, *, causal: bool, docs: DocLens) -> torch.Tensor:
    """Every document of the micro-batch in one flash_attn_varlen_func call. The token index and cu_seqlens
    are built on the host from ``docs`` (no host read of a device value) and copied without a sync."""
    from flash_attn import flash_attn_varlen_func

    b, s, h, d = q.shape
    starts = [i * s + off for i, row in enumerate(docs) for off in _offsets(row)]
    lens = [n for row in docs for n in row]
    if not lens:  # nothing but padding
        return _tied_zeros(q, k, v)
    idx = torch.cat([torch.arange(a, a + n) for a, n in zip(starts, lens, strict=True)])
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    idx, cu = to_device_async(idx, q.device), to_device_async(cu, q.device)
    qu, ku, vu = (t.reshape(b * s, h, d).index_select(0, idx) for t in (q, k, v))
    out_u = flash_attn_varlen_func(qu, ku, vu, cu, cu, max(lens), max(lens), causal=causal)
    out = out_u.new_zeros(b * s, h, d).index_copy(0, idx, out_u)
    return out.reshape(b, s, h, d)


def _offsets(row: tuple[int, ...]) -> list[int]:
    out, off = [], 0
    for n in row:
        out.append(off)
        off += n
    return out
