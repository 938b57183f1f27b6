"""Dual-layer profiling in one process: the table's columns and units, infeasible candidates, the
planner end to end, the cache round trip, and the model adapters (reference models and HF Llama)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig
from dcp.models import build_model
from dcp.planner import ProfileTable, micro_batch_mem_bytes, plan_epoch
from dcp.profiler import cli, load_or_profile, need_profile, profile_table
from dcp.profiler.adapters import AdapterError, HFLlamaAdapter, ProtocolAdapter, get_adapter
from dcp.profiler.measure import MeasureSettings, measure_candidate, solve_recompute_cost
from dcp.runtime.context import SPContext


def config_for(model, *, capacity_gib: float = 1.0, edges=(64, 128), max_b: int = 4, cache_dir: str = ".dcp_cache",
               sp_sizes=(1, 2)) -> DCPConfig:
    return DCPConfig(
        model=model.config.shape(),
        profiling=ProfilingConfig(seq_group_edges=edges, max_micro_batch_size=max_b, cache_dir=cache_dir),
        advanced=AdvancedConfig(warmup_iters=0, measure_iters=1),
        planning=PlanningConfig(mem_capacity_gib=capacity_gib, sp_sizes=sp_sizes),
    )


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # one intra-op thread: the suite runs beside other processes on a 2-core machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def t1d():
    torch.manual_seed(0)
    return build_model("t1d-tiny")


@pytest.fixture(scope="module")
def t1d_table(t1d):
    # max_b 4 with a capacity that stops the longest group at b = 2: growth in b and s is visible
    return profile_table(t1d, config_for(t1d), progress=False)


def test_columns_units_and_monotonic_memory(t1d, t1d_table):
    rows = t1d_table.rows
    assert rows and all(r.feasible and r.sp_size == 1 and r.num_layers == 4 for r in rows)
    for r in rows:
        assert 0 < r.t_f_s < 1.0 and 0 < r.t_b_s < 1.0 and 0 < r.t_const_s < 1.0  # seconds, not ms
        assert r.m_inp_bytes == r.micro_batch_size * r.seq_len * t1d.config.hidden_size * 4  # fp32 bytes
        assert r.m_act_bytes > 4 * r.m_inp_bytes  # a block keeps several tensors of its input's size
        assert r.m_const_bytes > 2 * sum(p.numel() * 4 for p in t1d.parameters())  # params + grads + more
    by = {(r.seq_len, r.micro_batch_size): r for r in rows}
    assert by[(64, 2)].m_act_bytes > by[(64, 1)].m_act_bytes  # grows with b
    assert by[(128, 1)].m_act_bytes > by[(64, 1)].m_act_bytes  # grows with s
    assert t1d_table.meta.source == "profiled" and t1d_table.meta.world_size == 1
    assert t1d_table.meta.extra["meter"] == "saved"
    # the host's load when profiling (a CPU table scales with it: dcp bench simulator prints it per run)
    load = t1d_table.meta.extra["load_avg_1m"]
    assert isinstance(load, float) and load >= 0


def test_profiled_table_drives_the_planner(t1d, t1d_table):
    config = config_for(t1d)
    lengths = [int(x) for x in torch.randint(8, 129, (64,), generator=torch.Generator().manual_seed(1))]
    for method in ("dcp-intra", "dcp-inter"):
        cfg = config.replace(planning=dataclasses.replace(config.planning, method=method))
        plans = plan_epoch(lengths, t1d_table, cfg, 1)
        assert plans and sorted(i for p in plans for i in p.sample_ids) == list(range(64))
        assert all(p.step_time_s > 0 for p in plans)


def test_tiny_capacity_marks_candidates_infeasible_and_profiling_continues(t1d, t1d_table):
    # Capacity between the 64-token and the 128-token footprints: the longer group runs out of memory
    # (emulated) while the shorter one is still profiled.
    r64 = min((r for r in t1d_table.rows if r.seq_len == 64), key=lambda r: r.micro_batch_size)
    cap = micro_batch_mem_bytes(r64, 4) + r64.m_act_bytes * 0.5
    config = config_for(t1d, capacity_gib=cap / 2**30, sp_sizes=(1,))
    table = profile_table(t1d, config, progress=False)
    by = {(r.seq_len, r.micro_batch_size): r for r in table.rows}
    assert by[(64, 1)].feasible
    assert not by[(128, 1)].feasible and by[(128, 1)].t_f_s == float("inf")  # no time for a misfit
    assert (128, 2) not in by  # nothing beyond a failed b = 1 is run


def _inject_oom(seq_group: int, micro_batch_size: int, sp_size: int) -> None:
    if (seq_group, micro_batch_size) == (0, 2):
        raise torch.OutOfMemoryError("injected out-of-memory")


def test_injected_gpu_oom_is_caught_and_marked(t1d):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    for p in t1d.parameters():
        p.grad = None
    table = profile_table(t1d, config_for(t1d, sp_sizes=(1,), max_b=2), progress=False, fault=_inject_oom)
    by = {(r.seq_len, r.micro_batch_size): r for r in table.rows}
    assert not by[(64, 2)].feasible and by[(64, 2)].m_act_bytes == float("inf")
    assert by[(128, 1)].feasible  # the next seq_group is still profiled
    # profiling inside a training run leaves no trace: RNG stream and gradients are untouched
    torch.testing.assert_close(torch.rand(3), expected)
    assert all(p.grad is None for p in t1d.parameters())


def test_load_or_profile_caches_and_reuses(t1d, tmp_path):
    config = config_for(t1d, edges=(64,), max_b=1, cache_dir=str(tmp_path))
    assert need_profile(t1d, config)
    first, status = load_or_profile(t1d, config, progress=False)
    assert status == "profiled" and len(list(tmp_path.iterdir())) == 1
    assert not need_profile(t1d, config)
    again, status = load_or_profile(t1d, config, progress=False)
    assert status == "hit" and again.rows == first.rows
    other = config.replace(planning=dataclasses.replace(config.planning, mem_capacity_gib=2.0))
    assert need_profile(t1d, other)  # another key: its own file, beside the first
    load_or_profile(t1d, other, progress=False)
    assert len(list(tmp_path.iterdir())) == 2 and not need_profile(t1d, config)


def test_transformer_2d_profiles_through_the_protocol_adapter():
    model = build_model("t2d-tiny")
    table = profile_table(model, config_for(model, edges=(64,), max_b=1), progress=False)
    (r,) = table.rows
    assert r.feasible and r.t_f_s > 0 and r.m_act_bytes > r.m_inp_bytes > 0


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_eq6_is_exact_at_full_recompute_and_conservative_below(name):
    from torch.utils.checkpoint import checkpoint

    from dcp.profiler.memory import SavedTensorMeter, state_bytes

    model = build_model(name)
    adapter, L = get_adapter(model), model.config.num_layers
    base = state_bytes(model).total_bytes
    m = measure_candidate(adapter, SPContext.single(), 2, 64, MeasureSettings(warmup_iters=0, state_bytes=base))
    batch = adapter.synthetic_batch(2, 64, generator=torch.Generator().manual_seed(0))
    for r in (L, 1, 0):
        def recompute(layer, hidden, ctx, aux, r=r):
            # reentrant checkpoint of the first r layers: the meter sees the recomputation
            return checkpoint(layer, hidden, ctx, aux, use_reentrant=True) if layer.layer_index < r else layer(hidden, ctx, aux)

        with SavedTensorMeter(exclude=list(model.parameters())) as meter:
            loss, _ = model(batch, SPContext.single(), recompute=recompute)
            loss.backward()
        del loss
        measured = meter.peak_bytes + base
        predicted = (L - r) * m.m_act_bytes + L * m.m_inp_bytes + m.m_const_bytes
        if r == L:
            assert predicted == measured
        else:  # M_C holds one recomputed layer's working set, which r = 0 does not need
            assert measured <= predicted <= measured + m.m_act_bytes


def test_backward_is_slower_than_forward(t1d):
    # plain timing on the process clock: backward does about twice the forward's matmuls
    settings = MeasureSettings(warmup_iters=1, measure_iters=3, timing="plain", clock="cpu")
    m = measure_candidate(get_adapter(t1d), SPContext.single(), 2, 256, settings)
    assert 0 < m.t_f_s < m.t_b_s


def test_measure_settings_and_solver_validate():
    with pytest.raises(ValueError, match="MeasureSettings.clock"):
        MeasureSettings(clock="sundial")
    with pytest.raises(ValueError, match="MeasureSettings.timing"):
        MeasureSettings(timing="guess")
    with pytest.raises(ValueError, match="MeasureSettings.meter"):
        MeasureSettings(meter="ruler")
    assert solve_recompute_cost(1.0, 2.0, 4.5) == (1.5, 1.5)  # 2 t_f + t_b == 4.5, t_f + t_b == 3
    assert solve_recompute_cost(1.0, 2.0, 2.5) == (1.0, 2.0)  # noise: keep the plain figures


def test_single_layer_model_is_refused():
    model = build_model("t1d-tiny", num_layers=1)
    with pytest.raises(ValueError, match="num_layers \\(1\\) must be >= 2"):
        measure_candidate(get_adapter(model), SPContext.single(), 1, 32, MeasureSettings())


def test_get_adapter_rejects_unknown_models():
    with pytest.raises(AdapterError, match="pass adapter="):
        get_adapter(torch.nn.Linear(2, 2))
    with pytest.raises(AdapterError, match="implement the profiler protocol"):
        ProtocolAdapter(torch.nn.Linear(2, 2))
    with pytest.raises(AdapterError, match="Llama-style"):
        HFLlamaAdapter(torch.nn.Linear(2, 2))


def test_hf_llama_adapter_matches_the_model_and_profiles():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    adapter = get_adapter(model)
    assert isinstance(adapter, HFLlamaAdapter) and adapter.num_layers == 2 and adapter.max_sp_size == 1
    batch = adapter.synthetic_batch(2, 32, generator=torch.Generator().manual_seed(0))
    loss_sum, count = adapter.full_loss(batch, SPContext.single())
    ref = model(input_ids=batch.inputs, labels=batch.inputs).loss  # HF shifts labels itself
    torch.testing.assert_close(loss_sum / count, ref, rtol=1e-5, atol=1e-5)
    config = DCPConfig(
        profiling=ProfilingConfig(seq_group_edges=(32,), max_micro_batch_size=1),
        advanced=AdvancedConfig(warmup_iters=0, measure_iters=1),
        planning=PlanningConfig(mem_capacity_gib=1.0, sp_sizes=(1, 2)),
    )
    table = profile_table(model, config, progress=False)
    assert [(r.sp_size, r.feasible) for r in table.rows] == [(1, True)]  # HF attention is not SP-aware


def test_cli_profiles_in_process_and_prints_a_summary(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    out = tmp_path / "table.csv"
    toml = tmp_path / "run.toml"
    toml.write_text(f'[profiling]\ncache_dir = "{tmp_path / "cache"}"\n'
                    "max_micro_batch_size = 2\n[advanced]\nwarmup_iters = 0\nmeasure_iters = 1\n")
    args = parser.parse_args(["--model", "t1d-tiny", "--config", str(toml), "--edges", "32,64",
                              "--mem-capacity-gib", "1", "--out", str(out), "--quiet"])
    assert cli.run(args) == 0
    text = capsys.readouterr().out
    assert "profiled" in text and "seq_len" in text and len(text.strip().splitlines()) >= 5
    assert len(ProfileTable.load(out)) >= 2
    assert cli.run(args) == 0 and ", hit;" in capsys.readouterr().out
    other = parser.parse_args(["--config", str(toml), "--edges", "32,64", "--mem-capacity-gib", "2", "--quiet"])
    assert cli.run(other) == 0 and ", profiled;" in capsys.readouterr().out  # a new key: a new file
    (cached,) = [p for p in (tmp_path / "cache").iterdir() if ProfileTable.load(p).meta.extra["mem_capacity_gib"] == 2]
    cached.write_text(cached.read_text().replace("True", "Tr"))
    assert cli.run(other) == 2 and "dcp profile --refresh" in capsys.readouterr().err
    other.refresh = True
    assert cli.run(other) == 0 and ", profiled;" in capsys.readouterr().out


def test_lazy_exports_of_the_package():
    import dcp.profiler
    from dcp.api import set_manager as real
    from dcp.profiler import set_manager

    assert set_manager is real and dcp.profiler.profile_table is profile_table
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dcp.profiler.nope  # noqa: B018


def test_a_bf16_table_records_its_weight_copies_and_fsdp2_runs_without_them(t1d):
    """Autocast saves each layer's bf16 weight copies for backward and the profiled m_act holds them; the fsdp2
    engines compute on their gathered bf16 parameters (in their state) and make none: with_engine_state takes
    them out for those engines and puts them back for the others. fp32 tables have none to move."""
    from dcp.config import RuntimeConfig
    from dcp.memory import weight_copy_bytes
    from dcp.planner.table import with_engine_state

    base = config_for(t1d, sp_sizes=(1,), edges=(64,), max_b=1)
    bf16 = profile_table(t1d, base.replace(runtime=RuntimeConfig(precision="bf16")), progress=False)
    copies = weight_copy_bytes(t1d.config.shape())
    assert bf16.meta.extra["weight_copy_bytes"] == copies > 0 and bf16.meta.extra["weight_copies_in_m_act"] is True
    row = bf16.rows[0]
    # what autocast keeps of one layer is its copies and more: the measured m_act holds them
    assert row.m_act_bytes > copies
    sharded = with_engine_state(bf16, t1d.config.shape(), "fsdp2-zero3", 2)
    assert sharded.rows[0].m_act_bytes == pytest.approx(row.m_act_bytes - copies)
    assert sharded.meta.extra["weight_copies_in_m_act"] is False
    back = with_engine_state(sharded, t1d.config.shape(), "ddp", 2)
    assert back.rows[0].m_act_bytes == pytest.approx(row.m_act_bytes) and back.rows[0].m_const_bytes == pytest.approx(
        row.m_const_bytes)
    fp32 = profile_table(t1d, base, progress=False)
    assert fp32.meta.extra["weight_copy_bytes"] == 0
    assert with_engine_state(fp32, t1d.config.shape(), "fsdp2-zero3", 2).rows[0].m_act_bytes == fp32.rows[0].m_act_bytes
