"""Memory meters: saved-tensor bytes (unique storages, peak, emulated capacity) and state bytes."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from dcp.profiler.memory import (
    EmulatedOutOfMemory,
    SavedTensorMeter,
    out_of_memory_errors,
    state_bytes,
    tensors_in,
    unique_storage_bytes,
)


def test_unique_storages_count_once_and_exclusions_are_skipped():
    x = torch.randn(64, 32, requires_grad=True)  # 8 KiB
    w = torch.randn(32, 32, requires_grad=True)
    with SavedTensorMeter(exclude=[w]) as meter:
        # mul saves both operands: x twice (two views of one storage) and w (excluded)
        y = (x * x[:, :].clone()).sum() + (x @ w).sum()
    # saved: x (one storage, however many times), the clone, and x again for x @ w; w excluded
    assert meter.saved_bytes == 2 * 64 * 32 * 4
    y.backward()


def test_live_bytes_drop_after_backward_and_peak_is_kept():
    x = torch.randn(128, 64, requires_grad=True)
    lin = torch.nn.Linear(64, 256)
    with SavedTensorMeter(exclude=list(lin.parameters())) as meter:
        y = torch.relu(lin(x)).sum()
        after_forward = meter.live_bytes
        y.backward()
    del y
    gc.collect()
    assert after_forward > 0
    assert meter.peak_bytes == after_forward
    assert meter.live_bytes == 0


def test_reentrant_recompute_is_visible_to_the_meter():
    lin = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 64, requires_grad=True)
    with SavedTensorMeter(exclude=list(lin.parameters())) as plain:
        lin(x).sum().backward()
    with SavedTensorMeter(exclude=list(lin.parameters())) as ckpt:
        h = x
        for _ in range(3):
            h = checkpoint(lin, h, use_reentrant=True)
        h.sum().backward()
    # three checkpointed layers keep their inputs; one layer's activations are alive at a time
    assert ckpt.peak_bytes == plain.peak_bytes + 2 * x.numel() * 4


def test_emulated_capacity_raises_out_of_memory():
    x = torch.randn(256, 256, requires_grad=True)  # 256 KiB
    with pytest.raises(EmulatedOutOfMemory, match="emulated capacity"):
        with SavedTensorMeter(capacity_bytes=300 * 1024, base_bytes=100 * 1024):
            (x * x).sum()
    assert EmulatedOutOfMemory in out_of_memory_errors()
    assert torch.OutOfMemoryError in out_of_memory_errors()


def test_state_bytes_counts_params_grads_and_optimizer_state():
    model = torch.nn.Linear(100, 10)  # 1010 params
    est = state_bytes(model, optimizer_bytes_per_param=8)
    assert (est.params_bytes, est.grads_bytes, est.optimizer_bytes) == (4040, 4040, 8080)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 100)).sum().backward()
    opt.step()
    measured = state_bytes(model, opt)
    assert measured.optimizer_bytes == 8080  # exp_avg + exp_avg_sq (the scalar step is not counted)
    assert measured.total_bytes == 4040 * 4


def test_unique_storage_bytes_skips_non_tensors():
    t = torch.zeros(10)
    assert unique_storage_bytes([t, t[2:], None, 3]) == 40


def test_tensors_in_finds_aux_values_of_the_reference_models():
    from dcp.models import build_model
    from dcp.runtime.context import SPContext

    model = build_model("t1d-tiny")
    batch = model.synthetic_batch(2, 16, generator=torch.Generator().manual_seed(0))
    _, aux = model.layer_inputs(batch, SPContext.single())
    found = tensors_in({"aux": aux, "more": [torch.ones(1)]})
    assert any(t is aux.cos for t in found) and any(t is aux.sin for t in found) and len(found) >= 3
