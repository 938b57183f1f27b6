"""W = 2: the paper's loop with profiling inside the same run (no table given), exact gradients of the
real planner's steps, a hand-made mixed step, and sample weighting, in one spawn."""

from __future__ import annotations

import copy

import pytest
import torch

from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig, RuntimeConfig
from dcp.distributed.launch import run_distributed
from tests.dist._runtime_cases import build, config_for, group, reference_grads, step

pytestmark = pytest.mark.dist


def _updates_equal_reference(mgr, model, data, epoch: int, weighting: str = "tokens") -> dict:
    """One epoch of the paper's loop; every optimizer step's update equals -lr * the reference gradient of
    the mean loss over that step's samples (SGD, lr = 1). Steps in which this rank idles yield no batch: the
    weights the rank sees next have moved by those steps too, so a step followed by idle ones is checked against
    the chained reference of all of them (the epoch's plans are deterministic: planning it again gives the same
    steps). With a table profiled in the run which steps a rank idles changes from run to run; counting only
    steps followed by a busy one left some runs with none. The rank's last step is checked with the epoch's
    steps after it (all idle for this rank)."""
    eng = mgr.engine
    n_steps, sp_seen, plan, before, want = 0, set(), None, None, None

    all_plans: list = []

    def check(upto: int) -> None:
        """The weights moved by the reference of ``plan``'s step and the idle steps after it, up to ``upto``."""
        moved = want
        if upto > plan.step + 1:  # a fresh epoch's plans: step k is the k-th of epoch_plans
            all_plans[:] = all_plans or list(mgr.epoch_plans(epoch))
            moved = _chained_update(model, data, before, want, all_plans[plan.step + 1:upto], weighting)
        for b, p, w in zip(before, list(model.parameters()), moved, strict=True):
            torch.testing.assert_close(b - p.detach(), w, rtol=1e-4, atol=1e-6)

    data.set_epoch(epoch)
    for batch in mgr.get_data_iter():
        if mgr.plan is not plan:  # first micro-batch of a new step: the previous steps are complete
            if plan is not None:
                check(mgr.plan.step)
                n_steps += 1
            plan = mgr.plan
            before = [p.detach().clone() for p in model.parameters()]
            want = reference_grads(model, data, plan.sample_ids, weighting=weighting)  # at the pre-step weights
        mgr.optimize_dynamics(batch, eng)
        assert mgr.group is not None  # never the world group, also at sp_size 1
        sp_seen.add(mgr.ctx.sp_size)
        with mgr.profile(batch, eng, mgr.gas):
            loss = eng(batch)
            eng.backward(loss)
            eng.step()
    # the rank's last step, with the epoch's steps after it, which idle this rank but moved the weights too (the
    # epoch's plans are deterministic: planning it again gives the same steps)
    if plan is not None:
        check(len(all_plans) or sum(1 for _ in mgr.epoch_plans(epoch)))
        n_steps += 1
    return {"steps": n_steps, "sp": sorted(sp_seen)}


def _chained_update(model, data, before, first, plans, weighting: str) -> list[torch.Tensor]:
    """before - (the weights after the update ``first`` and then each of ``plans``' reference updates, SGD lr = 1)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p, b, g in zip(ref.parameters(), before, first, strict=True):
            p.copy_(b - g)
    for plan in plans:
        grads = reference_grads(ref, data, plan.sample_ids, weighting=weighting)
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads, strict=True):
                p.sub_(g)
    return [b - p.detach() for b, p in zip(before, ref.parameters(), strict=True)]


def _w2(rank: int, world: int, cache_dir: str) -> dict:
    from dcp.profiler import set_manager  # the paper's import

    out = {}
    # 1. No table: need_profile() -> init_profiler() profiles inside this run, on both ranks, and caches.
    model, data = build("t1d")
    cfg = DCPConfig(
        model=model.config.shape(),
        profiling=ProfilingConfig(seq_group_edges=(8, 16, 32), max_micro_batch_size=2, cache_dir=cache_dir),
        planning=PlanningConfig(sp_sizes=(1, 2), ranks_per_node=8, mem_capacity_gib=1.0, gmax=2),
        advanced=AdvancedConfig(warmup_iters=0, measure_iters=1, plan_check_timeout_s=120.0),
    )
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    mgr = set_manager(model, data, cfg, optimizer=opt)
    needed = [mgr.need_profile()]
    mgr.init_profiler()
    out["epoch0"] = _updates_equal_reference(mgr, model, data, 0)
    needed.append(mgr.need_profile())  # the table is in memory now
    # a second manager in the same job finds the cache: no second profiling run
    model2, data2 = build("t1d")
    mgr2 = set_manager(model2, data2, cfg, optimizer=torch.optim.SGD(model2.parameters(), lr=1.0))
    needed.append(mgr2.need_profile())
    out["needed"] = needed

    # 2. Hand-made steps at W = 2: one SP-2 group, then two SP-1 groups with unequal ga_steps and recompute,
    #    with token weighting and with sample weighting (b = 1 micro-batches: exact per-sample means).
    for weighting in ("tokens", "samples"):
        model, data = build("t1d", seed=1)
        plans = [
            step(0, world, group(data, 0, 2, 1, [0], [1], [2])),
            step(1, world, group(data, 0, 1, 0, [3], [4], [5]), group(data, 1, 1, 2, [6])),
        ]
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        mgr = set_manager(model, data, config_for(model, weighting=weighting), optimizer=opt,
                          plans=lambda e, plans=plans: [plans[e]])
        out[weighting] = [_updates_equal_reference(mgr, model, data, e, weighting) for e in range(2)]

    # 3. A step in which rank 1 idles: its update is checked with the step before it (the chained reference).
    model, data = build("t1d", seed=2)
    plans = [step(0, world, group(data, 0, 2, 1, [0], [1]), number=0),
             step(0, world, group(data, 0, 1, 0, [3], [2]), group(data, 1, 1, 0), number=1),
             step(0, world, group(data, 0, 2, 0, [4], [5]), number=2)]
    mgr = set_manager(model, data, config_for(model), optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                      plans=lambda e: plans)
    out["idle"] = _updates_equal_reference(mgr, model, data, 0)
    return out


def test_w2_profile_in_run_and_exact_gradients(tmp_path):
    out = run_distributed(_w2, 2, str(tmp_path / "cache"), timeout_s=280)
    for o in out:
        assert o["needed"] == [True, False, False]
        assert o["epoch0"]["steps"] >= 1
        for weighting in ("tokens", "samples"):
            assert [s["steps"] for s in o[weighting]] == [1, 1]
            assert [s["sp"] for s in o[weighting]] == [[2], [1]]
    assert [o["idle"]["steps"] for o in out] == [3, 2]  # rank 1's first check covers its idle step
    assert list((tmp_path / "cache").iterdir()), "the profiled table was cached"
