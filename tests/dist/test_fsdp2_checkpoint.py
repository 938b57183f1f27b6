"""fsdp2 sharded checkpoint (torch.distributed.checkpoint): a run saved mid-epoch at W=2 and resumed at W=2 has the
uninterrupted run's losses and parameters; resumed at W=3 (fsdp2-zero3) or W=1 (ddp) it continues exactly like one
process replaying the resumed run's steps from the saved state, and every sample of the epoch is trained once (gloo,
AdamW)."""

from __future__ import annotations

import copy
import dataclasses
import os

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_optimizer_state_dict

from dcp.api import set_manager
from dcp.distributed.launch import run_distributed
from dcp.runtime.checkpoint import STATE_FILE, load_checkpoint, save_checkpoint
from dcp.runtime.context import SPContext
from dcp.runtime.position import PositionError
from tests.dist._runtime_cases import PLANNER_LENGTHS, planner_setup, reference_grads

pytestmark = pytest.mark.dist

SAVE_AT = 1  # optimizer steps before the checkpoint


def _full(p: torch.Tensor) -> np.ndarray:
    """The whole parameter as numpy (tensors do not cross the result queue of spawned ranks)."""
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy().copy()


def _run(world: int, *, engine: str = "fsdp2", seed: int = 0, folder: str | None = None,
         max_steps: int | None = None, save: str | None = None) -> dict:
    if world == 1:  # one rank needs the memory of its longest samples at SP = 1
        from tests.unit.test_resume_exactly_once import setup

        model, data, config, table = setup()
    else:
        model, data, config, table = planner_setup(world)
    if seed:  # another init, overwritten by the checkpoint: proves the state really is restored
        torch.manual_seed(seed)
        for p in model.parameters():
            torch.nn.init.normal_(p)
    config = dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, engine=engine, log_every=1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    mgr = set_manager(model, data, config, optimizer=opt, lr_scheduler=sched, table=table)
    if folder is not None:
        load_checkpoint(mgr, folder)
    steps: dict[int, list[int]] = {}
    for batch in mgr.get_data_iter(max_steps=max_steps):
        steps[mgr.global_step + 1] = list(mgr.plan.sample_ids)  # global step number of the step being run
        mgr.train_micro_batch(batch)
    if save is not None:
        save_checkpoint(mgr, save)
        _, adam = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if torch.distributed.get_rank() == 0:  # the full Adam state at the save, for the one-process replay
            torch.save(adam, save + "-adam.pt")
    return {"losses": {s.global_step: s.loss for s in mgr.step_stats}, "steps": steps, "epoch": mgr.epoch,
            "params": [_full(p) for p in model.parameters()], "lr": opt.param_groups[0]["lr"]}


def _save_and_same_world(rank: int, world: int, folder: str) -> dict:
    whole = _run(world)
    first = _run(world, max_steps=SAVE_AT, save=folder)
    rest = _run(world, seed=123, folder=folder)
    return {"whole": whole, "first": first, "rest": rest,
            "bytes": os.path.getsize(os.path.join(folder, f"__{rank}_0.distcp"))}


def _resume_elsewhere(rank: int, world: int, folder: str, engine: str) -> dict:
    return _run(world, engine=engine, seed=321, folder=folder)


def _merged(per_rank: list[dict]) -> dict[int, list[int]]:
    steps: dict[int, list[int]] = {}
    for out in per_rank:
        steps.update(out["steps"])  # an idle rank saw none of a step; the busy ones all see its ids
    return steps


def _replay(params: list[torch.Tensor], steps: dict[int, list[int]], folder: str) -> tuple[dict, list]:
    """One process, plain model: the saved parameters and Adam state, then each step's mean-loss gradient."""
    model, data, _, _ = planner_setup(1)
    with torch.no_grad():
        for p, q in zip(model.parameters(), params, strict=True):
            p.copy_(torch.from_numpy(q))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    set_optimizer_state_dict(model, opt, torch.load(folder + "-adam.pt", weights_only=False))
    for group in opt.param_groups:
        group["lr"] = 0.01 * 0.8 ** SAVE_AT
    losses = {}
    data.set_epoch(0)
    for number in sorted(steps):
        ref = copy.deepcopy(model)
        ids = steps[number]
        with torch.no_grad():  # the step's mean loss over its samples' tokens, as StepStats.loss
            total = sum(float(ref(data.collate([data[i]]), SPContext.single())[0]) for i in ids)
            count = sum(int((data.collate([data[i]]).targets != -100).sum()) for i in ids)
        losses[number] = total / count
        grads = reference_grads(model, data, ids)
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g
        opt.step()
        for group in opt.param_groups:
            group["lr"] *= 0.8
    return losses, [p.detach() for p in model.parameters()]


def test_fsdp2_checkpoint_resumes_on_the_same_and_other_world_sizes(tmp_path):
    folder = str(tmp_path / "ckpt")
    out = run_distributed(_save_and_same_world, 2, folder, timeout_s=400, pg_timeout_s=120)
    whole, first, rest = out[0]["whole"], out[0]["first"], out[0]["rest"]
    assert set(first["losses"]) == set(range(1, SAVE_AT + 1)) and len(whole["losses"]) > SAVE_AT + 1
    # W=2 -> W=2: the same plan continues; losses and parameters equal the uninterrupted run's
    assert set(rest["losses"]) == set(whole["losses"]) - set(first["losses"])
    for number, loss in rest["losses"].items():
        assert loss == pytest.approx(whole["losses"][number], rel=1e-5), number
    for a, b in zip(rest["params"], whole["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert rest["lr"] == pytest.approx(whole["lr"])
    # each rank wrote its own shards only (about half of the model and Adam state each)
    assert all(o["bytes"] > 0 for o in out) and os.path.isfile(os.path.join(folder, STATE_FILE))

    before = _merged([o["first"] for o in out])
    saved_ids = [i for s in range(1, SAVE_AT + 1) for i in before[s]]
    # another world size and another engine: the fsdp2 shards resharded over 3 ranks of the ZeRO-3 mode, and
    # gathered into one rank's plain (ddp) tensors
    for w, engine in ((3, "fsdp2-zero3"), (1, "ddp")):
        after = run_distributed(_resume_elsewhere, w, folder, engine, timeout_s=300, pg_timeout_s=120)
        steps = _merged(after)
        assert min(steps) == SAVE_AT + 1 and all(a["epoch"] == 1 for a in after), w
        assert sorted(saved_ids + [i for ids in steps.values() for i in ids]) == list(range(len(PLANNER_LENGTHS)))
        losses, params = _replay(first["params"], steps, folder)
        assert set(after[0]["losses"]) == set(losses), w
        for number, loss in losses.items():
            assert after[0]["losses"][number] == pytest.approx(loss, rel=1e-4), (w, number)
        for a, b in zip(after[0]["params"], params, strict=True):
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-5)


def test_load_checkpoint_refuses_a_folder_without_a_checkpoint(tmp_path):
    from tests.unit.test_resume_exactly_once import manager

    with pytest.raises(PositionError, match=r"checkpoint folder \(.*\) holds no dcp_state.pt and .metadata"):
        load_checkpoint(manager(), str(tmp_path))


def test_checkpoint_folder_refused_for_the_deepspeed_engine(tmp_path):
    from types import SimpleNamespace

    mgr = SimpleNamespace(engine=SimpleNamespace(ds=object(), name="deepspeed"))
    for call in (save_checkpoint, load_checkpoint):
        with pytest.raises(PositionError, match=r"checkpoint folder .* deepspeed engine.*ds.save_checkpoint"):
            call(mgr, str(tmp_path))
