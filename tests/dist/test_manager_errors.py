"""Ranks that planned differently fail fast with PlanMismatchError instead of hanging (W=2)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from dcp.api import set_manager
from dcp.distributed.launch import run_distributed
from dcp.runtime.manager import PlanMismatchError
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
    # 2. rank 1 plans one step more than rank 0. Nothing is planned ahead for the check (plans are made lazily), so it
    # shows at the next exchange: with log_every = 1 that is step 1's start (rank 0 is at the epoch's end).
    # (With the default cadence rank 1 would run step 1 first: its SP-2 all-to-all then waits for rank 0,
    # and the exchange's timeout names rank 1's phase instead.)
    model, data = build("t1d")
    plans = [step(0, 2, group(data, 0, 2, 0, [0])), step(0, 2, group(data, 0, 2, 0, [1]), number=1)]
    cfg = config_for(model)
    cfg = cfg.replace(runtime=dataclasses.replace(cfg.runtime, log_every=1))
    mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans[: 1 + rank])
    out["count"] = _expect_mismatch(mgr)
    return out


def test_plan_mismatch_fails_fast_on_every_rank():
    results = run_distributed(_mismatches, 2, timeout_s=120)
    for res in results:
        msg, seconds = res["seed"]
        assert "epoch 0 (its step plans)" in msg and "ranks [1]" in msg and "dataset.lengths()" in msg
        assert "rank 0:" in msg and "rank 1:" in msg
        assert seconds < 60.0
        assert "from epoch 0 step 0 on" in msg  # the first differing step is named
        msg, seconds = res["count"]
        assert "rank 0 at the end of epoch 0, rank 1 at the start of epoch 0 step 1" in msg and seconds < 60.0
    # the same message on every rank; only step 0, the same on both ranks, ran before it
    assert results[0]["count"][0] == results[1]["count"][0]


def _diverge_on_an_unlogged_step(rank: int, world: int) -> dict:
    from dcp.runtime import exchange

    calls: list[int] = []
    name = "all_gather_single" if hasattr(exchange.dist, "all_gather_single") else "all_gather_into_tensor"
    gather = getattr(exchange.dist, name)  # what exchange.gather_into calls

    def counting(rows, row, group=None):  # the exchange's only collective
        calls.append(mgr.global_step)  # optimizer steps done when it runs
        return gather(rows, row, group=group)

    setattr(exchange.dist, name, counting)
    model, data = build("t1d")
    # six steps of two SP-1 groups (no collective but the gradient sync); rank 1's plan of step 4 differs
    plans = [step(0, 2, group(data, 0, 1, 0, [2 * k]), group(data, 1, 1, 0, [2 * k + 1]), number=k)
             for k in range(6)]
    if rank == 1:  # another sample (13, not yet trained: a sample trained twice would be refused at once)
        plans[4] = step(0, 2, group(data, 0, 1, 0, [8]), group(data, 1, 1, 0, [13]), number=4)
    cfg = config_for(model)
    cfg = cfg.replace(runtime=dataclasses.replace(cfg.runtime, log_every=3))
    mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans)
    msg, _ = _expect_mismatch(mgr)
    setattr(exchange.dist, name, gather)
    return {"msg": msg, "calls": calls, "steps": mgr.global_step}


def test_unlogged_steps_run_no_exchange_and_a_divergence_is_named_at_the_next_one():
    results = run_distributed(_diverge_on_an_unlogged_step, 2, timeout_s=120)
    for res in results:
        assert res["steps"] == 6  # the divergent steps 4 and 5 ran (no collective of theirs could tell)
        # exchanges: the first step (data and step 0's plan), logged step 3 (at step 3's start), the end of
        # the epoch (where the plans of steps 4 and 5 are compared), then the failure-only diagnosis (2):
        # none on steps 1, 2, 4 and 5
        assert res["calls"] == [0, 3, 6, 6, 6], res["calls"]
        assert "end of epoch 0: step plans differ across ranks from epoch 0 step 4 on" in res["msg"]
        assert "ranks [1]" in res["msg"]
    assert results[0]["msg"] == results[1]["msg"]


def _refused_next_plan(rank: int, world: int, prefetch: str) -> str:
    """Step 1 runs on rank 0 only (rank 1 is idle and waits in its gradient sync); step 2 plans sample 3 a
    second time. Both ranks must finish step 1 and then raise the same PositionError."""
    from dcp.runtime.position import PositionError

    model, data = build("t1d")
    plans = [step(0, 2, group(data, 0, 1, 0, [0]), group(data, 1, 1, 0, [1]), number=0),
             step(0, 2, group(data, 0, 1, 0, [2], [3]), group(data, 1, 1, 0), number=1),
             step(0, 2, group(data, 0, 1, 0, [3]), group(data, 1, 1, 0, [4]), number=2)]
    cfg = config_for(model)
    cfg = cfg.replace(runtime=dataclasses.replace(cfg.runtime, collective_timeout_s=30.0),
                      advanced=dataclasses.replace(cfg.advanced, prefetch=prefetch))
    mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), plans=lambda e: plans)
    try:
        for batch in mgr.get_data_iter():
            mgr.train_micro_batch(batch)
    except PositionError as exc:
        return f"{mgr.global_step}: {exc}"
    return "no error"


@pytest.mark.parametrize("prefetch", ["off", "on"])
def test_a_refused_next_plan_is_raised_after_the_step_on_every_rank(prefetch):
    """With prefetching the next plan is pulled during a step's last micro-batch; a plan refused there must
    not leave the step unfinished while a rank idle in it waits in its gradient sync (it would fail there,
    or wait out the collective timeout)."""
    results = run_distributed(_refused_next_plan, 2, prefetch, timeout_s=120)
    for res in results:
        assert res.startswith("2: ") and "step 2 plans samples [3] a second time" in res, results
