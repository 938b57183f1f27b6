"""``dcp demo``'s pure parts: the interleaved schedule, paired speedups, medians and spread, the table with its
legend, the result files and their errors, and ``--plot`` rebuilding everything from reps.csv alone."""

from __future__ import annotations

import argparse
import math

import pytest

from dcp import demo


def _rows():
    # three repetitions; rep 2 is slowed for every method (a busy host): paired speedups stay put
    times = {"bucket": [10.0, 20.0, 11.0], "dcp-inter": [8.0, 16.0, 9.0], "dcp-intra": [5.0, 10.0, 6.0]}
    rows = []
    for m, ts in times.items():
        for rep, t in enumerate(ts):
            rows.append({"method": m, "rep": rep, "order": 0, "steps": 4, "samples": 16, "tokens": 1000,
                         "tokens_per_step_min": 200, "tokens_per_step_median": 250, "tokens_per_step_max": 300,
                         "epoch_time_s": t, "predicted_epoch_time_s": {"bucket": 9.0, "dcp-inter": 8.0,
                                                                        "dcp-intra": 6.0}[m],
                         "idle_ratio": 0.1, "predicted_idle_ratio": 0.05})
    return demo.add_speedups(rows)


def _args(tmp_path, *argv):
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    return p.parse_args(["--out", str(tmp_path), *argv])


def test_schedule_interleaves_methods_and_alternates_their_order():
    order = demo.schedule(3)
    assert [m for _, m in order] == ["bucket", "dcp-inter", "dcp-intra", "dcp-intra", "dcp-inter", "bucket",
                                     "bucket", "dcp-inter", "dcp-intra"]
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_speedups_are_paired_per_repetition_and_summarised_by_median_and_range():
    rows = _rows()
    intra = [r["speedup_vs_bucket"] for r in rows if r["method"] == "dcp-intra"]
    assert intra == pytest.approx([2.0, 2.0, 11 / 6])
    s = {r["method"]: r for r in demo.summarize(rows)}
    assert s["dcp-intra"]["speedup_median"] == pytest.approx(2.0)
    assert s["dcp-intra"]["speedup_min"] == pytest.approx(11 / 6) and s["dcp-intra"]["speedup_max"] == pytest.approx(2.0)
    assert s["dcp-intra"]["epoch_s_median"] == 6.0 and s["dcp-intra"]["epoch_s_max"] == 10.0
    assert s["dcp-intra"]["predicted_speedup"] == pytest.approx(1.5)
    assert s["bucket"]["speedup_median"] == 1.0
    assert [r["method"] for r in demo.summarize(rows)] == list(demo.METHODS)


def test_speedup_without_a_baseline_is_nan():
    rows = demo.add_speedups([{"method": "dcp-intra", "rep": 0, "epoch_time_s": 1.0}])
    assert math.isnan(rows[0]["speedup_vs_bucket"])


def test_table_has_one_row_per_method_and_the_legend_names_every_column():
    rows = _rows()
    text = demo.format_table(demo.summarize(rows), 3)
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["method", "steps"] and "speedup vs bucket" in lines[0] and "pred s" in lines[0]
    assert lines[4].startswith("dcp-intra") and "2.00x [1.83-2.00]" in lines[4] and "6.00 [5.00-10.00]" in lines[4]
    for column in ("epoch s", "pred s", "speedup", "pred x", "idle"):
        assert column in demo.LEGEND
    assert "med tok/s" not in text
    reps = demo.format_reps(rows).splitlines()
    assert len(reps) == 3 and reps[0].startswith("rep 1: bucket 10.00s (1.00x)")


def test_plot_rebuilds_table_and_png_from_reps_csv(tmp_path, capsys):
    demo._write_csv(tmp_path / demo.REPS_CSV, demo.REP_COLUMNS, _rows())
    assert demo.run(_args(tmp_path, "--plot")) == 0
    out = capsys.readouterr().out
    assert "dcp-intra" in out and demo.LEGEND in out and "rep 3:" in out
    png = tmp_path / demo.PLOT_PNG
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / demo.SUMMARY_CSV).read_text().splitlines()[0] == ",".join(demo.SUMMARY_COLUMNS)


def test_plot_without_results_names_the_file_and_the_fix(tmp_path, capsys):
    assert demo.run(_args(tmp_path, "--plot")) == 2
    assert f"{tmp_path / demo.REPS_CSV} does not exist: run `dcp demo --out" in capsys.readouterr().out


def test_plot_with_foreign_columns_is_refused(tmp_path, capsys):
    (tmp_path / demo.REPS_CSV).write_text("a,b\n1,2\n")
    assert demo.run(_args(tmp_path, "--plot")) == 2
    assert "has columns ['a', 'b']" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--samples", "4"], "--samples (4) must be >= 8"),
])
def test_bad_options_get_one_line(tmp_path, capsys, argv, message):
    assert demo.run(_args(tmp_path, *argv)) == 2
    assert message in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--reps", "0"], "argument --reps: '0' must be >= 1"),
    (["--samples", "100000000000"], "argument --samples: '100000000000' is more than 67,108,864 samples"),
])
def test_bad_counts_are_refused_by_the_parser(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        _args(tmp_path, *argv)
    assert message in capsys.readouterr().err


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    assert demo.run(p.parse_args(["--out", str(f)])) == 2
    assert "is a file: pass a folder" in capsys.readouterr().out


def test_defaults_write_under_runs_with_their_own_profile_cache():
    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    args = p.parse_args([])
    assert args.out == "runs/demo" and args.reps >= 3
    cfg = demo._config(demo.DEMO_SETTINGS, "runs/demo/cache")
    assert cfg.profiling.cache_dir == "runs/demo/cache"  # never the .dcp_cache `dcp profile` uses


def test_workload_has_a_long_tail_that_needs_sp2():
    lengths = demo._lengths(demo.DEMO_SETTINGS)
    assert len(lengths) == demo.DEMO_SETTINGS["num_samples"]
    srt = sorted(lengths)
    assert srt[-1] > 1024 >= srt[len(srt) // 2] * 4  # the longest is in the last seq_group, the median far below


def test_demo_profile_times_cpu_time_and_the_profiler_uses_that_clock(monkeypatch, tmp_path):
    # the demo's profile must not move with other jobs' load: advanced.clock = "cpu" reaches every timed pass
    import copy

    import torch

    import dcp.profiler.measure as measure
    from dcp.experiments.execute import build_model
    from dcp.profiler.dual_layer import profile_table

    settings = copy.deepcopy(demo.DEMO_SETTINGS)
    assert demo._config(settings, str(tmp_path)).advanced.clock == "cpu"
    settings["config"]["profiling"].update(seq_group_edges=[64], max_micro_batch_size=1)
    settings["config"]["advanced"].update(measure_iters=1)
    settings["config"]["planning"].update(mem_capacity_gib=1.0, sp_sizes=[1])
    seen: list[str] = []
    real = measure._region_clock
    monkeypatch.setattr(measure, "_region_clock", lambda name, *a: (seen.append(name), real(name, *a))[1])
    table = profile_table(build_model("t1d-tiny", torch.device("cpu")), demo._config(settings, str(tmp_path)),
                          progress=False)
    assert len(table) == 1 and seen and set(seen) == {"cpu"}


def _demo_step_tokens():
    """(config, lengths, {method: tokens of every step}) of the demo epoch planned on the analytic CPU table."""
    from dcp.planner import plan_epoch
    from dcp.planner.analytic import analytic_table_for
    from dcp.planner.step_tokens import step_tokens

    cfg = demo._config(demo.DEMO_SETTINGS, "unused")
    lengths = demo._lengths(demo.DEMO_SETTINGS)
    table = analytic_table_for(cfg, 2)
    return cfg, lengths, {m: step_tokens(plan_epoch(lengths, table, demo.method_config(cfg, m), 2)) for m in demo.METHODS}


def test_every_method_plans_at_the_demo_batch():
    # one global batch for all methods (a recipe setting, not derived from the profile): the configs differ only
    # in the method, and each method's plan of the demo epoch trains every token with its epoch mean on the batch
    import dataclasses

    cfg = demo._config(demo.DEMO_SETTINGS, "unused")
    target = cfg.planning.tokens_per_step
    lengths = demo._lengths(demo.DEMO_SETTINGS)
    assert target == demo.batch_tokens(lengths, demo.DEMO_SETTINGS["tokens_per_step_nominal"]) > 0
    for m in demo.METHODS:
        mine = demo.method_config(cfg, m)
        assert mine.planning.method == m and mine.planning.tokens_per_step == target
        assert dataclasses.replace(mine.planning, method=cfg.planning.method) == cfg.planning
    _, _, planned = _demo_step_tokens()
    for m, tok in planned.items():
        assert tok.sum() == sum(lengths), m
        assert abs(tok.mean() / target - 1) <= 0.05, (m, tok.mean())


def test_every_demo_step_is_within_the_bounds():
    cfg, lengths, planned = _demo_step_tokens()
    target, (low, high) = cfg.planning.tokens_per_step, cfg.planning.step_tokens_bounds
    for m, tok in planned.items():
        assert (tok >= low * target).all() and (tok <= max(high * target, max(lengths))).all(), (m, tok.tolist())


def test_batch_is_whole_steps_of_about_the_nominal_tokens():
    assert demo.batch_tokens([1000] * 13, 2048) == 2167  # 13,000 tokens: 6 steps
    assert demo.batch_tokens([100] * 10, 2048) == 1000  # less than one nominal step: one step of the epoch
    assert demo.batch_tokens(demo._lengths(demo.DEMO_SETTINGS), 2048) == 2195  # 13,168 tokens: 6 steps


def test_tokens_per_step_columns_are_min_median_max():
    assert demo.tokens_per_step([300, 100, 200, 1000]) == {
        "tokens_per_step_min": 100, "tokens_per_step_median": 250, "tokens_per_step_max": 1000}
    text = demo.format_table(demo.summarize(_rows()), 3)
    assert "tok/step min/med/max" in text.splitlines()[0] and "200/250/300" in text.splitlines()[2]


def test_a_demo_folder_of_an_older_dcp_is_recognised_by_its_files_only(tmp_path):
    # claim_dir adopts an unmarked folder only when every file in it is the demo's own, in the demo's shape
    (tmp_path / demo.REPS_CSV).write_text(",".join(demo.REP_COLUMNS) + "\n")
    (tmp_path / demo.CONFIG_JSON).write_text('{"settings": {}}')
    assert demo.is_demo_folder(tmp_path)
    (tmp_path / demo.CONFIG_JSON).write_text('{"runs": {}}')
    assert not demo.is_demo_folder(tmp_path)  # another command's config.json
    (tmp_path / demo.CONFIG_JSON).write_text("{")
    assert not demo.is_demo_folder(tmp_path)  # cut short
    (tmp_path / demo.CONFIG_JSON).write_text('{"settings": {}}')
    (tmp_path / demo.REPS_CSV).write_text("a,b\n")
    assert not demo.is_demo_folder(tmp_path)  # a foreign reps.csv
    (tmp_path / demo.REPS_CSV).write_text(",".join(demo.REP_COLUMNS) + "\n")
    (tmp_path / "notes.txt").write_text("mine")
    assert not demo.is_demo_folder(tmp_path)  # a file of the user's
