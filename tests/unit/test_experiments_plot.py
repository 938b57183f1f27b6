"""Plots and tables rebuilt from runs.csv alone; the `dcp sweep` command's plot, dry-run and launch helpers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dcp.experiments import add_arguments, overrides_from_args
from dcp.experiments import run as sweep_run
from dcp.experiments.launch import run_groups, torchrun_command
from dcp.experiments.plot import format_table, latest_runs, plot_results, speedups
from dcp.experiments.results import RUN_COLUMNS, write_results
from dcp.experiments.sweep import load_sweep

REPO = Path(__file__).resolve().parents[2]


def _row(run_id, method, dataset, tput, w=2, model="t1d-tiny", ideal=0.5):
    row = {c: 0 for c in RUN_COLUMNS}
    row.update(run_id=run_id, git_sha="abc", config_hash="h", sweep="t", method=method, model=model, dataset=dataset,
               world_size=w, device="cpu", tokens_per_s=tput, ideal_fraction=ideal, step_time_s=1.0,
               predicted_step_time_s=0.9,
               idle_ratio=0.2, predicted_idle_ratio=0.1, mem_meter="saved", profile_source="profiled",
               executor="manager", timestamp="now", tokens_per_step_min=1234, tokens_per_step_median=3400.0,
               tokens_per_step_max=5600, target_tokens_per_step=0)
    return row


@pytest.fixture
def results_dir(tmp_path):
    rows = [
        _row("1", "bucket", "balanced", 100.0, ideal=0.4),
        _row("2", "dcp-inter", "balanced", 150.0),
        _row("3", "dcp-intra", "balanced", 200.0, ideal=0.6),
        _row("4", "dcp-intra", "short", 80.0),  # no bucket row for short: speedup is NaN
        _row("5", "bucket", "balanced", 100.0, w=4, model="t2d-tiny"),
    ]
    write_results(tmp_path, rows, [], sweep={"name": "t"}, run_configs={})
    return tmp_path


def test_speedups_against_bucket_on_same_model_dataset_world(results_dir):
    from dcp.experiments.results import read_runs

    spd = speedups(read_runs(results_dir))
    assert spd[("t1d-tiny", "balanced", "dcp-intra", 2)] == pytest.approx(2.0)
    assert spd[("t1d-tiny", "balanced", "bucket", 2)] == pytest.approx(1.0)
    assert math.isnan(spd[("t1d-tiny", "short", "dcp-intra", 2)])


def test_latest_runs_keeps_the_last_row_of_a_configuration():
    rows = [_row("1", "bucket", "balanced", 100.0), _row("2", "bucket", "balanced", 120.0)]
    assert [r["run_id"] for r in latest_runs(rows)] == ["2"]


def test_plot_and_table_from_csv_only(results_dir):
    png = plot_results(results_dir)
    assert png == results_dir / "summary.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from dcp.experiments.results import read_runs

    table = format_table(read_runs(results_dir))
    lines = table.splitlines()
    intra = next(line for line in lines if "dcp-intra" in line and "balanced" in line)
    # tok/s speedup 2.00x; the sample-mix-free one: ideal fraction 0.60 over bucket's 0.40
    assert intra.split()[-4:-1] == ["2.00x", "0.60", "1.50x"]
    short = next(line for line in lines if "short" in line)
    assert short.split()[-4:-1] == ["-", "0.50", "-"]
    # tokens per step beside throughput, and the batch the rows were made at
    assert "tok/step min/med/max" in lines[0] and intra.split()[-1] == "1.23k/3.4k/5.6k"
    assert lines[-1] == "# tokens/step: each method its own"


def test_the_batch_of_the_rows_is_stated():
    from dcp.experiments.plot import rows_batch_label

    assert rows_batch_label([_row("1", "bucket", "b", 1.0)]) == "tokens/step: each method its own"
    targeted = [_row(str(i), m, "b", 1.0) | {"target_tokens_per_step": 2e6} for i, m in enumerate(("bucket", "x"))]
    assert rows_batch_label(targeted) == "tokens/step target 2M"
    mixed = [targeted[0], _row("3", "dcp-intra", "b", 1.0)]
    assert rows_batch_label(mixed) == "tokens/step targets: own, 2M"
    assert rows_batch_label([_row("1", "bucket", "b", 1.0) | {"target_tokens_per_step": float("nan")}]) == (
        "tokens/step not recorded")


def _args(*argv):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_cli_plot_rebuilds_from_csv(results_dir, capsys):
    (results_dir / "summary.png").unlink(missing_ok=True)
    assert sweep_run(_args("--plot", str(results_dir))) == 0
    out = capsys.readouterr().out
    assert "dcp-intra" in out and "plot:" in out
    assert (results_dir / "summary.png").exists()


def test_cli_plot_of_a_committed_folder_draws_in_runs_unless_update_committed(results_dir, tmp_path, monkeypatch,
                                                                              capsys):
    import dcp.experiments.sweep as sweep_mod

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep_mod, "COMMITTED_RESULTS_ROOT", str(results_dir.parent))  # results_dir is "committed"
    committed_png = results_dir / "summary.png"
    committed_png.write_bytes(b"committed")
    assert sweep_run(_args("--plot", str(results_dir))) == 0
    out = capsys.readouterr().out
    drawn = tmp_path / "runs" / "plots" / results_dir.name / "summary.png"
    assert drawn.read_bytes()[:4] == b"\x89PNG" and committed_png.read_bytes() == b"committed"
    assert f"plot: runs/plots/{results_dir.name}/summary.png" in out and "changes only with --plot" in out
    assert sweep_run(_args("--plot", str(results_dir), "--update-committed")) == 0
    assert committed_png.read_bytes()[:4] == b"\x89PNG" and f"plot: {committed_png}" in capsys.readouterr().out


def test_cli_plot_of_missing_folder_names_the_fix(tmp_path, capsys):
    assert sweep_run(_args("--plot", str(tmp_path / "none"))) == 2
    assert "dcp sweep --plot: error: " in (err := capsys.readouterr().err) and "runs.csv does not exist: pass a folder written by `dcp sweep`" in err


def test_cli_needs_a_spec_or_plot(capsys):
    assert sweep_run(_args()) == 2
    assert "pass a sweep file" in capsys.readouterr().err


def test_cli_dry_run_lists_runs_with_hashes(capsys):
    spec = str(REPO / "experiments" / "cpu_small.toml")
    assert sweep_run(_args(spec, "--dry-run", "--world-sizes", "2", "--methods", "bucket,dcp-intra")) == 0
    out = capsys.readouterr().out
    assert "[12/12] t2d-tiny/long/dcp-intra/W2 config_hash=" in out


def test_cli_reports_bad_sweep_values(capsys):
    spec = str(REPO / "experiments" / "cpu_small.toml")
    assert sweep_run(_args(spec, "--dry-run", "--methods", "magic")) == 2
    assert "sweep.methods ('magic') is not one of" in capsys.readouterr().err


def test_overrides_from_args():
    got = overrides_from_args(_args("x.toml", "--out", "o", "--steps", "2", "--world-sizes", "2,4", "--models", "t1d-tiny"))
    assert got == {"out_dir": "o", "steps": 2, "world_sizes": [2, 4], "models": ["t1d-tiny"]}


def test_run_groups_follow_world_size_and_model():
    spec = load_sweep(REPO / "experiments" / "cpu_small.toml")
    groups = run_groups(spec)
    assert [(g[0].world_size, g[0].model, len(g)) for g in groups] == [
        (2, "t1d-tiny", 12), (2, "t2d-tiny", 12), (4, "t1d-tiny", 12), (4, "t2d-tiny", 12)]


def test_torchrun_commands():
    single = torchrun_command("s.toml", 8, 8, {"out_dir": "o", "methods": ["bucket"]}, multi_node=False)
    assert single[:3] == ["torchrun", "--standalone", "--nproc-per-node=8"]
    assert single[-6:] == ["--world-sizes", "8", "--out", "o", "--methods", "bucket"]
    multi = torchrun_command("s.toml", 32, 8, {}, multi_node=True)
    assert "--nnodes=4" in multi and "--rdzv-backend=c10d" in multi


def test_plot_target_knows_the_checkout_s_committed_folder_from_any_directory(tmp_path, monkeypatch):
    """The committed folder is the package checkout's experiments/results, whatever the current directory:
    `dcp sweep --plot /abs/path/to/experiments/results/cpu_small` run from elsewhere rewrote its summary.png."""
    from dcp.experiments import plot_target

    committed = REPO / "experiments" / "results" / "cpu_small"
    monkeypatch.chdir(tmp_path)  # not the checkout
    assert plot_target(committed, False) == Path("runs") / "plots" / "cpu_small" / "summary.png"
    assert plot_target(committed, True) is None
    assert plot_target(tmp_path, False) is None
