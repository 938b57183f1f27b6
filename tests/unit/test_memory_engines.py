"""One memory model of the engines' state: the config check, the analytic rows and the derived rows agree."""

from __future__ import annotations

import pytest

from dcp.config import ConfigError, DCPConfig, ModelShapeConfig, PlanningConfig, RuntimeConfig
from dcp.planner.analytic import analytic_row
from dcp.sim.hardware import H100

# 8B shape: 32 layers, width 4096, FFN 14336, vocab 128256, bf16 weights, Adam (fp32 m, v, master: 12 bytes)
SHAPE_8B = ModelShapeConfig(num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=14336, vocab_size=128256,
                            param_bytes=2, optimizer_bytes_per_param=12)


def config(engine: str) -> DCPConfig:
    return DCPConfig(model=SHAPE_8B, planning=PlanningConfig(mem_capacity_gib=80.0, sp_sizes=(1, 2, 4, 8)),
                     runtime=RuntimeConfig(engine=engine))


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp2"])
def test_8b_accepted_with_sharded_state(engine):
    cfg = config(engine)
    row = analytic_row(SHAPE_8B, 0, 4096, 1, 8, world_size=64, hardware=H100, engine=engine)
    state = SHAPE_8B.constant_mem_bytes(engine, dp_size=64)
    assert state < 80 * 2**30 and cfg.planning.mem_capacity_bytes > row.m_const_bytes > state


def test_8b_refused_with_ddp():
    with pytest.raises(ConfigError, match="runtime.engine 'ddp'.*fsdp2"):
        config("ddp")


def test_engines_state_ordered_and_shared():
    n, dp = SHAPE_8B.num_params, 64
    ddp, zero1, fsdp2 = (SHAPE_8B.constant_mem_bytes(e, dp_size=dp) for e in ("ddp", "deepspeed", "fsdp2"))
    root = 2 * SHAPE_8B.vocab_size * SHAPE_8B.hidden_size  # fsdp2 stages its largest unit in fp32: the root
    assert ddp == n * 16 and zero1 == n * 4 + n * 12 // dp and fsdp2 == n * 4 + 4 * root + n * 14 // dp
    for engine in ("ddp", "deepspeed", "fsdp2"):  # the analytic M_C starts from the same state bytes
        a = analytic_row(SHAPE_8B, 0, 1024, 1, 1, world_size=dp, hardware=H100, engine=engine)
        b = analytic_row(SHAPE_8B, 0, 1024, 1, 1, world_size=dp, hardware=H100, engine="ddp")
        assert a.m_const_bytes - SHAPE_8B.constant_mem_bytes(engine, dp_size=dp) == pytest.approx(
            b.m_const_bytes - ddp)


def test_unknown_engine_named():
    with pytest.raises(ConfigError, match="runtime.engine"):
        SHAPE_8B.constant_mem_bytes("zero3", dp_size=2)


def test_simulator_counts_the_same_state():
    from dcp.sim.scenario import paper_table, scenario

    sc = scenario("t1d-5b", "h100")
    rows = {e: paper_table(sc, 64, engine=e).rows[0] for e in ("ddp", "deepspeed", "fsdp2")}
    for e, row in rows.items():
        assert row.m_const_bytes - sc.model.constant_mem_bytes(e, dp_size=64) == pytest.approx(
            rows["ddp"].m_const_bytes - sc.model.constant_mem_bytes("ddp", dp_size=64))
    assert rows["ddp"].m_const_bytes > rows["fsdp2"].m_const_bytes > rows["deepspeed"].m_const_bytes


def test_chunked_loss_counts_one_chunk_of_logits():
    kw = dict(world_size=64, hardware=H100, engine="fsdp2")
    whole = analytic_row(SHAPE_8B, 0, 32768, 1, 1, **kw)
    chunked = analytic_row(SHAPE_8B, 0, 32768, 1, 1, loss_chunk_tokens=1024, **kw)
    d, v = 4, SHAPE_8B.vocab_size
    # the head's working set drops from the whole sequence's logits to one chunk's (or the layer's, if larger)
    saved = 2.0 * 32768 * v * d - max(2.0 * 1024 * v * d, whole.m_act_bytes)
    assert saved > 0.5 * 2.0 * 32768 * v * d
    assert whole.m_const_bytes - chunked.m_const_bytes == pytest.approx(saved)
    short = analytic_row(SHAPE_8B, 0, 512, 1, 1, loss_chunk_tokens=1024, **kw)  # shorter than a chunk: unchanged
    assert short.m_const_bytes == analytic_row(SHAPE_8B, 0, 512, 1, 1, **kw).m_const_bytes


def test_simulate_engine_flag_plans_8b_with_fsdp2_only(tmp_path, capsys):
    from dcp.cli import main

    cfg = tmp_path / "8b.toml"
    cfg.write_text(
        '[model]\nname = "llama-8b"\nnum_layers = 32\nhidden_size = 4096\nnum_heads = 32\nffn_hidden_size = 14336\n'
        'vocab_size = 128256\nparam_bytes = 2\noptimizer_bytes_per_param = 12\n'
        '[planning]\nmem_capacity_gib = 80.0\nsp_sizes = [1, 2, 4, 8]\n'
        '[profiling]\nseq_group_edges = [4096, 32768, 131072]\nmax_micro_batch_size = 2\n'
        '[runtime]\nengine = "fsdp2"\n')
    lengths = tmp_path / "len.csv"
    lengths.write_text("tokens\n" + "\n".join(str(n) for n in [2048, 131072, 30000, 4096, 100000, 9000] * 22) + "\n")
    args = ["simulate", "--config", str(cfg), "--lengths", str(lengths), "--gpus", "64", "--hardware", "h100",
            "--loss-chunk-tokens", "1024", "--engine"]
    assert main([*args, "fsdp2"]) == 0
    assert "dcp-intra" in capsys.readouterr().out
    assert main([*args, "ddp"]) == 2  # replicated state alone is over the capacity: refused, naming fsdp2
    err = capsys.readouterr().err
    assert "is below the model's constant memory (131.660 GiB" in err and "runtime.engine 'fsdp2'" in err
    cfg.write_text(cfg.read_text().replace("mem_capacity_gib = 80.0", "mem_capacity_gib = 30.0"))
    assert main([*args, "fsdp2"]) == 2  # fsdp2 holds whole parameters and gradients through a step: name zero3
    assert "use runtime.engine 'fsdp2-zero3'" in capsys.readouterr().err
    assert main([*args, "fsdp2-zero3"]) == 0


def test_zero3_shards_everything_but_the_gathered_units():
    n, dp, h = SHAPE_8B.num_params, 64, SHAPE_8B.hidden_size
    layer = 4 * h * h + 3 * h * SHAPE_8B.ffn_size + 2 * h
    gathered = 2 * SHAPE_8B.vocab_size * h + 2 * layer  # embedding + head, the layer computing and the prefetched one
    zero3 = SHAPE_8B.constant_mem_bytes("fsdp2-zero3", dp_size=dp)
    assert zero3 == 2 * gathered * 2 + n * 16 // dp
    assert zero3 < SHAPE_8B.constant_mem_bytes("fsdp2", dp_size=dp) / 3  # 9.6 vs 38.6 GiB
    assert SHAPE_8B.constant_mem_bytes("fsdp2-zero3", dp_size=None) == 4 * gathered  # the config check's floor
    config("fsdp2-zero3")  # accepted on 80 GB


def test_gather_rounds_per_engine():
    from dcp.memory import gather_rounds

    assert [gather_rounds(e, 3) for e in ("ddp", "deepspeed", "fsdp2", "fsdp2-zero3")] == [2, 2, 2, 9]
    with pytest.raises(ConfigError, match=r"runtime.engine \('zero3'\) is not one of"):
        gather_rounds("zero3", 1)
    with pytest.raises(ConfigError, match=r"ga_slots \(0\) must be >= 1"):
        gather_rounds("fsdp2-zero3", 0)


def test_zero3_rows_take_at_least_their_layer_gathers():
    from dcp.planner.analytic import analytic_row, layer_linear_params, zero3_gather_s
    from dcp.sim.hardware import H100

    gather = zero3_gather_s(layer_linear_params(SHAPE_8B) * SHAPE_8B.param_bytes, 64, H100)
    assert gather > 0.01  # 436 M parameters in bf16 across nodes: tens of milliseconds a round

    def row(engine, seq_len, p):
        return analytic_row(SHAPE_8B, 0, seq_len, 1, p, world_size=64, hardware=H100, dtype_bytes=2, engine=engine)

    short_z3, short = row("fsdp2-zero3", 1024, 8), row("fsdp2", 1024, 8)
    assert short.t_f_s < gather and (short_z3.t_f_s, short_z3.t_b_s) == (gather, 2 * gather)  # collective-bound
    assert short_z3.t_const_s > short.t_const_s  # the root unit's gathers are not hidden
    long_z3, long = row("fsdp2-zero3", 131072, 8), row("fsdp2", 131072, 8)
    assert (long_z3.t_f_s, long_z3.t_b_s) == (long.t_f_s, long.t_b_s)  # compute hides the gathers


def test_a_profiled_tables_state_follows_the_engine_of_the_run():
    import dataclasses

    from dcp.planner import analytic_table
    from dcp.planner.table import ProfileTable, with_engine_state

    analytic = analytic_table(SHAPE_8B, (4096,), sp_sizes=(1,), max_micro_batch_size=1, world_size=64,
                              hardware=H100, dtype_bytes=2)
    assert with_engine_state(analytic, SHAPE_8B, "fsdp2", 64) is analytic  # priced per engine already
    whole = float(SHAPE_8B.constant_mem_bytes("ddp", dp_size=64))
    rows = [dataclasses.replace(r, m_const_bytes=whole + 2**30) for r in analytic.rows]  # the whole state + 1 GiB
    profiled = ProfileTable(rows, dataclasses.replace(analytic.meta, extra={**analytic.meta.extra,
                                                                          "state_bytes": whole}))
    assert with_engine_state(profiled, SHAPE_8B, "ddp", 64) is profiled  # measured whole, held whole
    sharded = with_engine_state(profiled, SHAPE_8B, "fsdp2", 64)
    from dcp.memory import staging_bytes

    held = SHAPE_8B.constant_mem_bytes("fsdp2", dp_size=64) - staging_bytes(SHAPE_8B, "fsdp2")  # as measured: no staging
    assert held < whole and sharded.meta.extra["state_bytes"] == held
    assert sharded.rows[0].m_const_bytes == pytest.approx(held + 2**30)
    # cached under fsdp2, used under ddp: the whole state again, from the record of what was measured
    back = with_engine_state(sharded, SHAPE_8B, "ddp", 64)
    assert back.rows[0].m_const_bytes == pytest.approx(profiled.rows[0].m_const_bytes)


def test_the_committed_sharded_shapes_load_and_the_70b_one_needs_zero3():
    from pathlib import Path

    from dcp.config import config_from_dict, read_toml

    experiments = Path(__file__).parents[2] / "experiments"
    assert config_from_dict(read_toml(experiments / "dense8b.toml")).runtime.engine == "fsdp2"
    raw = read_toml(experiments / "dense70b.toml")
    assert config_from_dict(raw).runtime.engine == "fsdp2-zero3"
    raw["runtime"]["engine"] = "fsdp2"  # whole parameters and gradients of 80 layers: over 80 GB, refused
    with pytest.raises(ConfigError, match="use runtime.engine 'fsdp2-zero3'"):
        config_from_dict(raw)


def test_a_measured_state_is_compared_without_fsdp2s_transient_staging():
    from dcp.memory import staging_bytes
    from dcp.planner.table import engine_state_bytes

    staged = staging_bytes(SHAPE_8B, "fsdp2")
    assert staged == 4 * 2 * SHAPE_8B.vocab_size * SHAPE_8B.hidden_size and staging_bytes(SHAPE_8B, "ddp") == 0
    whole = float(SHAPE_8B.constant_mem_bytes("ddp", dp_size=1))
    assert engine_state_bytes(whole, SHAPE_8B, "fsdp2", 64) == SHAPE_8B.constant_mem_bytes("fsdp2", 64) - staged


def test_fsdp2_holds_its_gathered_parameters_in_the_compute_precision():
    """bf16's MixedPrecisionPolicy gathers bf16 parameters and accumulates unsynced gradients in fp32: measured on
    2 gloo ranks (scripts/state_memory.py --precision bf16, 125.8 M fp32 parameters) 0.983 of this count, 0.856 of
    the count with fp32 gathered parameters."""
    import dataclasses

    from dcp.memory import state_bytes
    from dcp.planner.table import engine_state_bytes

    fp32 = dataclasses.replace(SHAPE_8B, param_bytes=4, optimizer_bytes_per_param=8)
    n, dp = fp32.num_params, 64
    full, bf16 = fp32.constant_mem_bytes("fsdp2", dp), fp32.constant_mem_bytes("fsdp2", dp, compute_bytes=2)
    assert full - bf16 == 2 * n  # only the gathered copy shrinks: gradients stay fp32, the shards are as before
    assert fp32.constant_mem_bytes("fsdp2", dp, compute_bytes=4) == full
    for engine in ("ddp", "deepspeed", "fsdp2-zero3"):  # the others keep what they hold whatever the precision
        assert fp32.constant_mem_bytes(engine, dp, compute_bytes=2) == fp32.constant_mem_bytes(engine, dp)
    # bf16 weights (param_bytes 2) gather as they are: a wider compute dtype adds nothing
    assert state_bytes(n, 2, 12, "fsdp2", dp, compute_bytes=4) == state_bytes(n, 2, 12, "fsdp2", dp)
    whole = float(fp32.constant_mem_bytes("ddp", dp_size=1))
    assert engine_state_bytes(whole, fp32, "fsdp2", dp, "bf16") == engine_state_bytes(whole, fp32, "fsdp2", dp) - 2 * n
    # the analytic rows price the state in their dtype: bf16 rows hold 2 bytes a parameter less under fsdp2
    rows = {(e, d): analytic_row(fp32, 0, 1024, 1, 1, world_size=dp, hardware=H100, engine=e, dtype_bytes=d)
            for e in ("ddp", "fsdp2") for d in (2, 4)}
    assert (rows["ddp", 2].m_const_bytes - rows["fsdp2", 2].m_const_bytes) - (
        rows["ddp", 4].m_const_bytes - rows["fsdp2", 4].m_const_bytes) == pytest.approx(2 * n)


def test_fsdp2_under_bf16_holds_more_than_the_whole_fp32_state_at_one_rank():
    """At W = 1 fsdp2 keeps the whole fp32 state and its gathered bf16 copy on top: the share is not capped at the
    whole there (measured on one H200 at W = 1: docs/engines.md); fp32 and fsdp2-zero3 keep the cap."""
    import dataclasses

    from dcp.memory import staging_bytes
    from dcp.planner.table import engine_state_bytes

    fp32 = dataclasses.replace(SHAPE_8B, param_bytes=4, optimizer_bytes_per_param=8)
    whole = float(fp32.constant_mem_bytes("ddp", dp_size=1))
    held = engine_state_bytes(whole, fp32, "fsdp2", 1, "bf16")
    assert held == fp32.constant_mem_bytes("fsdp2", 1, compute_bytes=2) - staging_bytes(fp32, "fsdp2") > whole
    assert engine_state_bytes(whole, fp32, "fsdp2", 1) == whole
    assert engine_state_bytes(whole, fp32, "fsdp2-zero3", 1, "bf16") == whole


def test_weight_copies_count_each_matmul_of_a_layer_at_its_width():
    """q and o are h x h, k and v h x (K/V heads x head dim), the gated MLP 3 h x f: 2 bytes each (bf16)."""
    import dataclasses

    from dcp.memory import weight_copy_bytes
    from dcp.models import build_model

    h, f = SHAPE_8B.hidden_size, SHAPE_8B.ffn_size
    assert SHAPE_8B.kv_heads == SHAPE_8B.num_heads  # no num_kv_heads given: every head has its K/V
    assert weight_copy_bytes(SHAPE_8B) == 2 * (4 * h * h + 3 * h * f)
    gqa = dataclasses.replace(SHAPE_8B, num_kv_heads=8)  # Llama-3 8B: k and v are 4096 x 1024
    assert weight_copy_bytes(gqa) == 2 * (2 * h * h + 2 * h * 1024 + 3 * h * f)
    model = build_model("t1d-tiny")  # the reference model's own matrices, counted from its parameters
    layer = sum(p.numel() for p in model.layers[0].parameters() if p.dim() == 2)
    assert weight_copy_bytes(model.config.shape()) == 2 * layer
