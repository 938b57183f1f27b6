"""The CLI as a newcomer meets it: outputs land in the git-ignored runs/ unless a committed folder is asked for
by name, --help shows every default, `dcp plan` explains its notation, a sweep leaves a consistent folder."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest

import dcp.figures as figures
from dcp.cli import build_parser, main
from dcp.experiments import run as sweep_run
from dcp.experiments.sweep import load_sweep

REPO = Path(__file__).resolve().parents[2]


def _subparsers(parser, name="dcp"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield f"{name} {sub_name}", sub
                yield from _subparsers(sub, f"{name} {sub_name}")


def test_default_outputs_are_git_ignored():
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "runs/" in ignored
    assert figures.DEFAULT_OUT.startswith("runs/") and figures.output_dir(None, False) == "runs/figures"
    spec = load_sweep(REPO / "experiments" / "cpu_small.toml")
    assert spec.output_dir == Path("runs/sweeps/cpu_small")


def test_committed_figures_only_on_request():
    assert figures.output_dir(None, True) == "paper_figures/out"
    assert figures.output_dir("elsewhere", False) == "elsewhere"
    with pytest.raises(figures.FiguresError, match="--update-committed disagree"):
        figures.output_dir("elsewhere", True)


def test_update_committed_refuses_quick_sizes(capsys):
    assert main(["figures", "--update-committed", "--quick", "--only", "fig5"]) == 2
    assert "would commit quick-size figures" in capsys.readouterr().err


def test_fig9_csv_is_deterministic_and_has_no_wall_clock_column(tmp_path):
    a = figures.make_figures(tmp_path / "a", names=["fig9"], quick=True, progress=False)
    b = figures.make_figures(tmp_path / "b", names=["fig9"], quick=True, progress=False)
    csv_a = next(p for p in a if p.suffix == ".csv")
    header = next(csv.reader(csv_a.open()))
    assert not [c for c in header if "time" in c or "wall" in c]
    assert csv_a.read_bytes() == next(p for p in b if p.suffix == ".csv").read_bytes()
    png_a, png_b = (next(p for p in x if p.suffix == ".png") for x in (a, b))
    assert png_a.read_bytes() == png_b.read_bytes()  # a refresh of unchanged code leaves git status clean


def test_sweep_update_committed_targets_experiments_results(capsys):
    spec = str(REPO / "experiments" / "cpu_small.toml")
    assert main(["sweep", spec, "--update-committed", "--dry-run"]) == 0
    assert "results would go to experiments/results/cpu_small" in capsys.readouterr().out
    assert main(["sweep", spec, "--dry-run"]) == 0
    assert "results would go to runs/sweeps/cpu_small" in capsys.readouterr().out
    assert main(["sweep", spec, "--update-committed", "--out", "x"]) == 2
    assert "dcp sweep: error: --out ('x') and --update-committed disagree" in capsys.readouterr().err


def test_sweep_rebuilds_its_plot_and_prints_the_table(tmp_path, monkeypatch, capsys):
    """A sweep never leaves an old summary.png beside new CSVs: it is removed first and rebuilt from runs.csv."""
    import dcp.experiments.launch as launch_mod
    from dcp.experiments.results import RUN_COLUMNS, write_results

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.png").write_bytes(b"stale")

    def fake_launch(spec, **kw):
        assert not (out / "summary.png").exists()
        rows = []
        for i, (m, t) in enumerate((("bucket", 100.0), ("dcp-intra", 150.0))):
            row = {c: 0 for c in RUN_COLUMNS}
            row.update(run_id=str(i), git_sha="abc", config_hash="h", sweep="t", method=m, model="t1d-tiny",
                       dataset="balanced", world_size=2, device="cpu", tokens_per_s=t, mem_meter="saved",
                       profile_source="profiled", executor="manager", timestamp="now")
            rows.append(row)
        write_results(spec.output_dir, rows, [], sweep={"name": "t"}, run_configs={})
        return 0

    monkeypatch.setattr(launch_mod, "launch", fake_launch)
    parser = argparse.ArgumentParser()
    from dcp.experiments import add_arguments

    add_arguments(parser)
    args = parser.parse_args([str(REPO / "experiments" / "cpu_small.toml"), "--out", str(out)])
    assert sweep_run(args) == 0
    text = capsys.readouterr().out
    assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert "dcp-intra" in text and "1.50x" in text and "step-med:" in text and f"plot: {out / 'summary.png'}" in text


def test_every_option_with_a_default_shows_it_in_help():
    missing = []
    for name, sub in _subparsers(build_parser()):
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
                continue
            if "default" not in formatter._get_help_string(action).lower():
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing, missing


def test_help_shows_defaults_of_a_command(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--out OUT" in text and "(default: runs/demo)" in text and "(default: 5)" in text
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "override sweep.steps (measured steps per run) (default: the configured value)" in text


def test_plan_prints_a_legend_for_its_notation(capsys):
    assert main(["plan", "--synthetic", "200", "--world-size", "4", "--steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    legend = [line for line in lines if line.startswith("sp, layout, ga, recompute:")]
    assert len(legend) == 1 and "'27,26x2' = 27, 26, 26" in legend[0] and "'0x29' = 0 for 29 groups" in legend[0]
    assert "'UxC*n'" in legend[0]


def test_env_prints_no_third_party_warning(capsys):
    assert main(["env"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("dcp ") and "WARNING" not in captured.out + captured.err


def test_profile_prints_where_the_table_went(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default cache_dir (.dcp_cache) is relative to the working folder
    (tmp_path / "quick.toml").write_text(
        "[profiling]\nseq_group_edges = [32]\nmax_micro_batch_size = 1\n[advanced]\nwarmup_iters = 0\nmeasure_iters = 1\n")
    assert main(["profile", "--model", "t1d-tiny", "--config", "quick.toml", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    path = [line.split("table: ", 1)[1] for line in lines if line.startswith("table: ")]
    assert len(path) == 1 and (tmp_path / path[0]).is_file()
    assert "profiling took" in lines[0] and "timed with the wall clock" in lines[0]  # 'auto' on CPU


def test_bench_help_says_what_a_bench_prints_and_how_to_get_its_flags(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "benchmarks: each prints one row per measurement" in text and "dcp bench NAME --help" in text


@pytest.mark.parametrize("argv, head, names", [
    (["bench"], "dcp bench: error: name a benchmark: ", ["planner", "loaders", "scale"]),
    ([], "dcp: error: name a command: ", ["env", "bench", "sweep"]),
])
def test_a_missing_subcommand_is_one_line_listing_them(capsys, argv, head, names):
    # before: argparse's usage and 'the following arguments are required: sub' (or: command), naming none
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert out.out == "" and len(lines) == 1 and lines[0].startswith(head), out.err
    listed = lines[0][len(head):].split(" (")[0].split(", ")
    assert set(names) <= set(listed) and "NAME --help" in lines[0]
    parser = dict(_subparsers(build_parser())).get(" ".join(["dcp", *argv]), build_parser())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert listed == list(sub.choices)  # every subcommand, in --help's order


def test_profile_compiles_the_layers_when_the_config_says_so(tmp_path, monkeypatch, capsys):
    """`dcp profile` prices what the run executes: with runtime.compile set it compiles the blocks before
    profiling, and the table is cached under a key holding the mode."""

    from dcp.runtime import compiled

    seen = []
    real = compiled.compile_layers

    def aot_eager(model, mode, *, backend="inductor"):  # no code generation in a unit test
        seen.append(mode)
        return real(model, mode, backend="aot_eager")

    monkeypatch.setattr(compiled, "compile_layers", aot_eager)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick.toml").write_text(
        "[profiling]\nseq_group_edges = [32]\nmax_micro_batch_size = 1\n[advanced]\nwarmup_iters = 0\nmeasure_iters = 1\n"
        '[runtime]\ncompile = "default"\n')
    assert main(["profile", "--model", "t1d-tiny", "--config", "quick.toml", "--quiet"]) == 0
    assert seen == ["default"]
    path = [ln.split("table: ", 1)[1] for ln in capsys.readouterr().out.splitlines() if ln.startswith("table: ")]
    assert '"compile": "default"' in (tmp_path / path[0]).read_text()  # the stored cache key
