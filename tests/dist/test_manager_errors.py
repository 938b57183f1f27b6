"""Ranks that planned differently fail fast with PlanMismatchError instead of hanging (W=2)."""

from __future__ import annotations

import time

import pytest
import torch

from dcp.runtime.manager import PlanMismatchError, set_manager
from dcp.distributed.launch import run_distributed
from tests.dist._runtime_cases import build, config_for, group, planner_setup, step

pytestmark = pytest.mark.dist


def _expect_mismatch(mgr) -> tuple[str, float]:
    t0 = time.perf_counter()
    try:
        for batch in mgr.get_data_iter():
            mgr.train_micro_batch(batch)
    except PlanMismatchError as exc:
        return str(exc), time.perf_counter() - t0
    raise AssertionError("no PlanMismatchError")


def _mismatches(rank: int, world: int) -> dict:
    out = {}
    # 1. a different planning seed on rank 1: different shuffles, different step 0
    model, data, config, table = planner_setup(world, seed=rank)
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    out["seed"] = _expect_mismatch(mgr)
    # 2. rank 1 plans one step more than rank 0: the epoch's digest counts the plans
    model, data = build("t1d")
    plans = [step(0, 2, group(data, 0, 2, 0, [0])), step(0, 2, group(data, 0, 2, 0, [1]), number=1)]
    mgr = set_manager(model, data, config_for(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans[: 1 + rank])
    out["count"] = _expect_mismatch(mgr)
    return out


def test_plan_mismatch_fails_fast_on_every_rank():
    results = run_distributed(_mismatches, 2, timeout_s=120)
    for res in results:
        msg, seconds = res["seed"]
        assert "epoch 0 (its step plans)" in msg and "ranks [1]" in msg and "dataset.lengths()" in msg
        assert "rank 0:" in msg and "rank 1:" in msg
        assert seconds < 10.0
        msg, seconds = res["count"]
        assert "ranks [1]" in msg and seconds < 10.0
    # caught before the first step: no rank trained anything on a divergent plan
    assert all("epoch 0 (its step plans)" in r["count"][0] for r in results)


def _process_planning(rank: int, world: int) -> dict:
    import dataclasses

    from dcp.planner import plan_epoch

    out = {}
    # both ranks plan in child processes (planning.plan_ahead = "process"): the loop runs their plans
    model, data, config, table = planner_setup(world)
    config = config.replace(planning=dataclasses.replace(config.planning, plan_ahead="process"))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    ran = []
    for batch in mgr.get_data_iter():
        if not ran or mgr.plan is not ran[-1]:
            ran.append(mgr.plan)
        mgr.train_micro_batch(batch)
    out["same_as_local"] = [p.digest() for p in ran if p is not None] == [
        p.digest() for p in plan_epoch(data.lengths(), table, config, world)
        if p.group_of(rank).micro_batches]
    # rank 1 with another seed, still in a child process: caught before any step, as with the thread
    model, data, config, table = planner_setup(world, seed=rank)
    config = config.replace(planning=dataclasses.replace(config.planning, plan_ahead="process"))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    out["seed"] = _expect_mismatch(mgr)
    return out


def test_plans_made_in_child_processes_run_and_are_checked():
    results = run_distributed(_process_planning, 2, timeout_s=180)
    for res in results:
        assert res["same_as_local"]
        msg, seconds = res["seed"]
        assert "epoch 0 (its step plans)" in msg and "ranks [1]" in msg and seconds < 10.0
