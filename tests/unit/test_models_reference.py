"""Both reference models on one process: forward/backward, padding invariance, recompute on/off,
the recompute hook, deterministic init and the protocol the profiler uses (single layers)."""

from __future__ import annotations

import pytest
import torch

from dcp.data import Batch, collate_tokens, collate_video
from dcp.models import build_model
from dcp.runtime.context import SPContext

CTX = SPContext.single(attention="sdpa")


def _samples(name: str, shapes, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if name.startswith("t1d"):
        return [torch.randint(0, 256, (t * s,), generator=g) for t, s in shapes]
    return [(torch.randn(t, s, 8, generator=g), torch.randn(t, s, 8, generator=g)) for t, s in shapes]


def _collate(name: str, samples, ids=()) -> Batch:
    return collate_tokens(samples, ids) if name.startswith("t1d") else collate_video(samples, ids)


def _loss_and_grads(model, batch, ctx=CTX, recompute=None):
    model.zero_grad(set_to_none=True)
    loss, count = model(batch, ctx, recompute=recompute)
    loss.backward()
    return loss.detach(), int(count), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_forward_backward_gives_finite_loss_and_grads(name):
    model = build_model(name)
    batch = model.synthetic_batch(2, 24, generator=torch.Generator().manual_seed(0))
    loss, count, grads = _loss_and_grads(model, batch)
    assert count == model.valid_count(batch) > 0
    assert torch.isfinite(loss) and loss > 0
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_padding_invariance(name):
    """A padded batch's loss and gradients are the sums of its samples' own (unpadded) values."""
    model = build_model(name)
    shapes = [(2, 5), (3, 7)]  # 1D: 10 and 21 tokens; 2D: T and S both padded for the first sample
    samples = _samples(name, shapes)
    together = _loss_and_grads(model, _collate(name, samples))
    alone = [_loss_and_grads(model, _collate(name, [s])) for s in samples]
    torch.testing.assert_close(together[0], alone[0][0] + alone[1][0])
    assert together[1] == alone[0][1] + alone[1][1]
    for g, a, b in zip(together[2], alone[0][2], alone[1][2], strict=True):
        torch.testing.assert_close(g, a + b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_recompute_gives_identical_loss_and_grads(name):
    model = build_model(name)
    batch = model.synthetic_batch(2, 20, generator=torch.Generator().manual_seed(3))
    base = _loss_and_grads(model, batch, CTX)
    for r in (1, model.config.num_layers):
        other = _loss_and_grads(model, batch, CTX.replace(recompute_layers=r))
        torch.testing.assert_close(other[0], base[0], rtol=0, atol=0)
        for a, b in zip(other[2], base[2], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_recompute_layers_saves_fewer_activations(name):
    model = build_model(name)
    batch = model.synthetic_batch(1, 16, generator=torch.Generator().manual_seed(0))
    saved = []
    for r in (0, 2, model.config.num_layers):
        count = [0]

        def pack(t, count=count):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(batch, CTX.replace(recompute_layers=r))
        saved.append(count[0])
    assert saved[0] > saved[1] > saved[2]


def test_recompute_hook_replaces_the_builtin_decision():
    from dcp.runtime.recompute import checkpoint_layer

    model = build_model("t1d-tiny")
    batch = model.synthetic_batch(2, 12, generator=torch.Generator().manual_seed(1))
    seen = []

    def hook(layer, *args):
        seen.append(layer.layer_index)
        return checkpoint_layer(layer, *args, enabled=layer.layer_index < 2)

    hooked = _loss_and_grads(model, batch, recompute=hook)
    plain = _loss_and_grads(model, batch)
    assert seen == [0, 1, 2, 3]
    torch.testing.assert_close(hooked[0], plain[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_single_layer_protocol_matches_forward(name):
    """layer_inputs + run_layer for every layer + head_loss is exactly forward (what the profiler times)."""
    model = build_model(name)
    batch = model.synthetic_batch(2, 18, generator=torch.Generator().manual_seed(2))
    hidden, aux = model.layer_inputs(batch, CTX)
    assert hidden.shape[0] == 2 and hidden.shape[-1] == model.config.hidden_size
    for i in range(len(model.layers)):
        hidden = model.run_layer(i, hidden, aux, CTX)
    loss, count = model.head_loss(hidden, batch, CTX, aux)
    ref_loss, ref_count = model(batch, CTX)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    assert int(count) == int(ref_count)


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_init_is_deterministic_per_seed(name):
    a, b, c = build_model(name), build_model(name), build_model(name, seed=1)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True))


def test_synthetic_batches():
    g = torch.Generator().manual_seed(0)
    b1 = build_model("t1d-tiny").synthetic_batch(3, 10, generator=g, sample_ids=(7, 8, 9))
    assert b1.inputs.shape == (3, 10) and b1.seq_lens == (10, 10, 10) and b1.sample_ids == (7, 8, 9)
    assert torch.equal(b1.targets[:, :-1], b1.inputs[:, 1:]) and (b1.targets[:, -1] == -100).all()
    t2d = build_model("t2d-tiny")
    b2 = t2d.synthetic_batch(2, 10, generator=g)
    # t2d-tiny: T = round(sqrt(10 / 4)) = 2 frames of 5 spatial tokens (T2DConfig.synthetic_spatial_per_frame)
    assert b2.inputs.shape == (2, 2, 5, 8) and b2.shapes == ((2, 5), (2, 5)) and b2.seq_lens == (10, 10)
    b3 = build_model("t2d-tiny", synthetic_spatial_per_frame=0.0).synthetic_batch(2, 10, generator=g)
    assert b3.shapes == ((4, 3), (4, 3)) and b3.seq_lens == (12, 12)  # T = synthetic_frames, S = ceil(10 / 4)
    assert t2d.synthetic_batch(1, 6, generator=g, shape=(2, 3)).shapes == ((2, 3),)


def test_batch_errors():
    x = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"Batch.seq_lens \(1 entries\)"):
        Batch(inputs=x, targets=x, seq_lens=(4,))
    with pytest.raises(ValueError, match=r"Batch.seq_lens \(\(4, 0\)\) must all be >= 1"):
        Batch(inputs=x, targets=x, seq_lens=(4, 0))
    with pytest.raises(ValueError, match=r"Batch.shapes"):
        Batch(inputs=x, targets=x, seq_lens=(4, 4), shapes=((2, 2), (1, 3)))
    with pytest.raises(ValueError, match=r"Batch.shapes \(None\) is required"):
        build_model("t2d-tiny")(Batch(inputs=torch.zeros(1, 2, 2, 8), targets=torch.zeros(1, 2, 2, 8),
                                      seq_lens=(4,)), CTX)
