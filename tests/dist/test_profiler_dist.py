"""Parallel dual-layer profiling on W = 2 gloo processes: groups of p ranks profile different candidates,
every rank ends with the identical table, an out-of-memory on one rank of a group is agreed on, p grows
when b = 1 does not fit, the cache is written once and hit afterwards, and the table plans an epoch."""

from __future__ import annotations

import pytest
import torch

from dcp.distributed.launch import run_distributed
from dcp.planner import ProfileTable, plan_epoch

pytestmark = pytest.mark.dist

EDGES = (128, 256, 512)


def _config(cache_dir: str):
    from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig
    from dcp.models import build_config

    return DCPConfig(
        model=build_config("t1d-tiny").shape(),
        profiling=ProfilingConfig(seq_group_edges=EDGES, max_micro_batch_size=4, cache_dir=cache_dir),
        advanced=AdvancedConfig(warmup_iters=0, measure_iters=1),
        # ~7.5 MiB per rank: 512 tokens do not fit on one rank (state alone is ~4.5 MiB), they do on two
        planning=PlanningConfig(mem_capacity_gib=0.007, sp_sizes=(1, 2), ranks_per_node=2),
    )


def _fault(seq_group: int, micro_batch_size: int, sp_size: int) -> None:
    # only rank 1 "runs out of memory": rank 0 must learn it from the group's agreement, not hang
    if torch.distributed.get_rank() == 1 and (seq_group, micro_batch_size, sp_size) == (0, 2, 2):
        raise torch.OutOfMemoryError("injected out-of-memory on rank 1")


def _profile(rank: int, world_size: int, cache_dir: str) -> tuple[str, str, str]:
    from dcp.models import build_model
    from dcp.profiler import load_or_profile
    from dcp.runtime.registry import SPGroupRegistry

    model = build_model("t1d-tiny")
    config = _config(cache_dir)
    registry = SPGroupRegistry(world_size, 2, (1, 2))
    table, status = load_or_profile(model, config, world_size, registry, progress=False, fault=_fault)
    again, status2 = load_or_profile(model, config, world_size, registry, progress=False)
    assert again.rows == table.rows
    return table.to_csv(), status, status2


def test_parallel_profiling_gives_every_rank_the_same_table(tmp_path):
    results = run_distributed(_profile, 2, str(tmp_path), timeout_s=150.0)
    (csv0, st0, hit0), (csv1, st1, hit1) = results
    assert csv0 == csv1  # identical tables (rows and metadata) on every rank
    assert (st0, st1, hit0, hit1) == ("profiled", "profiled", "hit", "hit")
    assert len(list(tmp_path.glob("*.csv"))) == 1  # rank 0 wrote once, atomically
    table = ProfileTable.from_csv(csv0, text=True)
    by = {(r.seq_len, r.micro_batch_size, r.sp_size): r for r in table.rows}
    # the injected OOM (rank 1 only) marks the candidate on both ranks; profiling went on
    assert not by[(128, 2, 2)].feasible
    assert by[(256, 1, 2)].feasible and by[(512, 1, 2)].feasible
    # 512 tokens do not fit on one rank at b = 1: p grew to 2
    assert not by[(512, 1, 1)].feasible
    # the once-per-step costs were measured on the same two ranks (identical metadata on both, as above)
    assert table.meta.extra["grad_sync_s"] > 0 and table.meta.extra["optimizer_step_s"] > 0
    fit = [r for r in table.rows if r.feasible]
    assert all(r.t_f_s > 0 and r.t_b_s > 0 and r.t_const_s > 0 and r.m_act_bytes > 0 for r in fit)
    # memory per rank shrinks with p (each rank holds s / p tokens) and grows with s
    for (s, b, p), r in by.items():
        if p == 2 and (s, b, 1) in by and by[(s, b, 1)].feasible and r.feasible:
            assert r.m_act_bytes < by[(s, b, 1)].m_act_bytes and r.m_inp_bytes * 2 == by[(s, b, 1)].m_inp_bytes
    assert by[(512, 1, 2)].m_act_bytes > by[(256, 1, 2)].m_act_bytes
    # and it plans an epoch end to end
    config = _config(str(tmp_path))
    lengths = [int(x) for x in torch.randint(16, 513, (40,), generator=torch.Generator().manual_seed(0))]
    plans = plan_epoch(lengths, table, config, 2)
    assert sorted(i for p in plans for i in p.sample_ids) == list(range(40))
    assert any(g.sp_size == 2 for p in plans for g in p.groups)  # long samples need both ranks


def _oom_in_a_timed_region(rank: int, world_size: int) -> tuple[bool, int]:
    import torch.distributed as dist

    from dcp.models import build_model
    from dcp.profiler.adapters import get_adapter
    from dcp.profiler.measure import MeasureSettings, measure_candidate
    from dcp.profiler.memory import EmulatedOutOfMemory
    from dcp.runtime.context import SPContext

    group = dist.new_group([0, 1])
    ctx = SPContext(group=group, sp_size=2, sp_rank=rank, recompute_layers=0)
    adapter = get_adapter(build_model("t1d-tiny"))
    real, calls = adapter.run_layer, [0]

    def run_layer(i, hidden, aux, c):
        out = real(i, hidden, aux, c)  # the layer's all-to-alls complete on both ranks first
        if i == 1:
            calls[0] += 1
            # the memory pass (call 1) fits; rank 1 runs out of memory in the first timed forward (call 2)
            if rank == 1 and calls[0] == 2:
                raise EmulatedOutOfMemory("injected out-of-memory in a timed region on rank 1")
        return out

    adapter.run_layer = run_layer
    settings = MeasureSettings(warmup_iters=0, measure_iters=2, clock="wall")
    m = measure_candidate(adapter, ctx, 1, 64, settings)
    again = measure_candidate(adapter, ctx, 1, 64, settings)  # the group is in step afterwards
    return m is None, int(again is not None)


def test_an_out_of_memory_error_in_a_timed_region_on_one_rank_is_agreed_on():
    # without the region's agreement rank 0 would go on to the next region's barrier while rank 1 waits in
    # the out-of-memory agreement: a mismatched collective, a hang until the timeout
    results = run_distributed(_oom_in_a_timed_region, 2, timeout_s=120.0, pg_timeout_s=30.0)
    assert results == [(True, 1), (True, 1)]
