"""A rank that stalls, dies, leaves the loop early or holds other data is named, in seconds (issue 14)."""

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
from tests.dist._runtime_cases import planner_setup
from tests.dist._stall_job import STALL_S, TIMEOUT_S, stall_job

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


def _failed_after(text: str) -> float:
    m = re.search(r"gradient sync of epoch 0 step 1 failed after ([0-9.]+) s \(timeout 3 s\)", text)
    assert m, text
    return float(m.group(1))


def test_a_stalled_rank_is_named_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(DistributedFailure) as info:
        run_distributed(stall_job, 2, "sleep", timeout_s=STALL_S)
    text = str(info.value)
    assert time.monotonic() - t0 < STALL_S / 3  # it did not wait for the stalled rank
    assert "CollectiveError" in text and "rank 0: gradient sync of epoch 0 step 1" in text
    assert "rank 1 is in 'micro-batch 1/1 of epoch 0 step 1'" in text and "stalled or died" in text
    assert _failed_after(text) < TIMEOUT_S + 5.0


def test_a_dead_rank_is_named():
    with pytest.raises(DistributedFailure) as info:
        run_distributed(stall_job, 2, "exit", timeout_s=120)
    text = str(info.value)
    assert "rank 1 is in 'micro-batch 1/1 of epoch 0 step 1'" in text
    assert "rank 1 exited with code 3 without reporting" in text
    assert _failed_after(text) < TIMEOUT_S + 5.0


def test_a_stalled_rank_is_named_under_torchrun():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(ROOT / "tests/dist/_stall_job.py"), "sleep"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=STALL_S / 2)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and time.monotonic() - t0 < STALL_S / 3, text[-3000:]
    assert "rank 1 is in 'micro-batch 1/1 of epoch 0 step 1'" in text, text[-3000:]
    assert _failed_after(text) < TIMEOUT_S + 5.0


def _data_differ(rank: int, world: int) -> dict[str, str]:
    out = {}
    for weighting in ("tokens", "samples"):
        model, data, config, table = planner_setup(world)
        if rank == 1:  # same sample count, one length one token longer (in the same seq_group)
            lengths = data.lengths()
            lengths[lengths.index(309)] = 310
            data = type(data)(lengths, vocab_size=model.config.vocab_size, seed=3)
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
    config = config.replace(runtime=dataclasses.replace(config.runtime, plan_check_timeout_s=TIMEOUT_S,
                                                        collective_timeout_s=TIMEOUT_S, log_every=1))
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
