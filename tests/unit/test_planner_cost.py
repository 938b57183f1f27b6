"""Cost model (Eq. 4-6), DCP-intra/DCP-inter settings and the analytic table."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import ModelShapeConfig
from dcp.planner import (
    CPU_SMALL,
    HardwareSpec,
    ProfileRow,
    ProfileTable,
    TableMeta,
    analytic_table,
    best_settings,
    micro_batch_mem_bytes,
    micro_batch_time_s,
    min_recompute_layers,
    settings_by_sp,
)
from dcp.planner.analytic import (
    all_to_all_time_s,
    attention_flops_fwd,
    grad_sync_time_s,
    optimizer_step_time_s,
)


def row(**kw) -> ProfileRow:
    base = dict(
        seq_group=0,
        seq_len=1024,
        micro_batch_size=1,
        sp_size=1,
        t_f_s=1.0,
        t_b_s=2.0,
        m_act_bytes=10.0,
        m_inp_bytes=1.0,
        t_const_s=0.5,
        m_const_bytes=100.0,
        num_layers=4,
        feasible=True,
    )
    base.update(kw)
    return ProfileRow(**base)


def test_cost_model_values():
    r = row()
    assert micro_batch_time_s(r, 4) == pytest.approx(4 * 3.0 + 4 * 1.0 + 0.5)  # L(t_f+t_b) + r t_f + T_C
    assert micro_batch_time_s(r, 0) == pytest.approx(12.5)
    assert micro_batch_mem_bytes(r, 0) == pytest.approx(4 * 10 + 4 * 1 + 100)  # (L-r) m + L m_inp + M_C
    assert micro_batch_mem_bytes(r, 4) == pytest.approx(104)
    assert micro_batch_mem_bytes(r, 1) == pytest.approx(134)


def test_min_recompute_layers():
    r = row()
    assert min_recompute_layers(r, 144) == 0
    assert min_recompute_layers(r, 143.9) == 1
    assert min_recompute_layers(r, 134) == 1
    assert min_recompute_layers(r, 104) == 4
    assert min_recompute_layers(r, 103.9) is None
    assert min_recompute_layers(row(feasible=False), 1e12) is None
    assert min_recompute_layers(row(m_act_bytes=0.0), 104) == 0


@settings(max_examples=200, deadline=None)
@given(
    m=st.floats(0.01, 1e9),
    inp=st.floats(0, 1e9),
    c=st.floats(0, 1e10),
    cap=st.floats(1, 1e11),
    L=st.integers(1, 64),
)
def test_min_recompute_is_minimal(m, inp, c, cap, L):
    r = row(m_act_bytes=m, m_inp_bytes=inp, m_const_bytes=c, num_layers=L)
    got = min_recompute_layers(r, cap)
    if got is None:
        assert micro_batch_mem_bytes(r, L) > cap
    else:
        assert micro_batch_mem_bytes(r, got) <= cap
        assert got == 0 or micro_batch_mem_bytes(r, got - 1) > cap


def test_recompute_out_of_range():
    with pytest.raises(ValueError, match=r"recompute_layers \(5\) is outside 0..L \(L = 4\)"):
        micro_batch_time_s(row(), 5)
    with pytest.raises(ValueError, match=r"recompute_layers \(-1\)"):
        micro_batch_mem_bytes(row(), -1)


def _table(rows, edges=(1024, 2048)):
    return ProfileTable(
        rows, TableMeta(model="m", hardware="h", dtype="float32", world_size=8, seq_group_edges=edges)
    )


def test_intra_picks_minimal_recompute_and_inter_full():
    rows = [
        row(
            micro_batch_size=b,
            sp_size=p,
            t_f_s=b / p,
            t_b_s=2 * b / p,
            m_act_bytes=10.0 * b / p,
            m_inp_bytes=1.0 * b / p,
        )
        for b in (1, 2)
        for p in (1, 2)
    ]
    t = _table(rows)
    kw = dict(mem_capacity_bytes=130, sp_sizes=(1, 2), world_size=8, ranks_per_node=8)
    intra = best_settings(t, dynamic_recompute=True, **kw)[0]
    inter = best_settings(t, dynamic_recompute=False, **kw)[0]
    assert inter.recompute_layers == 4
    src = next(r for r in rows if (r.micro_batch_size, r.sp_size) == (intra.micro_batch_size, intra.sp_size))
    assert intra.recompute_layers == min_recompute_layers(src, 130)
    assert intra.tokens_per_gpu_s >= inter.tokens_per_gpu_s
    assert intra.mem_bytes <= 130 and inter.mem_bytes <= 130
    by = settings_by_sp(t, dynamic_recompute=True, **kw)[0]
    assert list(by) == [1, 2] and all(s.sp_size == p for p, s in by.items())
    assert max(by.values(), key=lambda s: s.tokens_per_gpu_s).tokens_per_gpu_s == intra.tokens_per_gpu_s
    # sp sizes above world_size or outside sp_sizes are never chosen.
    assert set(settings_by_sp(t, dynamic_recompute=True, **{**kw, "world_size": 1})[0]) == {1}
    assert set(settings_by_sp(t, dynamic_recompute=True, **{**kw, "sp_sizes": (2,)})[0]) == {2}
    # Nothing fits: the seq_group is absent.
    assert best_settings(t, dynamic_recompute=True, **{**kw, "mem_capacity_bytes": 50}) == {}


def test_setting_errors():
    t = _table([row(t_f_s=0.0, t_b_s=0.0, t_const_s=0.0)])
    with pytest.raises(ValueError, match="non-positive time"):
        best_settings(
            t, mem_capacity_bytes=1e9, sp_sizes=(1,), world_size=1, ranks_per_node=1, dynamic_recompute=True
        )
    with pytest.raises(ValueError, match=r"world_size \(0\)"):
        best_settings(
            t, mem_capacity_bytes=1e9, sp_sizes=(1,), world_size=0, ranks_per_node=1, dynamic_recompute=True
        )
    with pytest.raises(ValueError, match=r"ranks_per_node \(0\)"):
        settings_by_sp(
            t, mem_capacity_bytes=1e9, sp_sizes=(1,), world_size=1, ranks_per_node=0, dynamic_recompute=True
        )


MODEL = ModelShapeConfig(name="m", num_layers=4, hidden_size=256, num_heads=8, vocab_size=1000)


@settings(max_examples=30, deadline=None)
@given(cap_mib=st.floats(5, 2000), world=st.sampled_from([1, 2, 6, 8, 16]))
def test_intra_beats_or_equals_inter_on_analytic_tables(cap_mib, world):
    t = analytic_table(
        MODEL,
        (256, 1024, 4096),
        sp_sizes=(1, 2, 4, 8),
        max_micro_batch_size=8,
        world_size=world,
        hardware=CPU_SMALL,
        mem_capacity_bytes=cap_mib * 2**20,
    )
    kw = dict(mem_capacity_bytes=cap_mib * 2**20, sp_sizes=(1, 2, 4, 8), world_size=world, ranks_per_node=8)
    intra = best_settings(t, dynamic_recompute=True, **kw)
    inter = best_settings(t, dynamic_recompute=False, **kw)
    assert set(intra) == set(inter)
    for g in inter:
        assert intra[g].tokens_per_gpu_s >= inter[g].tokens_per_gpu_s * (1 - 1e-12)
        assert intra[g].recompute_layers <= inter[g].recompute_layers == MODEL.num_layers


def test_analytic_table_shapes_and_monotonicity():
    t = analytic_table(
        MODEL, (512, 2048), sp_sizes=(1, 2, 4), max_micro_batch_size=8, world_size=4, hardware=CPU_SMALL
    )
    assert len(t) == 2 * 3 * 4 and t.meta.source == "analytic" and t.meta.dtype == "float32"
    for g in (0, 1):
        for p in (1, 2, 4):
            rs = [r for r in t.rows_for(g) if r.sp_size == p]
            assert [r.micro_batch_size for r in rs] == [1, 2, 4, 8]
            assert all(
                a.t_f_s < b.t_f_s and a.m_act_bytes < b.m_act_bytes for a, b in zip(rs, rs[1:], strict=False)
            )
    r1 = next(r for r in t.rows_for(1) if (r.sp_size, r.micro_batch_size) == (1, 1))
    r4 = next(r for r in t.rows_for(1) if (r.sp_size, r.micro_batch_size) == (4, 1))
    assert r4.m_act_bytes == pytest.approx(r1.m_act_bytes / 4) and r4.m_inp_bytes == pytest.approx(
        r1.m_inp_bytes / 4
    )
    assert r1.m_inp_bytes == 2048 * 256 * 4  # b*s/p*h*dtype
    # Causal 1D attention is quadratic: doubling s quadruples attention FLOPs.
    assert attention_flops_fwd(MODEL, 2048, 1, 1) == pytest.approx(4 * attention_flops_fwd(MODEL, 1024, 1, 1))
    assert attention_flops_fwd(MODEL, 1024, 1, 4) == pytest.approx(attention_flops_fwd(MODEL, 1024, 1, 1) / 4)


@pytest.mark.parametrize(("vocab", "attention"), [(256, "1d"), (32000, "1d"), (64, "2d")])
def test_analytic_m_const_holds_one_layer_working_set(vocab, attention):
    # As the profiler measures it: M_C = state + all-to-all buffers + max(head working set, one layer's m),
    # so Eq. 6 at r = L leaves room for the one layer that backward re-materialises at a time.
    model = dataclasses.replace(MODEL, vocab_size=vocab)
    t = analytic_table(
        model, (1024, 8192), sp_sizes=(1, 2), max_micro_batch_size=4, world_size=2, hardware=CPU_SMALL,
        attention=attention,
    )
    h, d = model.hidden_size, 4
    for r in t.rows:
        n = r.micro_batch_size * r.seq_len / r.sp_size
        base = model.constant_mem_bytes("deepspeed", dp_size=2) + 2 * n * h * d
        assert r.m_const_bytes == pytest.approx(base + max(2 * n * vocab * d, r.m_act_bytes))
        assert r.m_const_bytes >= base + r.m_act_bytes
        assert micro_batch_mem_bytes(r, r.num_layers) >= r.num_layers * r.m_inp_bytes + r.m_act_bytes + base


def test_analytic_memory_cap_marks_infeasible_and_stops():
    cap = 40 * 2**20
    t = analytic_table(
        MODEL,
        (512, 8192),
        sp_sizes=(1, 2),
        max_micro_batch_size=16,
        world_size=2,
        hardware=CPU_SMALL,
        mem_capacity_bytes=cap,
    )
    for g in (0, 1):
        for p in (1, 2):
            rs = [r for r in t.rows_for(g) if r.sp_size == p]
            assert all(r.feasible for r in rs[:-1])
            if not rs[-1].feasible:
                assert micro_batch_mem_bytes(rs[-1], 4) > cap
            assert all(micro_batch_mem_bytes(r, 4) <= cap for r in rs if r.feasible)
    assert any(not r.feasible for r in t.rows)


def test_analytic_2d_and_communication():
    t1 = analytic_table(
        MODEL, (4096,), sp_sizes=(1,), max_micro_batch_size=1, world_size=1, hardware=CPU_SMALL
    )
    t2 = analytic_table(
        MODEL,
        (4096,),
        sp_sizes=(1,),
        max_micro_batch_size=1,
        world_size=1,
        hardware=CPU_SMALL,
        attention="2d",
        frames_per_sample=16,
    )
    # Spatial (256 tokens) + temporal (16 frames) attention is far cheaper than 4096^2 causal attention.
    assert attention_flops_fwd(MODEL, 4096, 1, 1, attention="2d", frames=16) < attention_flops_fwd(
        MODEL, 4096, 1, 1
    )
    assert t2.rows[0].m_act_bytes > t1.rows[0].m_act_bytes  # two attentions keep more activations
    hw = dataclasses.replace(
        CPU_SMALL, ranks_per_node=2, intra_node_bw_bytes_per_s=1e10, inter_node_bw_bytes_per_s=1e9
    )
    assert all_to_all_time_s(1e6, 1, hw) == 0.0
    intra, inter = all_to_all_time_s(1e6, 2, hw), all_to_all_time_s(1e6, 4, hw)
    assert intra == pytest.approx(hw.collective_latency_s + 1e6 * 0.5 / 1e10)
    assert inter == pytest.approx(hw.collective_latency_s + 1e6 * 0.75 / 1e9)
    assert grad_sync_time_s(MODEL, hw, 1) == 0.0 < grad_sync_time_s(MODEL, hw, 4)
    assert optimizer_step_time_s(MODEL, hw, 8) == pytest.approx(optimizer_step_time_s(MODEL, hw, 1) / 8)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seq_group_edges": (10, 5)}, "strictly increasing"),
        ({"max_micro_batch_size": 0}, r"max_micro_batch_size \(0\)"),
        ({"world_size": 0}, r"world_size \(0\)"),
        ({"dtype_bytes": 3}, r"dtype_bytes \(3\)"),
        ({"sp_sizes": (3,)}, "do not divide model.num_heads"),
        ({"attention": "3d"}, "attention \\('3d'\\)"),
        ({"frames_per_sample": [1, 2, 3]}, "one value or one per seq_group"),
    ],
)
def test_analytic_errors(kwargs, needle):
    kw = dict(seq_group_edges=(512,), sp_sizes=(1,), max_micro_batch_size=2, world_size=2, hardware=CPU_SMALL)
    kw.update(kwargs)
    edges = kw.pop("seq_group_edges")
    with pytest.raises(ValueError, match=needle):
        analytic_table(MODEL, edges, **kw)


def test_hardware_spec_validation():
    with pytest.raises(ValueError, match=r"HardwareSpec.matmul_flops_per_s \(0\) must be > 0"):
        dataclasses.replace(CPU_SMALL, matmul_flops_per_s=0)
    with pytest.raises(ValueError, match=r"HardwareSpec.kernel_overhead_s \(-1\)"):
        dataclasses.replace(CPU_SMALL, kernel_overhead_s=-1)
    with pytest.raises(ValueError, match=r"ranks_per_node \(0\)"):
        dataclasses.replace(CPU_SMALL, ranks_per_node=0)
    assert isinstance(CPU_SMALL, HardwareSpec)


def _length_table(rows, edges):
    from dcp.planner import ProfileTable, TableMeta

    return ProfileTable(rows, TableMeta(model="m", hardware="h", dtype="float32", world_size=1, seq_group_edges=edges))


def _timed_row(g, s, b, t, p=1):
    """A row whose micro-batch time at any r is t (all of it in T_C)."""
    from dcp.planner import ProfileRow

    return ProfileRow(g, s, b, p, 0.0, 0.0, 1.0, 1.0, t, 1.0, 2)


def test_micro_batches_are_timed_from_their_real_lengths():
    import numpy as np

    from dcp.planner.stream import MicroBatchQueues, TimeLookup, micro_batch_times

    # rows at bounds 100, 200 from T = 0.05 + 1e-3 * sum(n) + 2e-5 * sum(n^2), b in 1, 2, 4
    a, b1, b2 = 0.05, 1e-3, 2e-5

    def true(lens):
        return a + b1 * sum(lens) + b2 * sum(n * n for n in lens)

    rows = [_timed_row(g, e, b, true([e] * b)) for g, e in enumerate((100, 200)) for b in (1, 2, 4)]
    times = TimeLookup(_length_table(rows, (100, 200)))
    assert times.length_model(1, 1, 0) == pytest.approx((a, b1, b2))
    lengths = np.array([40, 150, 60, 120, 200, 190, 101])
    groups = np.array([0, 1, 0, 1, 1, 1, 1])
    mbq = MicroBatchQueues(lengths, groups, np.arange(len(lengths)), {0: 2, 1: 4})
    got = micro_batch_times(mbq, times, {0: (1, 0), 1: (1, 2)})
    for k in range(mbq.num):
        lens = mbq.micro_batch(k, 0.0).seq_lens
        assert got[k] == pytest.approx(true(lens)), lens
    # not b samples of the longest: [150, 120, 200, 190] costs less than 4 x 200
    full = next(k for k in range(mbq.num) if mbq.count[k] == 4)
    assert got[full] < times.time_s(1, 1, 0, 4) and got[full] < float(times.padded_times_s(1, 1, 0, 4, [200])[0])
    assert times.lengths_time_s(1, 1, 0, [200, 200]) == pytest.approx(times.time_s(1, 1, 0, 2))


def test_pack_is_priced_as_one_sequence_of_documents():
    from dcp.planner.stream import PlanningError, TimeLookup

    a, b1, b2 = 0.05, 1e-3, 2e-5
    rows = [_timed_row(g, e, b, a + b * (b1 * e + b2 * e * e)) for g, e in enumerate((100, 200)) for b in (1, 2)]
    times = TimeLookup(_length_table(rows, (100, 200)))
    # documents from both seq_groups, overhead paid once: a + b1 * sum + b2 * sum of squares
    assert times.pack_time_s(1, 0, [150, 30, 80]) == pytest.approx(a + b1 * 260 + b2 * (150**2 + 30**2 + 80**2))
    with pytest.raises(PlanningError, match=r"longest document has 201 tokens"):
        times.pack_time_s(1, 0, [201, 3])


def test_length_model_is_anchored_at_the_row_and_never_negative():
    import numpy as np

    from dcp.planner.stream import TimeLookup

    # noisy rows that a free least-squares fit would give a negative quadratic term
    rows = [_timed_row(0, 100, 1, 1.0), _timed_row(0, 100, 2, 1.9), _timed_row(1, 200, 1, 1.8),
            _timed_row(1, 200, 2, 3.3)]
    times = TimeLookup(_length_table(rows, (100, 200)))
    coef = times.length_model(1, 1, 0)
    assert min(coef) >= 0
    # a micro-batch at the bound costs exactly its row; shorter ones less, monotone in length
    assert times.lengths_time_s(1, 1, 0, [200, 200]) == pytest.approx(3.3)
    t = [times.lengths_time_s(1, 1, 0, [n, n]) for n in (110, 150, 190)]
    assert t == sorted(t) and t[-1] < 3.3
    # one row only: nothing to fit a shape to but a constant, so the bound's time is kept
    single = TimeLookup(_length_table([_timed_row(0, 100, 2, 1.3)], (100,)))
    assert single.lengths_times_s(0, 1, 0, 2, np.array([60.0]), np.array([1800.0]))[0] == pytest.approx(1.3)
    with pytest.raises(ValueError, match=r"no profile row for seq_group 0, sp_size 2"):
        single.length_model(0, 2, 0)


def test_step_plan_rejects_groups_that_overlap_leave_the_world_or_miss_a_rank():
    from dcp.planner.plan import GroupPlan, StepPlan

    def plan(*groups):
        return StepPlan(0, 0, 4, "dcp-inter", tuple(GroupPlan(f, p, 0, ()) for f, p in groups))

    assert plan((0, 2), (2, 1), (3, 1)).group_of(3).first_rank == 3
    with pytest.raises(ValueError, match=r"overlap or leave the world: rank 1 of group 1"):
        plan((0, 2), (1, 2), (3, 1))
    with pytest.raises(ValueError, match=r"overlap or leave the world: rank 4 of group 1 \(world_size 4\)"):
        plan((0, 2), (3, 2))
    with pytest.raises(ValueError, match=r"overlap or leave the world: rank -1 of group 0"):
        plan((-1, 2), (1, 1), (2, 2))
    with pytest.raises(ValueError, match=r"leaves rank 2 without a group: cover all ranks"):
        plan((0, 2), (3, 1))
