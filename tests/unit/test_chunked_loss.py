"""Chunked cross-entropy: the same loss and gradients as the whole-logits loss, one chunk of logits saved."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.config import ConfigError
from dcp.data import IGNORE_INDEX
from dcp.models import T1DConfig, Transformer1D
from dcp.models.loss import chunked_cross_entropy
from dcp.profiler.memory import SavedTensorMeter
from dcp.runtime.context import SPContext
from dcp.runtime.data import SyntheticTokenDataset


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss, count = model(batch, SPContext.single())
    loss.backward()
    return loss.detach(), int(count), [p.grad.clone() for p in model.parameters()]


def test_t1d_chunked_equals_whole_with_ignored_labels_and_packed_documents():
    whole = Transformer1D(T1DConfig.tiny(loss_chunk_tokens=0))
    chunked = Transformer1D(T1DConfig.tiny(loss_chunk_tokens=7))  # 7-token pieces
    chunked.load_state_dict(whole.state_dict())
    data = SyntheticTokenDataset([13, 22, 5, 17], vocab_size=256, seed=3)
    batch = data.collate([data[i] for i in range(4)])  # four documents packed in one row, unequal lengths
    targets = batch.targets.clone()
    targets[..., ::3] = IGNORE_INDEX  # more ignored labels than the document ends
    batch = dataclasses.replace(batch, targets=targets)
    (a, n_a, ga), (b, n_b, gb) = loss_and_grads(whole, batch), loss_and_grads(chunked, batch)
    assert n_a == n_b == int((targets != IGNORE_INDEX).sum())
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for x, y in zip(gb, ga, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def head_saved_bytes(tokens: int, vocab: int, hidden: int, chunk: int) -> int:
    """Peak bytes the head + loss keeps for backward (its input rows and the parameters excluded)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    t = torch.randint(0, vocab, (1, tokens))
    meter = SavedTensorMeter(exclude=[x, *head.parameters()])
    with meter:
        loss = chunked_cross_entropy(x, t, head, chunk)
    loss.backward()
    return meter.peak_bytes


def test_chunked_saves_one_chunk_of_logits():
    whole = head_saved_bytes(2048, 2048, 16, 0)
    chunked = head_saved_bytes(2048, 2048, 16, 256)
    assert whole >= 2048 * 2048 * 4  # at least the fp32 logits
    assert chunked * 4 <= whole


def test_bad_chunk_sizes_refused():
    with pytest.raises(ValueError, match=r"chunk_tokens \(-1\) must be >= 0"):
        chunked_cross_entropy(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), torch.nn.Linear(4, 3), -1)
    with pytest.raises(ConfigError, match="t1d.loss_chunk_tokens"):
        T1DConfig.tiny(loss_chunk_tokens=-1)
