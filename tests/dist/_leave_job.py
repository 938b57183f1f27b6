"""A job that leaves ``get_data_iter()`` early (``break``, an exception, ``return``, Ctrl-C) after two micro-batches,
through the real planner and its plan-ahead thread; used by test_leave_loop.py, as a plain process (W = 1) and
under torchrun (``python -m torch.distributed.run --nproc_per_node W tests/dist/_leave_job.py MODE PREFETCH``).
It prints ``left the loop`` just before leaving, so the test measures the exit from there."""

from __future__ import annotations

import dataclasses
import os
import sys

import torch


def train(mode: str, prefetch: str) -> None:
    from dcp.api import set_manager
    from dcp.planner import CPU_SMALL, analytic_table
    from tests.dist._runtime_cases import planner_setup

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    model, data, config, _ = planner_setup(world)
    # memory for every sample at SP 1 too (W = 1), still several steps of several micro-batches
    config = config.replace(advanced=dataclasses.replace(config.advanced, prefetch=prefetch),
                           planning=dataclasses.replace(config.planning, mem_capacity_gib=0.05))
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=(1, 2), max_micro_batch_size=4,
                           world_size=world, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    mgr = set_manager(model, data, config, table=table, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    engine, seen = mgr.engine, 0
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, engine)
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        seen += 1
        if seen == 2:
            print("left the loop", flush=True)
            if mode == "raise":
                raise RuntimeError("an error of the user's loop")
            if mode == "interrupt":
                raise KeyboardInterrupt
            if mode == "return":
                return
            break
    print("after the loop", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    train(sys.argv[1], sys.argv[2])
