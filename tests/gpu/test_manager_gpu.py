"""The manager end to end on CUDA (W = 1, NCCL) for both reference models and both engines, in bf16 ('auto'
on CUDA) and fp32: step updates against the fp32 CPU reference gradient, everything on the GPU, busy times
from CUDA events. Skipped without CUDA; the DeepSpeed cases are skipped when it is not installed."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from dcp.distributed.launch import run_distributed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TOLERANCE = {"bf16": 3e-2, "fp32": 1e-3}  # relative error of the whole update vs the fp32 reference


def _run(rank: int, world: int, kind: str, engine: str, precision: str) -> dict:
    from dcp.api import set_manager
    from tests.dist._runtime_cases import build, config_for, group, reference_grads, step

    torch.cuda.set_device(0)
    model, data = build(kind)
    ref_model, _ = build(kind)  # the same initial weights, kept on the CPU in fp32
    model = model.cuda()
    plans = [step(0, 1, group(data, 0, 1, 0, [0, 1], [2])), step(1, 1, group(data, 0, 1, 2, [3], [4, 5]))]
    base = config_for(model, engine=engine)
    cfg = base.replace(runtime=dataclasses.replace(base.runtime, precision=precision))
    mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                      plans=lambda e: [plans[e]])
    errors = []
    for epoch, plan in enumerate(plans):
        data.set_epoch(epoch)
        before = _masters(mgr, model)
        with torch.no_grad():
            for p, m in zip(ref_model.parameters(), before, strict=True):
                p.copy_(m.cpu())
        want = torch.cat([g.reshape(-1) for g in reference_grads(ref_model, data, plan.sample_ids)])
        for batch in mgr.get_data_iter():
            assert batch.inputs.device.type == "cuda"  # the iterator moved it
            mgr.train_micro_batch(batch)
        got = torch.cat([(b - a).reshape(-1).cpu() for b, a in zip(before, _masters(mgr, model), strict=True)])
        errors.append(float((got - want).norm() / want.norm()))
    return {"errors": errors, "device": str(mgr.device), "precision": mgr.precision,
            "loss": [s.loss for s in mgr.step_stats], "busy": [s.busy_s[0] for s in mgr.step_stats],
            "measured": len(mgr.measurements)}


def _masters(mgr, model) -> list[torch.Tensor]:
    if mgr.engine.name == "deepspeed":
        from deepspeed.utils import safe_get_full_fp32_param

        return [safe_get_full_fp32_param(p).detach().clone() for p in model.parameters()]
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("engine", ["ddp", "deepspeed"])
@pytest.mark.parametrize("kind", ["t1d", "t2d"])
def test_manager_end_to_end_on_cuda(kind, engine, precision):
    if engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    out = run_distributed(_run, 1, kind, engine, precision, backend="nccl", timeout_s=300,
                          env={"DS_ACCELERATOR": "cuda"})[0]
    assert out["device"].startswith("cuda") and out["precision"] == precision
    assert all(e < TOLERANCE[precision] for e in out["errors"]), out["errors"]
    assert all(loss > 0 for loss in out["loss"]) and all(b > 0 for b in out["busy"])
    assert out["measured"] == 4  # every micro-batch's GPU time was resolved at the stats exchange
