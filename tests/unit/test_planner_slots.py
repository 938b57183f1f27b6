"""ZeRO-3 slot dealing: each SP size's micro-batches over its groups, counts within one, k-th micro-batches alike."""

from __future__ import annotations

from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.slots import deal_slots
from dcp.sim.cluster import zero3_step_s


def _mb(i: int, t: float, r: int = -1) -> MicroBatch:
    return MicroBatch((i,), (100,), 0, t, r)


def _slots(plan: StepPlan) -> list[list[float]]:
    return [[mb.time_s for mb in g.micro_batches] for g in plan.groups]


def test_dealing_keeps_every_micro_batch_and_evens_the_slots():
    plan = StepPlan(0, 0, 6, "dcp-intra", (
        GroupPlan(0, 1, 2, (_mb(0, 4.0), _mb(1, 1.0), _mb(2, 1.0), _mb(3, 1.0), _mb(4, 1.0, r=0))),
        GroupPlan(1, 1, 0, (_mb(5, 4.0), _mb(6, 4.0))),
        GroupPlan(2, 2, 1, (_mb(7, 3.0),)),
        GroupPlan(4, 2, 1, (_mb(8, 1.0), _mb(9, 1.0), _mb(10, 1.0))),
    ))
    dealt = deal_slots(plan)
    before = sorted((mb.sample_ids, plan.groups[gi].sp_size, plan.groups[gi].recompute_of(mb))
                    for gi in range(4) for mb in plan.groups[gi].micro_batches)
    after = sorted((mb.sample_ids, dealt.groups[gi].sp_size, dealt.groups[gi].recompute_of(mb))
                   for gi in range(4) for mb in dealt.groups[gi].micro_batches)
    assert before == after  # the same micro-batches, each at its p and its r
    assert [g.first_rank for g in dealt.groups] == [0, 1, 2, 4] and sorted(dealt.sample_id_array) == list(range(11))
    for p in (1, 2):  # counts within one among the groups of one SP size
        counts = [g.ga_steps for g in dealt.groups if g.sp_size == p]
        assert max(counts) - min(counts) <= 1
    # the longest ones share the first slot; lockstep time falls (4 + 4 + 1 + 1 + 1 -> 4 + 4 + 1 + 1)
    assert zero3_step_s(_slots(dealt), 0.0, 1)[0] < zero3_step_s(_slots(plan), 0.0, 1)[0]
    assert zero3_step_s(_slots(dealt), 0.0, 1)[0] == 4.0 + 4.0 + 1.0 + 1.0
