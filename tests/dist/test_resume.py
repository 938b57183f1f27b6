"""Resume mid-epoch: same remaining data order and same parameters as an uninterrupted run (W=2)."""

from __future__ import annotations

import io

import pytest
import torch

from dcp.api import set_manager
from dcp.distributed.launch import run_distributed
from tests.dist._runtime_cases import planner_setup

pytestmark = pytest.mark.dist


def _train(rank: int, world: int, seed: int, state: bytes | None, max_steps: int | None):
    model, data, config, table = planner_setup(world, seed=0)
    if seed:  # a different init, overwritten by the checkpoint: proves the state is really restored
        torch.manual_seed(seed)
        for p in model.parameters():
            torch.nn.init.normal_(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    mgr = set_manager(model, data, config, optimizer=opt, lr_scheduler=sched, table=table)
    if state is not None:
        ckpt = torch.load(io.BytesIO(state), weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        mgr.load_state_dict(ckpt["dcp"])
    order = []
    for batch in mgr.get_data_iter(max_steps=max_steps):
        order.append((mgr.plan.step, batch.sample_ids))
        mgr.train_micro_batch(batch)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "dcp": mgr.state_dict()}, buf)
    params = [p.detach().clone() for p in model.parameters()]
    return order, params, buf.getvalue(), mgr.state_dict(), sched.last_epoch


def _resume(rank: int, world: int) -> dict:
    full_order, full_params, _, full_state, full_sched = _train(rank, world, 0, None, None)
    steps = full_state["global_step"]
    k = steps // 2
    first_order, _, ckpt, mid_state, _ = _train(rank, world, 0, None, k)
    rest_order, rest_params, _, end_state, rest_sched = _train(rank, world, 123, ckpt, None)
    assert first_order + rest_order == full_order
    assert mid_state["epoch"] == 0 and mid_state["step_in_epoch"] == k
    assert end_state["epoch"] == full_state["epoch"] == 1 and end_state["global_step"] == steps
    assert rest_sched == full_sched == steps  # scheduler stepped once per optimizer step, state restored
    for a, b in zip(rest_params, full_params, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    return {"steps": steps, "k": k, "first": len(first_order), "rest": len(rest_order)}


def test_resume_mid_epoch_same_order_and_parameters():
    out = run_distributed(_resume, 2, timeout_s=240)
    assert out[0]["steps"] >= 3 and out[0]["first"] > 0 and out[0]["rest"] > 0
