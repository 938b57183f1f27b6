"""Attention without padding masks: per-document attention from host lengths (``doc_lens``) equals the dense
masked path it replaces (outputs and gradients), for padded rows, packed rows and rows of padding only; the
reference models give the same loss and gradients as the masked path of before and as their samples run
one at a time (padding and packing cost nothing and change nothing). Ulysses SP 2: tests/dist."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dcp.data import collate_tokens, collate_video
from dcp.models import build_model
from dcp.models.common import length_mask
from dcp.runtime import attention as attn_mod
from dcp.runtime.attention import check_doc_lens, local_attention, padded_docs
from dcp.runtime.context import SPContext

TOL = dict(rtol=1e-5, atol=1e-6)


def _qkv(b, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, 2, 4, generator=g).requires_grad_() for _ in range(3)]


def _grads(out, tensors, seed=1):
    up = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * up).sum(), tensors)


@pytest.mark.parametrize("causal", [True, False])
def test_doc_lens_equal_the_masked_path_outputs_and_grads(causal):
    lens = [9, 4, 1, 6]
    q, k, v = _qkv(4, 9)
    masked = local_attention(q, k, v, causal=causal, key_padding_mask=length_mask(lens, 9, "cpu"), backend="sdpa")
    docs = local_attention(q, k, v, causal=causal, doc_lens=padded_docs(lens), backend="sdpa")
    torch.testing.assert_close(docs, masked, **TOL)
    assert docs[1, 4:].abs().max() == 0 and docs[2, 1:].abs().max() == 0  # padded outputs are exactly zero
    for a, b in zip(_grads(docs, (q, k, v)), _grads(masked, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_packed_row_attends_inside_each_document_only(causal):
    docs = [(3, 5, 2), (), (4, 4)]  # a pack with trailing padding, a row of padding only, two equal documents
    q, k, v = _qkv(3, 11, seed=2)
    out = local_attention(q, k, v, causal=causal, doc_lens=docs, backend="sdpa")
    grads = _grads(out, (q, k, v))
    # reference: every document alone, as its own sequence
    ref = torch.zeros_like(out)
    for i, row in enumerate(docs):
        off = 0
        for n in row:
            sl = slice(off, off + n)
            ref[i, sl] = local_attention(q[i:i + 1, sl], k[i:i + 1, sl], v[i:i + 1, sl], causal=causal,
                                         backend="sdpa")[0]
            off += n
    torch.testing.assert_close(out, ref, **TOL)
    for a, b in zip(grads, _grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert out[1].abs().max() == 0 and grads[0][1].abs().max() == 0 and grads[1][0, 10:].abs().max() == 0


def test_full_rows_take_one_call_without_mask(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    q, k, v = _qkv(3, 5)
    local_attention(q, k, v, causal=True, doc_lens=((5,),) * 3, backend="sdpa")
    assert calls == [{"is_causal": True}]  # one batched call, no attn_mask
    calls.clear()
    local_attention(q, k, v, causal=True, doc_lens=((5,), (5,), (2,)), backend="sdpa")
    assert len(calls) == 2 and all("attn_mask" not in c for c in calls)  # rows 0-1 together, then row 2


def test_all_padding_gives_zeros_that_still_give_every_input_a_gradient():
    # a rank whose rows are all padding must still produce (zero) gradients: DeepSpeed's ZeRO buckets go
    # out of step across ranks when a parameter's gradient is None on one of them
    q, k, v = (torch.randn(3, 5, 2, 4, requires_grad=True) for _ in range(3))
    out = local_attention(q, k, v, causal=False, doc_lens=[(), (), ()])
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert all(t.grad is not None and torch.equal(t.grad, torch.zeros_like(t)) for t in (q, k, v))


@pytest.mark.parametrize(
    ("doc_lens", "words"),
    [
        (((4,),), "doc_lens has 1 rows, the batch has 2"),
        (((4,), (0, 2)), "doc_lens[1] ((0, 2)) must hold lengths >= 1"),
        (((3, 2), (1,)), "doc_lens[0] ((3, 2)) must hold lengths >= 1 summing to <= the sequence length (4)"),
    ],
)
def test_bad_doc_lens_name_the_row(doc_lens, words):
    q = torch.zeros(2, 4, 2, 4)
    with pytest.raises(ValueError, match=r".*: ") as exc:
        local_attention(q, q, q, causal=True, doc_lens=doc_lens, backend="sdpa")
    assert words in str(exc.value)
    with pytest.raises(ValueError, match=r"both doc_lens and key_padding_mask"):
        local_attention(q, q, q, causal=True, doc_lens=((4,), (4,)),
                        key_padding_mask=torch.ones(2, 4, dtype=torch.bool), backend="sdpa")
    assert check_doc_lens([[4], [1, 2]], 2, 4) == ((4,), (1, 2))


# ----- whole models ------------------------------------------------------------------------------------
def _t1d_batch():
    g = torch.Generator().manual_seed(3)
    return collate_tokens([torch.randint(0, 256, (n,), generator=g) for n in (13, 5, 9, 13)])


def _t2d_batch():
    g = torch.Generator().manual_seed(4)
    shapes = [(3, 5), (2, 7), (3, 2)]
    return collate_video([(torch.randn(t, s, 8, generator=g), torch.randn(t, s, 8, generator=g)) for t, s in shapes])


def _run(model, batch, ctx=None):
    model.zero_grad()
    loss, count = model(batch, ctx or SPContext.single(attention="sdpa"))
    loss.backward()
    return loss.detach(), int(count), {n: p.grad.clone() for n, p in model.named_parameters()}


def _masked_reference(model, batch, monkeypatch):
    """The model as it ran before: [b, s] padded rows, dense padding masks in every attention."""
    from dcp.models import t1d, t2d
    from dcp.runtime import ulysses

    if batch.shapes is None:
        mask = length_mask(batch.seq_lens, batch.inputs.shape[1], "cpu")
        monkeypatch.setattr(t1d.Transformer1D, "packs", staticmethod(lambda b: False))
        masks = {mask.shape[0]: mask}
    else:
        b, t_max, s_max = batch.inputs.shape[:3]
        spatial = length_mask([s for _, s in batch.shapes], s_max, "cpu")
        temporal = length_mask([t for t, _ in batch.shapes], t_max, "cpu")
        masks = {b * t_max: spatial[:, None, :].expand(b, t_max, s_max).reshape(b * t_max, s_max),
                 b * s_max: temporal[:, None, :].expand(b, s_max, t_max).reshape(b * s_max, t_max)}
        assert len(masks) == 2

    def masked(q, k, v, *, causal, doc_lens=None, key_padding_mask=None, backend="auto"):
        return local_attention(q, k, v, causal=causal, key_padding_mask=masks[q.shape[0]], backend=backend)

    monkeypatch.setattr(ulysses, "local_attention", masked)
    monkeypatch.setattr(t2d, "local_attention", masked)
    try:
        return _run(model, batch)
    finally:
        monkeypatch.undo()


def _alone(model, batch):
    """Every sample of the micro-batch run alone (no padding at all); losses, counts and grads summed."""
    from dcp.experiments.execute import split_samples

    total = None
    for one in split_samples(batch):
        loss, count, grads = _run(model, one)
        total = (loss, count, grads) if total is None else (
            total[0] + loss, total[1] + count, {n: total[2][n] + g for n, g in grads.items()})
    return total


def _assert_same(got, ref, tol=TOL):
    torch.testing.assert_close(got[0], ref[0], **tol)
    assert got[1] == ref[1]
    for name, grad in got[2].items():
        torch.testing.assert_close(grad, ref[2][name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(("name", "make"), [("t1d-tiny", _t1d_batch), ("t2d-tiny", _t2d_batch)])
def test_models_equal_the_masked_path_and_their_samples_alone(name, make, monkeypatch):
    model = build_model(name)
    batch = make()
    got = _run(model, batch)
    _assert_same(got, _masked_reference(model, batch, monkeypatch))
    _assert_same(got, _alone(model, batch))


def test_t1d_packs_unequal_lengths_into_one_row_of_documents():
    model = build_model("t1d-tiny")
    batch = _t1d_batch()
    hidden, aux = model.layer_inputs(batch, SPContext.single())
    assert hidden.shape[:2] == (1, batch.tokens) and aux.doc_lens == (batch.seq_lens,)
    # RoPE restarts at every document: the second document's first token has position 0
    torch.testing.assert_close(aux.cos[13], aux.cos[0])
    equal = collate_tokens([torch.arange(6), torch.arange(6)])
    hidden, aux = model.layer_inputs(equal, SPContext.single())
    assert hidden.shape[:2] == (2, 6) and aux.doc_lens == ((6,), (6,))


def test_packed_micro_batch_equals_its_documents_run_separately():
    """The packed baseline: one forward of a pack (one row of documents), recompute on, equals its documents
    run one at a time: loss, count and every gradient."""
    from dcp.experiments.execute import packed_forward

    model = build_model("t1d-tiny", num_layers=3)
    g = torch.Generator().manual_seed(5)
    pack = collate_tokens([torch.randint(0, 256, (n,), generator=g) for n in (3, 17, 1, 8, 8)])
    ctx = SPContext.single(recompute_layers=2, attention="sdpa")
    calls = []
    model.register_forward_pre_hook(lambda mod, args: calls.append(1))
    model.zero_grad()
    loss, count = packed_forward(model, pack, ctx)
    loss.backward()
    got = (loss.detach(), int(count), {n: p.grad.clone() for n, p in model.named_parameters()})
    assert len(calls) == 1  # one forward for the whole pack
    _assert_same(got, _alone(model, pack))


def test_token_packed_dcp_micro_batch_equals_its_documents_run_separately():
    """advanced.micro_batch_tokens = "auto": a DCP micro-batch packed by tokens (more documents than any profiled
    b) runs as one row of documents (one forward, recompute on) and equals its documents run one at a time."""
    import dataclasses

    from dcp.planner import plan_epoch
    from tests.unit.test_planner_assemble import make
    from tests.unit.test_planner_tokens import text_lengths

    cfg, table = make(4, cap_mib=48)
    cfg = cfg.replace(advanced=dataclasses.replace(cfg.advanced, micro_batch_tokens="auto"))
    lengths = np.minimum(text_lengths(400, seed=2), 200)
    plans = plan_epoch(lengths, table, cfg, 4)
    mb = max((mb for p in plans for g in p.groups for mb in g.micro_batches), key=lambda mb: mb.size)
    assert mb.size > max(r.micro_batch_size for r in table.rows)
    model = build_model("t1d-tiny", num_layers=3).double()  # a pack of ~30 documents: fp32 sums differ by ~1e-6
    g = torch.Generator().manual_seed(7)
    pack = collate_tokens([torch.randint(0, 256, (n,), generator=g) for n in mb.seq_lens])
    assert type(model).packs(pack)  # unequal lengths: one row of documents
    got = _run(model, pack, SPContext.single(recompute_layers=2, attention="sdpa"))
    _assert_same(got, _alone(model, pack))
