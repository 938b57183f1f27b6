"""A step whose loss is not finite never reaches the weights: runtime.nonfinite = 'stop' raises on every rank
naming the step, the rank and the samples, nothing applied; 'skip' drops the step, records its samples as skipped
and trains every other sample exactly once (2 and 3 gloo ranks, the real planner)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.distributed.launch import run_distributed
from dcp.runtime.guard import NonFiniteError

pytestmark = pytest.mark.dist


def _job(rank: int, world: int, policy: str, bad_step: int, engine: str = "ddp") -> dict:
    from dcp.api import set_manager
    from dcp.planner import CPU_SMALL, analytic_table
    from tests.dist._runtime_cases import planner_setup

    model, data, config, _ = planner_setup(world)
    config = config.replace(runtime=dataclasses.replace(config.runtime, nonfinite=policy, engine=engine),
                            planning=dataclasses.replace(config.planning, mem_capacity_gib=0.05))
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=(1, 2), max_micro_batch_size=4,
                           world_size=world, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    planning_only = config.replace(runtime=dataclasses.replace(config.runtime, engine="ddp"))  # never shards
    plans = list(set_manager(model, data, planning_only, table=table).epoch_plans(0))
    # the poisoned sample: the first sample of the bad step's first micro-batch (a rank of the step runs it)
    poison = plans[bad_step].groups[0].micro_batches[0].sample_ids[0]

    def forward(m, batch, ctx):
        loss_sum, count = m(batch, ctx)
        if poison in batch.sample_ids:
            loss_sum = loss_sum * float("nan")
        return loss_sum, count

    torch.manual_seed(0)
    mgr = set_manager(model, data, config, table=table, forward_fn=forward,
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    before: list[torch.Tensor] = []
    trained: list[int] = []
    try:
        # to the end of the bad step (a step boundary: the checkpoint's position), then the rest of the epoch
        for max_steps in (bad_step + 1, None):
            if max_steps is None and mgr.epoch == 1:
                break  # the bad step was the epoch's last
            for batch in mgr.get_data_iter(max_steps=max_steps):
                if mgr.step_in_epoch == bad_step and not before:
                    before = [p.detach().clone() for p in model.parameters()]
                trained.extend(int(i) for i in batch.sample_ids)
                mgr.train_micro_batch(batch)
            if max_steps is not None:
                state = mgr.state_dict()
    except NonFiniteError as exc:
        same = all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)) if before else None
        digest = float(sum(p.double().sum() for p in model.parameters()))
        return {"error": str(exc), "unchanged": same, "poison": poison, "digest": digest}
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {"finite": finite, "skipped": mgr.skipped_samples, "poison": poison,
            "bad_samples": sorted(int(i) for i in plans[bad_step].sample_id_array), "n": len(data),
            "trained": trained, "state": state, "epoch": mgr.epoch}


def _stop_job(rank: int, world: int) -> dict:
    out = _job(rank, world, "stop", 1)
    assert "error" in out, out
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_stop_raises_on_every_rank_naming_the_samples_and_applies_nothing(world):
    results = run_distributed(_stop_job, world, timeout_s=240)
    # the weights of the step before on every rank that ran a micro-batch of it, and the same on every rank
    assert all(r["unchanged"] in (True, None) for r in results) and results[0]["unchanged"] is True
    assert len({r["digest"] for r in results}) == 1
    assert len({r["error"] for r in results}) == 1  # the same line on every rank
    text = results[0]["error"]
    assert "epoch 0 step 1 (optimizer step 2)" in text and "the loss is not finite on 1 rank" in text, text
    assert f"samples [{results[0]['poison']}" in text and "was not applied" in text, text


@pytest.mark.parametrize(("world", "engine"), [(2, "ddp"), (3, "ddp"), (2, "fsdp2-zero3")])
def test_skip_drops_the_step_and_trains_every_other_sample_once(world, engine):
    # fsdp2-zero3: the skipped step's padding slots and per-slot reduce-scatters still match on every rank
    results = run_distributed(_job, world, "skip", 0, engine, timeout_s=240)
    for r in results:
        assert r["finite"] and r["epoch"] == 1
        assert r["skipped"] == {0: r["bad_samples"]} and r["poison"] in r["bad_samples"]
        # the checkpoint at the bad step's end lists them; every sample of the epoch counts as done once
        assert sorted(r["state"]["position"]["skipped"]) == r["bad_samples"]
    first = results[0]
    assert first["state"]["samples_done"] < first["n"]
    trained = sorted(i for r in results for i in set(r["trained"]))  # SP groups share a micro-batch's samples
    assert set(trained) == set(range(first["n"]))


def test_nonfinite_policy_is_validated():
    from dcp.config import RuntimeConfig
    from dcp.validate import ConfigError

    with pytest.raises(ConfigError, match=r"runtime.nonfinite.*'ignore'.*stop.*skip"):
        RuntimeConfig(nonfinite="ignore")
    with pytest.raises(ConfigError, match=r"runtime.nonfinite.*needs the ddp engine"):
        RuntimeConfig(nonfinite="skip", engine="deepspeed")
