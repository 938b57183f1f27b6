"""A rank that stalls, dies, leaves the loop early or holds other data is named, in seconds."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dcp.api import set_manager
from dcp.distributed.launch import DistributedFailure, free_port, run_distributed
from dcp.runtime.manager import DataMismatchError, PlanMismatchError
from tests.dist._runtime_cases import build, config_for, group, planner_setup, step
from tests.dist._stall_job import STALL_S, TIMEOUT_S, stall_job

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


def _failed_after(text: str) -> float:
    m = re.search(r"gradient sync of epoch 0 step 1 failed after ([0-9.]+) s \(timeout 5 s\)", text)
    assert m, text
    return float(m.group(1))


def test_a_stalled_rank_is_named_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(DistributedFailure) as info:
        run_distributed(stall_job, 2, "sleep", timeout_s=STALL_S)
    text = str(info.value)
    assert time.monotonic() - t0 < STALL_S / 4  # it did not wait for the stalled rank (loaded-host margin)
    assert "CollectiveError" in text and "rank 0: gradient sync of epoch 0 step 1" in text
    assert "rank 1 is in 'micro-batch 1/1 of epoch 0 step 1'" in text and "stalled or died" in text
    assert _failed_after(text) < TIMEOUT_S + 60.0  # by its timeout, not the stall's end (60 s: a loaded host)


def test_a_dead_rank_is_named():
    with pytest.raises(DistributedFailure) as info:
        run_distributed(stall_job, 2, "exit", timeout_s=120)
    text = str(info.value)
    assert "rank 1 is in 'micro-batch 1/1 of epoch 0 step 1'" in text
    assert "rank 1 exited with code 3 without reporting" in text
    assert _failed_after(text) < TIMEOUT_S + 60.0  # by its timeout, not the stall's end (60 s: a loaded host)


def test_a_rank_killed_in_the_gradient_sync_is_named_with_its_phase_and_stopped_heartbeat():
    with pytest.raises(DistributedFailure) as info:
        run_distributed(stall_job, 2, "exit-in-sync", timeout_s=240)
    last = str(info.value).strip().splitlines()[-1]
    # rank 0 fails in its next collective (the gradients were already reduced inside the backward, so which
    # one depends on the engine's overlap); the line names rank 1, where it was, and that it is gone
    assert last.startswith("dcp.runtime.phases.CollectiveError: rank 0: "), str(info.value)[-3000:]
    assert "rank 1 is in 'gradient sync of epoch 0 step 1'" in last and "heartbeat stopped" in last
    assert "it died or was stopped there" in last and "rank 1 exited with code 3" in str(info.value)


def test_a_stalled_rank_is_named_under_torchrun():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(ROOT / "tests/dist/_stall_job.py"), "sleep"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and time.monotonic() - t0 < STALL_S / 4, text[-3000:]
    assert "rank 1 is in 'micro-batch 1/1 of epoch 0 step 1'" in text, text[-3000:]
    assert _failed_after(text) < TIMEOUT_S + 60.0  # by its timeout, not the stall's end (60 s: a loaded host)


def _data_differ(rank: int, world: int) -> dict[str, str]:
    out = {}
    for weighting in ("tokens", "samples"):
        model, data, config, table = planner_setup(world)
        if rank == 1 and weighting == "tokens":  # same sample count, one length one token longer (same seq_group)
            lengths = data.lengths()
            lengths[lengths.index(309)] = 310
            data = type(data)(lengths, vocab_size=model.config.vocab_size, seed=3)
        elif rank == 1:  # the same lengths, other tokens (the dataset's content_digest tells them apart)
            data = type(data)(data.lengths(), vocab_size=model.config.vocab_size, seed=4)
        config = config.replace(runtime=dataclasses.replace(config.runtime, loss_weighting=weighting))
        mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
        steps = 0
        try:
            for batch in mgr.get_data_iter():
                mgr.train_micro_batch(batch)
                steps += 1
            out[weighting] = "trained"
        except DataMismatchError as exc:
            out[weighting] = f"{steps} {exc}"
    return out


def test_ranks_whose_data_differ_fail_before_the_first_step_in_both_weighting_modes():
    for res in run_distributed(_data_differ, 2, timeout_s=120):
        for weighting in ("tokens", "samples"):
            steps, _, msg = res[weighting].partition(" ")
            assert steps == "0", res[weighting]
            assert "datasets differ" in msg and "ranks [1]" in msg and "dataset.lengths()" in msg


def _leave_early(rank: int, world: int) -> str:
    model, data, config, table = planner_setup(world)
    # log_every = 1: rank 0 exchanges at step 1's start, where rank 1 is back at the plan check (with the
    # default cadence rank 0 would be in step 1's collectives, and the timeout would name rank 1 instead)
    # Both ranks meet at an exchange and find the mismatch there, so no timeout is part of the expected path:
    # a long one keeps a loaded machine (a rank starting seconds after its peer) from failing it differently.
    config = config.replace(runtime=dataclasses.replace(config.runtime, collective_timeout_s=60.0, log_every=1),
                            advanced=dataclasses.replace(config.advanced, plan_check_timeout_s=60.0))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    try:
        for _ in range(2):
            for batch in mgr.get_data_iter():
                mgr.train_micro_batch(batch)
                if rank == 1 and mgr.step_in_epoch == 1:
                    break  # rank 1 leaves after its first step; rank 0 goes on
    except PlanMismatchError as exc:
        return str(exc)
    raise AssertionError("no error")


def test_a_rank_leaving_the_loop_early_gets_the_same_accurate_message_on_every_rank():
    msgs = run_distributed(_leave_early, 2, timeout_s=120)
    assert msgs[0] == msgs[1]
    assert "rank 0 at the start of epoch 0 step 1" in msgs[0] and "rank 1 at the plan check of epoch 0" in msgs[0]
    assert "left get_data_iter() early" in msgs[0] and "target_counts" not in msgs[0]


def _killed_mid_profile(rank: int, world: int, cache_dir: str) -> None:
    from dcp.models import build_model
    from dcp.profiler import profile_table
    from dcp.runtime.registry import SPGroupRegistry
    from tests.dist.test_profiler_dist import _config

    def fault(seq_group: int, micro_batch_size: int, sp_size: int) -> None:
        # rank 1 dies inside a candidate it measures together with rank 0 (they share every all-to-all, so
        # both last reported the same phase: only its stopped heartbeat tells it from the survivor)
        if rank == 1 and (seq_group, micro_batch_size, sp_size) == (0, 1, 2):
            os._exit(3)

    profile_table(build_model("t1d-tiny"), _config(cache_dir), world, SPGroupRegistry(world, 2, (1, 2)),
                  rank=rank, progress=False, fault=fault)


def test_a_rank_killed_mid_profile_is_named_with_its_phase(tmp_path):
    with pytest.raises(DistributedFailure) as info:
        run_distributed(_killed_mid_profile, 2, str(tmp_path), timeout_s=240, pg_timeout_s=120)
    text = str(info.value)
    assert "rank 1 exited with code 3 without reporting" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("dcp.runtime.phases.CollectiveError: rank 0: profiling seq_group 0 (s=128) b=1 p=2 "
                           "failed after"), text[-3000:]
    assert "rank 1 is in 'profiling seq_group 0 (s=128) b=1 p=2'" in last and "heartbeat stopped" in last
    assert "it died or was stopped there" in last


def _die_or_wait(rank: int, world: int) -> None:
    if rank == 1:
        os._exit(3)  # dies without reporting
    time.sleep(600)  # not in a collective: nothing tells this rank its peer is gone (as on a store wait)


def test_a_survivor_waiting_outside_a_collective_is_stopped_after_the_grace():
    t0 = time.monotonic()
    with pytest.raises(DistributedFailure) as info:
        run_distributed(_die_or_wait, 2, timeout_s=300, dead_rank_grace_s=2.0)
    assert "rank 1 exited with code 3 without reporting" in str(info.value)
    assert time.monotonic() - t0 < 120  # the grace after the death, not the 300 s timeout (loaded-host margin)


def _followed_phases(rank: int, world: int) -> dict:
    import json
    import threading

    model, data = build("t1d")
    # two steps of three micro-batches per rank (SP 1)
    plans = [step(0, 2, group(data, 0, 1, 0, [6 * k], [6 * k + 2], [6 * k + 4]),
                  group(data, 1, 1, 0, [6 * k + 1], [6 * k + 3], [6 * k + 5]), number=k) for k in range(2)]
    def forward(m, batch, ctx):
        if batch.sample_ids == (2,):  # rank 0's second micro-batch of step 0: a phase entered inside the step
            mgr._board.enter("a collective inside the step")
        return m(batch, ctx)

    mgr = set_manager(model, data, config_for(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans, forward_fn=forward)
    board, written = mgr._board, []
    inner, mine = board.store, f"{board.prefix}{rank}"

    class Noting:  # notes this rank's phase writes made by the training thread
        def set(self, key, value):
            if key == mine and threading.current_thread() is threading.main_thread():
                written.append(json.loads(value)["phase"])
            inner.set(key, value)

        def __getattr__(self, name):
            return getattr(inner, name)

    board.store = Noting()
    seen = []
    for batch in mgr.get_data_iter():
        seen.append(board.phase)
        mgr.train_micro_batch(batch)
    return {"seen": seen, "written": written}


def test_the_board_follows_each_micro_batch_and_the_training_thread_writes_only_a_steps_first():
    for rank, res in enumerate(run_distributed(_followed_phases, 2, timeout_s=120)):
        # rank 0 entered another phase inside step 0's second micro-batch: the board follows the step again at the
        # third (written then, by the training thread)
        assert res["seen"] == [f"micro-batch {i}/3 of epoch 0 step {s}" for s in (0, 1) for i in (1, 2, 3)]
        again = ["micro-batch 3/3 of epoch 0 step 0"] if rank == 0 else []
        assert [p for p in res["written"] if p.startswith("micro-batch")] == [
            "micro-batch 1/3 of epoch 0 step 0", *again, "micro-batch 1/3 of epoch 0 step 1"]  # the rest: heartbeat's
