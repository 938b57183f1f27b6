"""fsdp2 engine (torch fully_shard): exact parameters after DCP steps with unequal micro-batch counts, an SP-2
group and an idle rank, against one process (W=2, gloo). A deadlock fails by the launcher's timeout."""

from __future__ import annotations

import copy

import pytest
import torch

from dcp.api import set_manager
from dcp.distributed.launch import run_distributed
from dcp.runtime.engines import EngineError, deepspeed_config
from tests.dist._runtime_cases import build, config_for, group, reference_grads, step

pytestmark = pytest.mark.dist


def steps_w2(data):
    """Three one-step epochs: 3 vs 1 micro-batches (the case that hangs with per-forward gathers), one SP-2
    group with 2 micro-batches, rank 1 idle."""
    return [
        step(0, 2, group(data, 0, 1, 0, [0], [1, 2], [3]), group(data, 1, 1, 1, [4])),
        step(1, 2, group(data, 0, 2, 1, [5], [6, 7])),
        step(2, 2, group(data, 0, 1, 0, [8], [9]), group(data, 1, 1, 0)),
    ]


def full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def check_fsdp2(rank: int, world: int, kind: str, engine: str = "fsdp2") -> dict:
    model, data = build(kind)
    ref = copy.deepcopy(model)  # the one-process replay: plain SGD on the mean-loss gradient of each step
    plans = steps_w2(data)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    mgr = set_manager(model, data, config_for(model, engine=engine), optimizer=opt, lr_scheduler=sched,
                      plans=lambda e: [plans[e]])
    eng = mgr.engine
    micro = 0
    for epoch, plan in enumerate(plans):
        data.set_epoch(epoch)
        want = reference_grads(ref, data, plan.sample_ids)
        with torch.no_grad():
            for p, g in zip(ref.parameters(), want, strict=True):
                p -= g
        for batch in mgr.get_data_iter():
            mgr.train_micro_batch(batch)
            micro += 1
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(full(p.detach()), q.detach(), rtol=1e-4, atol=1e-6, msg=name)
    sharded = sum(p.to_local().numel() for p in model.parameters())
    return {"engine": eng.name, "micro": micro, "opt_steps": eng.optimizer_steps, "sched": sched.last_epoch,
            "local_params": sharded, "params": sum(p.numel() for p in ref.parameters())}


def _run(rank: int, world: int) -> dict:
    return {kind: check_fsdp2(rank, world, kind) for kind in ("t1d", "t2d", "hf")}


def test_fsdp2_exact_parameters_unequal_micro_batches_idle_rank():
    results = run_distributed(_run, 2, timeout_s=240, pg_timeout_s=60)
    for kind in ("t1d", "t2d", "hf"):
        out = [r[kind] for r in results]
        assert [o["micro"] for o in out] == [7, 3]  # 3+2+2 vs 1+2+0: unequal counts and an idle step
        assert all(o["opt_steps"] == 3 and o["sched"] == 3 for o in out)
        # parameters are sharded: each rank holds about half of them
        assert sum(o["local_params"] for o in out) == out[0]["params"]
        assert max(o["local_params"] for o in out) < 0.6 * out[0]["params"]


def _run_zero3(rank: int, world: int) -> dict:
    return {kind: check_fsdp2(rank, world, kind, "fsdp2-zero3") for kind in ("t1d", "hf")}


def test_fsdp2_zero3_mode_exact_parameters_with_unequal_micro_batch_counts():
    """Per-layer gathers and reduce-scatters in every micro-batch: ranks with fewer micro-batches than the step's
    largest ga_steps (3 vs 1, 2 vs 0: idle) fill the slots with zero-weight passes, so the gathers stay matched."""
    results = run_distributed(_run_zero3, 2, timeout_s=240, pg_timeout_s=60)
    for kind in ("t1d", "hf"):
        out = [r[kind] for r in results]
        assert [o["micro"] for o in out] == [7, 3] and all(o["opt_steps"] == 3 for o in out)
        assert sum(o["local_params"] for o in out) == out[0]["params"]
        assert all(o["engine"] == "fsdp2-zero3" for o in out)


def test_fsdp2_needs_torch_distributed():
    from dcp.runtime.fsdp import FSDP2Engine

    model, _ = build("t1d")
    with pytest.raises(EngineError, match="torch.distributed initialised"):
        FSDP2Engine(model, torch.optim.SGD(model.parameters(), lr=1.0))


def test_deepspeed_zero3_refusal_names_fsdp2():
    with pytest.raises(EngineError, match="fsdp2"):
        deepspeed_config(2, zero_stage=3)
    with pytest.raises(EngineError, match="fsdp2"):
        deepspeed_config(2, user_config={"zero_optimization": {"stage": 2}})


def _bf16(rank: int, world: int) -> dict:
    """fsdp2 and fsdp2-zero3 under runtime.precision 'bf16' (bf16 compute, fp32 reduction into fp32 shards) on the
    same plans and initial weights: the parameters after three steps, gathered."""
    import dataclasses

    out = {}
    for engine in ("fsdp2", "fsdp2-zero3"):
        model, data = build("t1d")
        plans = steps_w2(data)
        cfg = config_for(model, engine=engine)
        cfg = cfg.replace(runtime=dataclasses.replace(cfg.runtime, precision="bf16"))
        mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                          plans=lambda e, plans=plans: [plans[e]])
        for epoch in range(len(plans)):
            data.set_epoch(epoch)
            for batch in mgr.get_data_iter():
                mgr.train_micro_batch(batch)
        out[engine] = [full(p.detach()).float().numpy() for p in model.parameters()]  # by value, not shared memory
        out["precision"] = mgr.precision
    return out


def test_zero3_in_bf16_updates_as_fsdp2_does():
    results = run_distributed(_bf16, 2, timeout_s=280)
    assert results[0]["precision"] == "bf16"
    for a, b in zip(results[0]["fsdp2-zero3"], results[0]["fsdp2"], strict=True):
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        assert torch.isfinite(a).all()
        # the same bf16 forwards and backwards; zero3 reduce-scatters each slot's fp32 gradient, fsdp2 the sum
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-4)
