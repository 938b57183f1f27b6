"""The strongest other schedulers, re-implemented from their papers as baselines on dcp's own cost model.

- ``megatron-dyncp``: Megatron-Core's dynamic context parallelism (``megatron_dyncp``).
- ``flexsp``: FlexSP's heterogeneous sequence-parallel groups per phase (``flexsp``; its MILP in ``milp``).

Both hold a fixed token budget per optimizer step (the global batch), cut from the epoch's shuffled stream in
order, use the same profile table and memory capacity as DCP, and return StepPlans; a step may run in several
phases (StepPlans sharing the step index, see ``common``). They are for the simulator (``dcp simulate``,
``dcp bench peers``): the runtime does not run them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcp.config import PEER_METHODS, DCPConfig
from dcp.planner.peers.common import PeerCost, check_fits
from dcp.planner.plan import StepPlan
from dcp.planner.step_tokens import batch_tokens
from dcp.planner.stream import PlanningError, check_shapes, seq_groups_of, shuffled_order


def bucket_tokens_per_step(lengths: Sequence[int], table, config: DCPConfig, world_size: int, epoch: int = 0,
                           *, shapes=None) -> float:
    """Mean tokens per step of the bucket baseline on the same data: the peers' default global batch."""
    import dataclasses

    # the bucket baseline directly (not through dcp.planner.assemble, which dispatches to the peers)
    from dcp.planner.baselines import baseline_plan
    from dcp.planner.source import epoch_input

    cfg = config.replace(planning=dataclasses.replace(config.planning, method="bucket"))
    plans = list(baseline_plan(epoch_input(lengths, table, cfg, world_size, epoch, shapes=shapes)).steps)
    return sum(p.tokens for p in plans) / max(1, len(plans))


def plan_peer_epoch(lengths: Sequence[int], table, config: DCPConfig, world_size: int, epoch: int = 0, *,
                    shapes: Sequence[Sequence[int]] | None = None, method: str | None = None) -> list[StepPlan]:
    """StepPlans of one epoch for a peer method (``config.planning.method`` unless ``method`` is given), at
    ``planning.tokens_per_step`` tokens per step, or when that is 0, the bucket baseline's mean tokens per step
    on the same data."""
    method = method or config.planning.method
    if method not in PEER_METHODS:
        raise PlanningError(f"method ({method!r}) is not a peer: use one of {list(PEER_METHODS)}")
    if world_size < 1:
        raise PlanningError(f"world_size ({world_size}) must be >= 1: pass the number of ranks")
    arr, _ = seq_groups_of(lengths, table)
    shp = check_shapes(shapes, arr)
    cfg = config.planning
    tokens_per_step = float(batch_tokens(config, arr, world_size)[0]) or bucket_tokens_per_step(
        arr, table, config, world_size, epoch, shapes=shapes)  # default_batch = "method": bucket's own mean
    order = shuffled_order(len(arr), cfg.seed, epoch)
    cost = PeerCost(table, cfg.mem_capacity_bytes, tuple(sorted(p for p in cfg.sp_sizes if p <= world_size)),
                    two_d=shp is not None)
    check_fits(cost, arr, table.num_layers, world_size)
    ids, lens = order.astype(np.int64), arr[order]
    sh = shp[order] if shp is not None else None
    if method == "megatron-dyncp":
        from dcp.planner.peers import megatron_dyncp

        plans, _ = megatron_dyncp.plan_epoch(ids, lens, sh, cost, world_size=world_size,
                                             ranks_per_node=cfg.ranks_per_node, target_tokens=tokens_per_step,
                                             epoch=epoch, bounds=cfg.step_tokens_bounds)
        return plans
    from dcp.planner.peers import flexsp

    plans, _ = flexsp.plan_epoch(ids, lens, sh, cost, world_size=world_size, ranks_per_node=cfg.ranks_per_node,
                                 target_tokens=tokens_per_step, epoch=epoch, bounds=cfg.step_tokens_bounds)
    return plans


__all__ = ["PEER_METHODS", "bucket_tokens_per_step", "plan_peer_epoch"]
