"""A W = 3 job in which rank 1 is stopped (SIGSTOP) or killed (SIGKILL) at its micro-batch of step 1 while rank 0
(and, killed, rank 2) is inside a long micro-batch; used by test_peer_lost.py, under torchrun (``python -m torch.distributed.run
--nproc_per_node 3 tests/dist/_peer_lost_job.py stop``) and under ``run_distributed`` (``peer_lost_job``). The
collective timeout is far beyond every bound the test asserts: only the peer watch can end the survivors in time."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

LONG_S = 300.0
"""Rank 0's micro-batch of step 1 (and the collective timeout): far beyond the bound the test asserts."""
PEER_TIMEOUT_S = 6.0


def peer_lost_job(rank: int, world: int, mode: str) -> None:
    import dataclasses

    from dcp.api import set_manager
    from tests.dist._runtime_cases import build, config_for, group, step

    model, data = build("t1d")
    config = config_for(model)
    config = config.replace(runtime=dataclasses.replace(config.runtime, collective_timeout_s=LONG_S),
                            advanced=dataclasses.replace(config.advanced, plan_check_timeout_s=120.0,
                                                         peer_timeout_s=PEER_TIMEOUT_S))
    plans = [step(0, 3, group(data, 0, 1, 0, [3 * k]), group(data, 1, 1, 0, [3 * k + 1]),
                  group(data, 2, 1, 0, [3 * k + 2]), number=k) for k in range(3)]

    def forward(m, batch, ctx):
        if batch.sample_ids == (4,):  # rank 1's micro-batch of step 1
            print(f"rank 1 {mode}s itself", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP if mode == "stop" else signal.SIGKILL)
        if batch.sample_ids == (3,) or (mode == "kill" and batch.sample_ids == (5,)):
            # rank 0's micro-batch of step 1, a long one; killed, rank 2's too: a survivor waiting in the
            # collective could otherwise report gloo's own error first, and the launcher stops at the first report
            time.sleep(LONG_S)
        return m(batch, ctx)

    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans, forward_fn=forward)
    for batch in mgr.get_data_iter():
        mgr.train_micro_batch(batch)


if __name__ == "__main__":  # under torchrun: the environment names rank and world
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    dist.init_process_group("gloo")
    peer_lost_job(dist.get_rank(), dist.get_world_size(), sys.argv[1])
