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


@pytest.mark.parametrize("arch", ["qwen2", "gemma2", "gpt2"])  # grouped K/V, logit soft-capping, a biased head
def test_hf_forward_chunked_equals_the_models_own_logits(arch):
    pytest.importorskip("transformers")
    from dcp.integrations import hf
    from dcp.integrations.hf_zoo import tiny_causal_lm

    model = tiny_causal_lm(arch, layers=2, hidden=64)
    prepared = hf.prepare(model)
    whole = dataclasses.replace(prepared, loss_chunk_tokens=0)  # the model's own forward and logits
    chunked = dataclasses.replace(prepared, loss_chunk_tokens=5)
    data = SyntheticTokenDataset([13, 22, 9], vocab_size=200, seed=1)
    batch = data.collate([data[i] for i in range(3)])  # unequal lengths: packed as documents of one row
    targets = batch.targets.clone()
    targets[..., ::4] = IGNORE_INDEX
    batch = dataclasses.replace(batch, targets=targets)
    results = []
    for fwd in (whole, chunked):
        model.zero_grad(set_to_none=True)
        loss, count = fwd.forward(model, batch, SPContext.single())
        loss.backward()
        results.append((loss.detach(), int(count), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (a, n_a, ga), (b, n_b, gb) = results
    assert n_a == n_b == int((targets != IGNORE_INDEX).sum())
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert len(ga) == len(gb)
    for x, y in zip(gb, ga, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def test_hf_adapter_chunked_loss_and_its_cache_key():
    pytest.importorskip("transformers")
    from dcp.integrations.hf_model import HFCausalLMAdapter, HFModelError
    from dcp.integrations.hf_zoo import tiny_causal_lm

    model = tiny_causal_lm("gemma2", layers=2, hidden=64)
    whole, chunked = HFCausalLMAdapter(model, loss_chunk_tokens=0), HFCausalLMAdapter(model, loss_chunk_tokens=6)
    assert whole.config_hash() != chunked.config_hash()  # the measured head memory differs
    data = SyntheticTokenDataset([17], vocab_size=200, seed=2)
    batch = data.collate([data[0]])
    ctx = SPContext.single()
    hidden, aux = whole.layer_inputs(batch, ctx)
    for i in range(whole.num_layers):
        hidden = whole.run_layer(i, hidden, aux, ctx)
    a, _ = whole.head_loss(hidden, batch, ctx, aux)
    b, _ = chunked.head_loss(hidden, batch, ctx, aux)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # the model's own loss (mean over its shifted labels) from the same logits
    full = model(input_ids=batch.inputs, use_cache=False).logits
    ref = torch.nn.functional.cross_entropy(full.flatten(0, 1).float(), batch.targets.reshape(-1), reduction="sum")
    torch.testing.assert_close(a, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(HFModelError, match="loss_chunk_tokens"):
        HFCausalLMAdapter(model, loss_chunk_tokens=-1)


def test_a_model_whose_logits_differ_from_the_chunked_heads_is_refused():
    pytest.importorskip("transformers")
    from dcp.integrations import hf
    from dcp.integrations.hf_zoo import tiny_causal_lm

    model = tiny_causal_lm("llama", layers=2, hidden=64)
    model.config.logit_scale = 2.0  # a scale logits_fn applies and this forward does not (a foreign forward)
    data = SyntheticTokenDataset([9, 12], vocab_size=200, seed=1)
    batch = data.collate([data[0], data[1]])
    with pytest.raises(hf.HFIntegrationError, match=r"prepare\(model, loss_chunk_tokens=0\)"):
        hf.prepare(model).forward(model, batch, SPContext.single())
    whole = hf.prepare(model, loss_chunk_tokens=0)  # the fix the line names: the model's own logits
    loss, count = whole.forward(model, batch, SPContext.single())
    assert torch.isfinite(loss) and int(count) > 0
    with pytest.raises(hf.HFIntegrationError, match="loss_chunk_tokens"):
        hf.prepare(model, loss_chunk_tokens=-1)
