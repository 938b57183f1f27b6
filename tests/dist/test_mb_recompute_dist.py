"""Recompute per micro-batch at runtime (``StepPlan.mb_recompute_layers``): in one SP-2 group, micro-batches at
r = 0, the group's r and r = 1 switch the checkpointing micro-batch by micro-batch (counted), and the step's
update equals the one-process reference gradient and the same step with every micro-batch at the group's r
(recompute must not change numerics). One spawn (W=2)."""

from __future__ import annotations

import pytest
import torch

import dcp.runtime.recompute as recompute_mod
from dcp.api import set_manager
from dcp.distributed.launch import run_distributed
from tests.dist._runtime_cases import build, config_for, group, reference_grads, step

pytestmark = pytest.mark.dist

OWN_R = (0, None, 1)
"""Each micro-batch's r in the mixed step (None: the group's, 3)."""
GROUP_R = 3


def _plan(data, epoch: int, own: bool):
    g = group(data, 0, 2, GROUP_R, [0, 1], [2], [3, 4])
    if own:
        mbs = tuple(m if r is None else m._replace(recompute_layers=r)
                    for m, r in zip(g.micro_batches, OWN_R, strict=True))
        g = g._replace(micro_batches=mbs)
    return step(epoch, 2, g)


def _one_step(own: bool, calls: list[int]) -> dict:
    """One step of ``_plan`` (fresh model and manager, epoch 0): per micro-batch its context's r and the layer
    forwards checkpointed, the update (checked against the one-process reference gradient) and the loss."""
    model, data = build("t1d")
    plan = _plan(data, 0, own)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    mgr = set_manager(model, data, config_for(model), optimizer=opt, plans=lambda e: [plan])
    eng = mgr.engine
    out: dict = {"r": [], "checkpoints": []}
    data.set_epoch(0)
    want = reference_grads(model, data, plan.sample_ids)
    start = [p.detach().clone() for p in model.parameters()]
    for batch in mgr.get_data_iter():
        ctx = mgr.optimize_dynamics(batch, eng)
        before = calls[0]
        loss = eng(batch)
        eng.backward(loss)
        eng.step()
        out["r"].append((ctx.recompute_layers, mgr.ctx.recompute_layers))
        out["checkpoints"].append(calls[0] - before)
    out["update"] = [b - p.detach() for b, p in zip(start, model.parameters(), strict=True)]
    for g, w in zip(out["update"], want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    out["loss"] = [s.loss for s in mgr.step_stats]
    out["layers"] = model.config.num_layers
    return out


def _run(rank: int, world: int) -> dict:
    calls = [0]
    inner = recompute_mod.checkpoint

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    recompute_mod.checkpoint = counted
    try:
        mixed, plain = _one_step(True, calls), _one_step(False, calls)
    finally:
        recompute_mod.checkpoint = inner
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-7)
               for a, b in zip(mixed.pop("update"), plain.pop("update"), strict=True))
    return {"mixed": mixed, "plain": plain, "same": same}


@pytest.fixture(scope="module")
def results():
    return run_distributed(_run, 2, timeout_s=240)


def test_each_micro_batch_runs_its_own_recompute_with_the_same_numerics(results):
    own = [GROUP_R if r is None else r for r in OWN_R]
    for out in results:
        mixed, plain = out["mixed"], out["plain"]
        assert mixed["layers"] > GROUP_R
        assert mixed["r"] == [(r, r) for r in own]  # optimize_dynamics's context is mgr.ctx, at the micro-batch's r
        assert plain["r"] == [(GROUP_R, GROUP_R)] * 3
        # the switch is per micro-batch: the layer forwards checkpointed are the micro-batch's r
        assert mixed["checkpoints"] == own and plain["checkpoints"] == [GROUP_R] * 3
        assert out["same"]  # the mixed step's update equals the all-at-the-group's-r step's
        assert len(mixed["loss"]) == 1 and mixed["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert results[0]["mixed"]["loss"] == results[1]["mixed"]["loss"]
