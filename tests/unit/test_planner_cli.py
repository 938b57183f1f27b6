"""``dcp plan`` and ``dcp bench planner``: output, JSON, lengths files and their error messages."""

from __future__ import annotations

import argparse
import json

import pytest

from dcp.bench import planner as bench
from dcp.planner import cli
from dcp.planner.lengths import synthetic_lengths


def _run(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def test_plan_synthetic_json(capsys):
    assert _run(cli, ["--synthetic", "1000", "--world-size", "6", "--steps", "2", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    data = json.loads(out[-1])
    assert len(data["steps"]) == 2 and data["summary"]["samples"] == 1000
    assert data["summary"]["world_size"] == 6 and data["summary"]["method"] == "dcp-intra"
    assert out[0].split()[:4] == ["step", "sp", "layout", "ga"]
    assert any(line.startswith("epoch: steps=") for line in out)
    assert all(row["layout"].replace("x1", "").replace("*", "x") == row["sp"] for row in data["steps"])  # no GQA


def test_plan_rows_name_each_groups_layout():
    from dcp.config import DCPConfig, ModelShapeConfig, PlanningConfig
    from dcp.planner.assemble import EpochPlanner
    from dcp.planner.layout import layout_name, sp_layout

    gqa = ModelShapeConfig(num_heads=8, num_kv_heads=2, hidden_size=64)
    config = DCPConfig(model=gqa, planning=PlanningConfig(sp_sizes=(1, 2, 4, 8)))
    table = cli._build_table(config, 8)
    plans = list(EpochPlanner(synthetic_lengths(300, table.max_len, 0).tolist(), table, config, 8, 0))
    for plan in plans[:5]:
        row = cli.step_row(plan, gqa)
        want = [layout_name(*sp_layout(g.sp_size, 8, 2)) for g in plan.groups]
        assert row["layout"] == cli.rle(want, sep="*")
    assert sp_layout(4, 8, 2) == (2, 2) and cli.rle(["2x2", "2x2", "1x1"], sep="*") == "2x2*2,1x1"


@pytest.mark.parametrize("method", ["bucket", "packed", "dcp-inter"])
def test_plan_methods_and_table_file(method, tmp_path, capsys):
    from dcp.config import DCPConfig
    from dcp.planner.cli import _build_table

    table = _build_table(DCPConfig(), 4)
    path = tmp_path / "t.csv"
    table.save(path)
    lengths = tmp_path / "l.csv"
    lengths.write_text("id,tokens\n0,100\n1,2000\n2,300\n3,4000\n")
    assert _run(cli, ["--lengths", str(lengths), "--table", str(path), "--method", method, "--json"]) == 0
    data = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert data["summary"]["samples"] == 4 and data["summary"]["world_size"] == 4


def test_plan_refuses_table_of_another_depth(tmp_path, capsys):
    from dcp.config import DCPConfig, ModelShapeConfig
    from dcp.planner.cli import _build_table

    path = tmp_path / "t.csv"
    _build_table(DCPConfig(model=ModelShapeConfig(num_layers=4)), 4).save(path)
    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nnum_layers = 32\n")
    assert _run(cli, ["--synthetic", "50", "--table", str(path), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "has num_layers (4), but the config's model (t1d-tiny) has 32" in err[0]
    assert "profile this model" in err[0]


def test_plan_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[planning]\nmethod = "dcp-inter"\nranks_per_node = 4\n[profiling]\nseq_group_edges = [256, 1024]\n'
    )
    assert _run(cli, ["--config", str(cfg), "--synthetic", "50", "--world-size", "12", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert data["summary"]["method"] == "dcp-inter" and data["summary"]["samples"] == 50


def test_plan_errors_are_reported(tmp_path, capsys):
    bad = tmp_path / "l.txt"
    bad.write_text("100\n20x\n")
    assert _run(cli, ["--lengths", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "'20x'" in err and "is not an integer" in err
    long = tmp_path / "long.txt"
    long.write_text("100\n999999\n")
    assert _run(cli, ["--lengths", str(long)]) == 2
    assert "sample 1 has 999999 tokens" in capsys.readouterr().err


def test_synthetic_lengths():
    a = synthetic_lengths(1000, 4096, seed=3)
    assert a.min() >= 16 and a.max() <= 4096 and len(a) == 1000
    assert (a == synthetic_lengths(1000, 4096, seed=3)).all()
    assert (a < 256).sum() > (a > 2048).sum()  # log-uniform: many short, few long
    with pytest.raises(ValueError, match=r"n \(0\)"):
        synthetic_lengths(0, 10)


def test_bench_rows_and_json(capsys):
    assert _run(bench, ["--world-sizes", "4,12", "--steps", "5", "--step-ms", "1", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = json.loads(out[-1])["rows"]
    assert [r["world_size"] for r in rows] == [4, 12]
    assert all(r["steps"] == 5 and r["median_ms"] > 0 and r["p99_ms"] >= r["median_ms"] for r in rows)
    assert all(r["exposed_median_ms"] >= 0 and 0 <= r["idle_median"] < 1 for r in rows)
    # the simulated step time of the same plans and the planner's CPU share of it
    for r in rows:
        assert r["step_time_s"] > 0 and r["pace_ms"] == 1.0 and r["plan_exposed_ms"] == r["exposed_median_ms"]
        # planning_share is rounded to 7 decimals: at ~5e-5 that alone is a 1e-3 relative difference
        assert r["planning_share"] == pytest.approx(r["cpu_median_ms"] / (1e3 * r["step_time_s"]), rel=1e-3, abs=5e-8)
        assert r["model"] == "t1d-tiny" and r["hardware"] == "cpu-small"
    assert len(out) == 4  # header, two rows, json
    assert "step_time_s" in out[0] and "planning_share" in out[0] and "plan_exposed_ms" in out[0]


def test_bench_paces_the_consumer_at_the_simulated_step_time(capsys):
    # without --step-ms the consumer spends each step's simulated time, capped (cpu-small steps last seconds)
    assert _run(bench, ["--world-sizes", "8", "--steps", "3", "--pace-cap-ms", "2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"][0]
    assert row["pace_ms"] == min(2.0, round(1e3 * row["step_time_s"], 3))
    assert _run(bench, ["--world-sizes", "8", "--steps", "2", "--pace-cap-ms", "1e9", "--model", "t1d-5b",
                        "--hardware", "h200", "--step-ms", "0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"][0]
    assert row["model"] == "t1d-5b" and row["hardware"].startswith("NVIDIA H200") and row["pace_ms"] == 0.0


def test_bench_plans_a_named_distribution(capsys):
    assert _run(bench, ["--world-sizes", "8", "--steps", "2", "--dataset", "text", "--step-ms", "0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"][0]
    assert row["dataset"] == "text" and row["steps"] == 2 and row["step_time_s"] > 0
    _bench_error(capsys, ["--world-sizes", "8", "--dataset", "nope"], "--dataset ('nope') is not 'synthetic' or one of [")
    # the stream's length: all of it planned when it is short
    assert _run(bench, ["--world-sizes", "4", "--steps", "50", "--samples-per-rank", "40", "--step-ms", "0",
                        "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"][0]
    assert row["samples"] == 160 and row["steps"] < 50
    _bench_error(capsys, ["--world-sizes", "4", "--samples-per-rank", "-1"], "--samples-per-rank (-1) must be >= 0")


@pytest.mark.parametrize("model, hardware", [("t1d-tiny", "cpu"), ("t1d-5b", "h200")])
def test_bench_step_time_is_the_simulators(model, hardware):
    # the bench prices each plan as `dcp simulate` does: the same StepResults, step by step
    from dcp.planner.assemble import EpochPlanner
    from dcp.sim.cluster import simulate

    table, config, hw = bench._setup(8, "dcp-intra", model, hardware)
    lengths = synthetic_lengths(3000, table.max_len, seed=3)
    _, steps = simulate(lengths, table, config, 8, hardware=hw, return_steps=True)
    price = bench.step_pricer(table, config, hw, 8)
    mine = [price(p) for p in EpochPlanner(lengths, table, config, 8)]
    assert len(mine) == len(steps) > 1
    assert [s.step_time_s for s in mine] == pytest.approx([s.step_time_s for s in steps])
    assert all(s.sync_time_s > 0 and s.optimizer_time_s > 0 for s in mine)


def test_bench_busy_consumer(capsys):
    # the consumer computes in Python (holding the GIL) instead of sleeping
    assert _run(bench, ["--world-sizes", "4", "--steps", "3", "--step-ms", "2", "--busy", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    assert rows[0]["consumer"] == "busy" and rows[0]["steps"] == 3 and rows[0]["exposed_median_ms"] >= 0


def _bench_error(capsys, argv, needle):
    """``dcp bench planner ARGV`` exits 2 with one line on stderr, 'dcp bench planner: error: ...NEEDLE...',
    and nothing on stdout (before: the line was printed on stdout)."""
    from dcp.cli import main

    assert main(["bench", "planner", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "", out.out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcp bench planner: error: ") and needle in lines[0], out.err


def test_bench_bad_world_sizes(capsys):
    _bench_error(capsys, ["--world-sizes", "8,x"], "--world-sizes ('8,x')")


def test_bench_planner_rejects_bad_arguments(capsys):
    for argv, needle in (
        (["--world-sizes", "8,x"], "must be comma-separated integers"),
        (["--world-sizes", "0"], "must be integers in [1, 131,072]"),
        (["--world-sizes", "8", "--steps", "0"], "--steps (0) must be >= 1"),
        (["--world-sizes", "8", "--step-ms", "-1"], "--step-ms (-1.0) must be >= 0"),
        (["--world-sizes", "8", "--pace-cap-ms", "-2"], "--pace-cap-ms (-2.0) must be >= 0"),
    ):
        _bench_error(capsys, argv, needle)


def test_bench_prices_the_timed_steps_after_the_loop():
    # the steps are priced after the timed loop, from the same plans planned again: the timed steps' (1 .. steps,
    # the first plan is setup) median simulated time, not a neighbour's
    import numpy as np

    from dcp.planner.assemble import EpochPlanner

    steps, world = 5, 8
    row = bench.bench_world_size(world, steps, step_ms=0)
    table, config, hw = bench._setup(world, "dcp-intra", bench.DEFAULT_MODEL, "cpu")
    lengths, _ = bench._lengths("synthetic", (64 * (steps + 1) + 128) * world, table, bench.DEFAULT_MODEL)
    price = bench.step_pricer(table, config, hw, world)
    times = [price(p).step_time_s for p in EpochPlanner(lengths, table, config, world)][:steps + 1]
    assert row["steps"] == steps and len(set(times)) > 1
    assert row["step_time_s"] == round(float(np.median(times[1:])), 4)


def test_plan_says_whether_token_packs_are_used_and_why_not(capsys):
    from dcp.planner.tokens import token_pack_line

    assert _run(cli, ["--synthetic", "500", "--world-size", "8", "--steps", "0", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    (line,) = [x for x in out if x.startswith("token packs:")]
    groups = json.loads(out[-1])["summary"]["token_pack_seq_groups"]
    assert groups and line.startswith(f"token packs: seq_groups {groups[0]} (")  # the default "auto" packs them
    assert _run(cli, ["--synthetic", "500", "--world-size", "8", "--steps", "0", "--method", "bucket"]) == 0
    assert "token packs: not used: planning.method 'bucket' (token packs are a DCP method's)" in capsys.readouterr().out
    assert token_pack_line("dcp-intra", "auto", {}, True).startswith("token packs: not used: 2D data")
    assert token_pack_line("dcp-intra", "auto", {}, False).startswith(
        "token packs: not used: no seq_group's packs are predicted cheaper")
    assert token_pack_line("dcp-inter", "off", {0: 2048}, False).startswith('token packs: off (advanced.micro_batch')
