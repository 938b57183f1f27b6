"""Cross-entropy over token chunks: the ``tokens x vocab`` logits are never all held.

At long context the head's logits dominate a micro-batch's memory (131k tokens x 128k vocab in fp32 is 63 GiB).
``chunked_cross_entropy`` runs head + cross-entropy on ``chunk_tokens`` rows at a time under non-reentrant
activation checkpointing: forward keeps only each chunk's input rows (already alive as the last hidden state)
and its scalar loss; backward recomputes one chunk's logits at a time. The result is the sum over the chunks,
equal to the unchunked sum up to float summation order; the memory model counts one chunk
(``dcp.memory.LOSS_CHUNK_TOKENS``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from dcp.data import IGNORE_INDEX

__all__ = ["chunked_cross_entropy"]


def _head_ce(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, targets: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                          chunk_tokens: int) -> torch.Tensor:
    """Sum of cross-entropy of ``head(hidden)`` against ``targets`` (``-100``: not counted).

    ``hidden`` [..., H] and ``targets`` [...] are flattened to token rows; ``head`` maps [n, H] rows to [n, V]
    logits (norm + LM head; per token, so chunking by rows is exact). ``chunk_tokens`` 0: one piece, unchunked.
    """
    if chunk_tokens < 0:
        raise ValueError(f"chunk_tokens ({chunk_tokens}) must be >= 0: use 0 for one piece")
    rows, flat = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    n = rows.shape[0]
    if chunk_tokens == 0 or n <= chunk_tokens:
        return _head_ce(head, rows, flat)
    total = rows.new_zeros((), dtype=torch.float32)
    for start in range(0, n, chunk_tokens):
        part = slice(start, start + chunk_tokens)
        total = total + checkpoint(_head_ce, head, rows[part], flat[part], use_reentrant=False)
    return total
