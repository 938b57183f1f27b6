"""ZeRO-3 slot dealing: each SP size's micro-batches over its groups, counts within one, k-th micro-batches alike."""

from __future__ import annotations

from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.slots import deal_slots, lockstep_s, zero3_step_s


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


def _lockstep(one_d: bool = True):
    """A Lockstep over the analytic rows of an 8B shape under fsdp2-zero3 (4 simulated H100, SP 1 and 2)."""
    from dcp.config import ModelShapeConfig
    from dcp.planner.analytic import analytic_table
    from dcp.planner.cost import row_lookup
    from dcp.planner.slots import Lockstep
    from dcp.planner.stream import TimeLookup
    from dcp.sim.hardware import H100

    model = ModelShapeConfig(num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=14336, vocab_size=128256,
                             param_bytes=2, optimizer_bytes_per_param=12)
    cap = 80 * 2**30
    table = analytic_table(model, (8192, 32768, 65536), sp_sizes=(1, 2), max_micro_batch_size=8, world_size=4,
                           hardware=H100, dtype_bytes=2, mem_capacity_bytes=cap, engine="fsdp2-zero3",
                           loss_chunk_tokens=1024)
    return Lockstep(times=TimeLookup(table), rows=row_lookup(table), mem_capacity_bytes=cap, full_recompute=False,
                    one_d=one_d, edges=table.seq_group_edges)


def _priced(lock, i: int, n: int, p: int) -> MicroBatch:
    t, r, group = lock._price([n], p, {})
    return MicroBatch((i,), (n,), group, t, r)


def test_lockstep_deals_the_samples_into_slots_alike_across_sp_sizes():
    lock = _lockstep()
    longs = [_priced(lock, i, 60_000, 1) for i in range(4)]  # p = 1: one long sample each
    shorts = [_priced(lock, 10 + i, 6_000, 2) for i in range(12)]  # p = 2: twelve short ones
    plan = StepPlan(0, 0, 4, "dcp-intra", (GroupPlan(0, 1, 0, tuple(longs[:2])), GroupPlan(1, 1, 0, tuple(longs[2:])),
                                           GroupPlan(2, 2, 0, tuple(shorts))))
    out = lock(plan)
    assert sorted(out.sample_id_array) == sorted(plan.sample_id_array)  # every sample once
    assert [(g.first_rank, g.sp_size) for g in out.groups] == [(0, 1), (1, 1), (2, 2)]
    before = lockstep_s([g.micro_batches for g in plan.groups])
    assert lockstep_s([g.micro_batches for g in out.groups]) < 0.9 * before  # twelve short slots no longer
    for g in out.groups:  # each micro-batch fits memory at its own r, priced as _price prices it
        for mb in g.micro_batches:
            assert (mb.time_s, mb.recompute_layers, mb.seq_group) == lock._price(list(mb.seq_lens), g.sp_size, {})
        assert g.recompute_layers == max(mb.recompute_layers for mb in g.micro_batches)
        assert [mb.time_s for mb in g.micro_batches] == sorted((mb.time_s for mb in g.micro_batches), reverse=True)
    # 2D micro-batches hold one shape each: dealt, never re-packed
    assert [g.ga_steps for g in _lockstep(one_d=False)(plan).groups] == [2, 2, 12]


def test_lockstep_prices_only_what_memory_holds():
    lock = _lockstep()
    assert lock._price([60_000, 60_000], 1, {}) is None  # 120k tokens at p = 1 do not fit 80 GiB
    t, r, group = lock._price([6_000, 30_000], 2, {})
    assert group == 1 and 0 <= r <= 32 and t > lock._price([30_000], 2, {})[0]
