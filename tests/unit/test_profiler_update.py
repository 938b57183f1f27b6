"""Measured once-per-step costs: optimizer update on a stand-in (the model is untouched), sizes and errors."""

from __future__ import annotations

import pytest
import torch

from dcp.profiler import update
from dcp.profiler.update import measure_step_update


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))


def test_one_rank_has_no_sync_and_a_positive_update_and_leaves_the_model_alone():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    got = measure_step_update(model, world_size=1, optimizer=opt, iters=3)
    assert got.grad_sync_s == 0.0 and got.optimizer_step_s > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters()) and not opt.state


def test_capped_stand_in_scales_to_the_full_size(monkeypatch):
    # the timer is replaced by a constant so the test checks the scaling, not this host's load
    monkeypatch.setattr(update, "median_time", lambda fn, iters, device: 1e-3)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))  # 2 x (65,536 + 256)
    total = sum(p.numel() for p in model.parameters())
    assert measure_step_update(model, world_size=1, iters=1).optimizer_step_s == pytest.approx(1e-3)
    # ddp stand-ins stop at whole tensors under the cap (the first weight and bias): scaled by total / kept
    capped = measure_step_update(model, world_size=1, iters=1, max_elements=65_536 + 256).optimizer_step_s
    assert capped == pytest.approx(1e-3 * total / (65_536 + 256))
    # ZeRO-1 updates one flat shard of 1/W, capped at max_elements
    zero = measure_step_update(model, world_size=1, iters=1, engine="deepspeed", max_elements=1000)
    assert zero.optimizer_step_s == pytest.approx(1e-3 * total / 1000)


def test_frozen_model_and_errors():
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    got = measure_step_update(frozen, world_size=2)
    assert (got.grad_sync_s, got.optimizer_step_s) == (0.0, 0.0)
    with pytest.raises(ValueError, match=r"iters \(0\) must be >= 1"):
        measure_step_update(_model(), world_size=1, iters=0)
    with pytest.raises(ValueError, match=r"engine \('fsdp'\) is not 'ddp', 'deepspeed' or 'fsdp2'"):
        measure_step_update(_model(), world_size=1, engine="fsdp")


def test_an_optimizer_that_cannot_be_rebuilt_from_its_defaults_falls_back_to_adamw():
    class Custom(torch.optim.SGD):
        def __init__(self, params, scale):  # does not accept its own defaults back
            super().__init__(params, lr=0.1 * scale)

    model = _model()
    got = measure_step_update(model, world_size=1, optimizer=Custom(model.parameters(), 1.0))
    assert got.optimizer_step_s > 0


class _Recording(torch.optim.SGD):
    """An optimizer that remembers the shapes it was built over."""

    seen: list = []

    def __init__(self, params, lr=0.1, **kw):
        params = list(params)
        _Recording.seen.append([tuple(p.shape) for p in params])
        super().__init__(params, lr=lr)


def test_stand_ins_follow_the_engine_parameter_shapes_for_ddp_one_flat_shard_for_zero1():
    model = _model()  # Linear(64, 64) + Linear(64, 8): 4 tensors, 4680 elements
    _Recording.seen.clear()
    measure_step_update(model, world_size=1, optimizer=_Recording(model.parameters()), iters=1)
    assert _Recording.seen[-1] == [(64, 64), (64,), (8, 64), (8,)]  # per-tensor, like the ddp engine
    measure_step_update(model, world_size=1, optimizer=_Recording(model.parameters()), engine="deepspeed", iters=1)
    assert _Recording.seen[-1] == [(4680,)]  # ZeRO-1: one flat shard (1/W of the parameters; W = 1 here)
    measure_step_update(model, world_size=1, optimizer=_Recording(model.parameters()), engine="fsdp2", iters=1)
    assert _Recording.seen[-1] == [(4096,), (64,), (512,), (8,)]  # fsdp2: each tensor's flat 1/W shard
    # capped: whole tensors up to max_elements (always at least one)
    measure_step_update(model, world_size=1, optimizer=_Recording(model.parameters()), iters=1, max_elements=4096)
    assert _Recording.seen[-1] == [(64, 64)]
