"""SPGroupRegistry on real gloo processes: every rank builds the same blocks in the same order, the
groups hold the right ranks and work, and ``.context()`` picks the group of the rank's GroupPlan."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist


def _registry_w6(rank: int, world_size: int) -> dict:
    from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
    from dcp.runtime.registry import SPGroupRegistry, UnknownSPGroupError

    reg = SPGroupRegistry(world_size, 4, [1, 2, 4, 8])
    sums = {}
    for first, p in reg.blocks:
        group = reg.get(first, p)
        if not first <= rank < first + p:
            continue
        assert dist.get_process_group_ranks(group) == list(range(first, first + p))
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)  # proves the group is usable, not just listed
        sums[(first, p)] = t.item()
    # a step with mixed SP sizes over the partial second node: [0..3] p=4, [4,5] p=2
    mb = MicroBatch(sample_ids=(0,), seq_lens=(9,), seq_group=0)
    plan = StepPlan(epoch=0, step=0, world_size=6, method="dcp-inter", groups=(
        GroupPlan(first_rank=0, sp_size=4, recompute_layers=1, micro_batches=(mb,)),
        GroupPlan(first_rank=4, sp_size=2, recompute_layers=0, micro_batches=(mb,)),
    ))
    ctx = reg.context_for_step(plan, rank, attention="sdpa")
    ctx_ranks = dist.get_process_group_ranks(ctx.group)
    # sp_size 1 gets a real one-rank group: group=None would mean the whole world to torch.distributed
    solo = reg.get(rank, 1)
    assert solo is not None and dist.get_process_group_ranks(solo) == [rank]
    try:
        reg.get(2, 4)  # (2, 4) crosses nothing but is not a block start: never created
    except UnknownSPGroupError as exc:
        unknown = str(exc)
    return dict(blocks=reg.blocks, sums=sums, ctx=(ctx.sp_size, ctx.sp_rank, ctx.recompute_layers, ctx_ranks),
                unknown=unknown)


def test_registry_w6_with_4_ranks_per_node():
    out = run_distributed(_registry_w6, 6)
    expected_blocks = [(r, 1) for r in range(6)] + [(0, 2), (2, 2), (4, 2), (0, 4)]
    assert all(o["blocks"] == expected_blocks for o in out)
    for rank, o in enumerate(out):
        pair = rank // 2 * 2
        want = {(rank, 1): float(rank), (pair, 2): float(2 * pair + 1)}
        if rank < 4:
            want[(0, 4)] = 6.0
        assert o["sums"] == want
        first, p = (0, 4) if rank < 4 else (4, 2)
        assert o["ctx"] == (p, rank - first, 1 if p == 4 else 0, list(range(first, first + p)))
        assert "first_rank=2, sp_size=4" in o["unknown"] and "valid first ranks for sp_size 4: [0]" in o["unknown"]


def _registry_fallback_w4(rank: int, world_size: int) -> dict:
    from dcp.runtime.registry import SPGroupRegistry

    # size 3 on 4 ranks per node: rank 3 has no size-3 block, so the size-4 block's members hold different
    # numbers of earlier groups; the registry then creates every block on every rank (torch's global order)
    reg = SPGroupRegistry(world_size, 4, [1, 3, 4])
    sums = {}
    for first, p in reg.blocks:
        if first <= rank < first + p:
            t = torch.tensor([1.0])
            dist.all_reduce(t, group=reg.get(first, p))
            sums[p] = t.item()
    return dict(local=reg.local, sums=sums)


def test_registry_falls_back_to_world_order_when_members_differ():
    out = run_distributed(_registry_fallback_w4, 4)
    assert [o["local"] for o in out] == [False] * 4
    assert [o["sums"] for o in out] == [{1: 1.0, 3: 3.0, 4: 4.0}] * 3 + [{1: 1.0, 4: 4.0}]
