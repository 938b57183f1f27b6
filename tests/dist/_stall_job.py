"""A W = 2 job in which rank 1 stalls (or dies) inside a micro-batch; used by test_rank_failures.py, under
``run_distributed`` (``stall_job``) and under torchrun (``python -m torch.distributed.run --nproc_per_node 2
tests/dist/_stall_job.py sleep``)."""

from __future__ import annotations

import os
import sys
import time

import torch

TIMEOUT_S = 5.0
"""runtime.collective_timeout_s of the job: the survivor's gradient sync gives up after it."""
STALL_S = 900.0
"""How long the stalled rank sleeps: far beyond any bound the tests assert, so a pass proves no rank waited
for it."""


def stall_job(rank: int, world: int, mode: str) -> None:
    import dataclasses

    from dcp.api import set_manager
    from tests.dist._runtime_cases import build, config_for, group, step

    model, data = build("t1d")
    config = config_for(model)
    # the plan check at the epoch's start waits for ranks that a loaded host started late: a generous timeout
    config = config.replace(runtime=dataclasses.replace(config.runtime, collective_timeout_s=TIMEOUT_S),
                            advanced=dataclasses.replace(config.advanced, plan_check_timeout_s=120.0))
    plans = [step(0, 2, group(data, 0, 1, 0, [2 * k]), group(data, 1, 1, 0, [2 * k + 1]), number=k) for k in range(2)]

    def forward(m, batch, ctx):
        if rank == 1 and batch.sample_ids == (3,) and mode != "exit-in-sync":  # rank 1's micro-batch of step 1
            if mode == "exit":
                os._exit(3)
            time.sleep(STALL_S)
        return m(batch, ctx)

    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans, forward_fn=forward)
    if mode == "exit-in-sync" and rank == 1:
        # rank 1 dies inside step 1's gradient sync (after the all-reduce the backward started): its last phase
        # is that sync, and its heartbeat stops
        sync, calls = mgr.engine._reduce, [0]

        def dying_sync():
            calls[0] += 1
            if calls[0] == 2:
                os._exit(3)
            sync()

        mgr.engine._reduce = dying_sync
    for batch in mgr.get_data_iter():
        mgr.train_micro_batch(batch)


if __name__ == "__main__":  # under torchrun: the environment names rank and world
    import torch.distributed as dist

    sys.path.insert(0, os.getcwd())
    dist.init_process_group("gloo")
    try:
        stall_job(dist.get_rank(), dist.get_world_size(), sys.argv[1])
    finally:
        dist.destroy_process_group()
