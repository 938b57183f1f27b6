"""Result files and aggregation: idle ratio from busy times, run summaries, CSV schema, config beside CSV."""

from __future__ import annotations

import csv
import json
import math

import pytest

from dcp.experiments.results import (
    CONFIG_JSON,
    LEGACY_RUN_COLUMNS,
    RUN_COLUMNS,
    RUNS_CSV,
    STEP_COLUMNS,
    STEPS_CSV,
    ResultsError,
    batch_label,
    group_busy_s,
    idle_ratio_from_busy,
    read_runs,
    summarize_run,
    write_results,
)
from dcp.experiments.runner import step_record
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan


@pytest.mark.parametrize(
    ("busy", "expected"),
    [
        ([1.0, 1.0], 0.0),
        ([2.0, 1.0], 0.25),  # rank 1 waits 1 s of a 2 s compute phase: 1 / (2 ranks * 2 s)
        ([1.0, 0.0], 0.5),  # an idle rank is fully idle
        ([3.0, 1.0, 2.0, 3.0], (0 + 2 + 1 + 0) / (4 * 3)),
        ([0.0, 0.0], 0.0),
    ],
)
def test_idle_ratio_from_busy(busy, expected):
    assert idle_ratio_from_busy(busy) == pytest.approx(expected)


def test_idle_ratio_rejects_empty_and_negative():
    with pytest.raises(ResultsError, match=r"busy_s \(\[\]\) is empty"):
        idle_ratio_from_busy([])
    with pytest.raises(ResultsError, match=r"negative time"):
        idle_ratio_from_busy([1.0, -0.1])


def test_group_busy_is_slowest_rank_of_each_group():
    assert group_busy_s([1.0, 3.0, 2.0, 0.5], [(0, 2), (2, 1), (3, 1)]) == [3.0, 2.0, 0.5]
    with pytest.raises(ResultsError, match=r"outside the 2 ranks"):
        group_busy_s([1.0, 1.0], [(1, 2)])


def _plan() -> StepPlan:
    mb = lambda ids, lens, t: MicroBatch(ids, lens, 0, t)  # noqa: E731
    groups = (
        GroupPlan(first_rank=0, sp_size=2, recompute_layers=4, micro_batches=(mb((0,), (100,), 2.0),)),
        GroupPlan(first_rank=2, sp_size=1, recompute_layers=0, micro_batches=(mb((1,), (10,), 0.5), mb((2,), (10,), 0.5))),
        GroupPlan(first_rank=3, sp_size=1, recompute_layers=0, micro_batches=()),
    )
    return StepPlan(epoch=0, step=0, world_size=4, method="dcp-intra", groups=groups)


def test_step_record_pairs_predicted_and_measured():
    rec = step_record(3, _plan(), [2.0, 2.0, 1.0, 0.0], 2.5, 1.25)
    assert rec["step"] == 3 and rec["tokens"] == 120 and rec["samples"] == 3 and rec["ideal_time_s"] == 1.25
    assert rec["predicted_step_time_s"] == 2.0
    # predicted GPU-weighted idle: (2*0 + 1*1 + 1*2) / (4 * 2)
    assert rec["predicted_idle_ratio"] == pytest.approx(3 / 8)
    assert rec["measured_idle_ratio"] == pytest.approx(3 / 8)
    assert rec["measured_compute_time_s"] == 2.0 and rec["measured_step_time_s"] == 2.5
    assert [g["ga_steps"] for g in rec["groups"]] == [1, 2, 0]


def _steps(times, tokens, idles):
    return [
        {"measured_step_time_s": t, "tokens": n, "samples": 1, "predicted_step_time_s": t / 2, "ideal_time_s": t / 4,
         "measured_idle_ratio": i, "measured_compute_time_s": t, "predicted_idle_ratio": 0.0}
        for t, n, i in zip(times, tokens, idles, strict=True)
    ]


def test_summarize_run_uses_total_tokens_over_total_time_and_time_weighted_idle():
    s = summarize_run(_steps([1.0, 3.0], [100, 500], [0.0, 0.4]))
    assert s["tokens_per_s"] == pytest.approx(600 / 4.0)
    assert s["tokens_per_s_median"] == pytest.approx((100 / 1.0 + 500 / 3.0) / 2)
    assert s["step_time_s"] == pytest.approx(2.0)
    assert s["predicted_step_time_s"] == pytest.approx(1.0)
    assert s["idle_ratio"] == pytest.approx((0.0 * 1 + 0.4 * 3) / 4)
    assert s["ideal_fraction"] == pytest.approx(0.25)  # total ideal time over total measured time
    assert s["steps"] == 2 and s["tokens"] == 600
    with pytest.raises(ResultsError, match=r"step_records \(\[\]\) is empty"):
        summarize_run([])


def test_summarize_run_reports_tokens_per_step_and_the_target():
    # the global batch each measured step trained, min / median / max, beside the run's target
    s = summarize_run(_steps([1.0, 3.0, 2.0], [100, 500, 200], [0.0, 0.4, 0.1]))
    assert (s["tokens_per_step_min"], s["tokens_per_step_median"], s["tokens_per_step_max"]) == (100, 200, 500)
    assert s["target_tokens_per_step"] == 0  # unset: each method its own batch
    assert summarize_run(_steps([1.0], [300], [0.0]), 250)["target_tokens_per_step"] == 250


def test_batch_label_names_the_target_or_says_there_is_none():
    assert batch_label(3_100_000) == "tokens/step target 3.1M"
    assert batch_label(12_345) == "tokens/step target 12.3k"
    assert batch_label(0) == "tokens/step: each method its own"
    assert batch_label(float("nan")) == "tokens/step not recorded"


def _run_row(run_id: str, method: str = "bucket", tput: float = 100.0) -> dict:
    row = {c: 0 for c in RUN_COLUMNS}
    row.update(run_id=run_id, git_sha="abc", config_hash="h" + run_id, sweep="t", method=method, model="t1d-tiny",
               dataset="balanced", world_size=2, device="cpu", tokens_per_s=tput, step_time_s=0.5,
               predicted_step_time_s=0.4, idle_ratio=0.1, predicted_idle_ratio=0.05, mem_meter="saved",
               profile_source="profiled", executor="manager", timestamp="now")
    return row


def _step_row(run_id: str) -> dict:
    row = {c: 0 for c in STEP_COLUMNS}
    row["run_id"] = run_id
    return row


def test_write_results_writes_schema_and_config_beside_csv(tmp_path):
    out = write_results(tmp_path / "r", [_run_row("a")], [_step_row("a")], sweep={"name": "t"},
                        run_configs={"a": {"config_hash": "ha"}})
    with (out / RUNS_CSV).open() as f:
        assert tuple(next(csv.reader(f))) == RUN_COLUMNS
    with (out / STEPS_CSV).open() as f:
        assert tuple(next(csv.reader(f))) == STEP_COLUMNS
    doc = json.loads((out / CONFIG_JSON).read_text())
    assert doc["sweep"] == {"name": "t"} and doc["runs"]["a"]["config_hash"] == "ha"
    # a second write appends rows and merges configs
    write_results(out, [_run_row("b", "dcp-intra")], [_step_row("b")], sweep={"name": "t"},
                  run_configs={"b": {"config_hash": "hb"}})
    rows = read_runs(out)
    assert [r["run_id"] for r in rows] == ["a", "b"]
    assert rows[0]["world_size"] == 2 and rows[0]["tokens_per_s"] == 100.0
    assert set(json.loads((out / CONFIG_JSON).read_text())["runs"]) == {"a", "b"}


def test_write_results_refuses_other_schema_and_missing_columns(tmp_path):
    (tmp_path / RUNS_CSV).write_text("run_id,other\n")
    with pytest.raises(ResultsError, match=r"has columns \['run_id', 'other'\].*new --out folder"):
        write_results(tmp_path, [_run_row("a")], [], sweep={}, run_configs={})
    bad = _run_row("a")
    del bad["tokens_per_s"]
    with pytest.raises(ResultsError, match=r"lacks columns \['tokens_per_s'\]"):
        write_results(tmp_path / "new", [bad], [], sweep={}, run_configs={})


def test_read_runs_requires_csv_and_config_beside_it(tmp_path):
    with pytest.raises(ResultsError, match=r"runs\.csv does not exist"):
        read_runs(tmp_path)
    write_results(tmp_path, [_run_row("a")], [], sweep={}, run_configs={})
    (tmp_path / CONFIG_JSON).unlink()
    with pytest.raises(ResultsError, match=r"config\.json is missing beside runs\.csv"):
        read_runs(tmp_path)


def test_an_older_runs_csv_reads_tokens_per_step_as_nan_and_is_upgraded_on_append(tmp_path):
    # a runs.csv written before tokens per step was recorded (e.g. experiments/results/cpu_small)
    old = {c: v for c, v in _run_row("a").items() if c in LEGACY_RUN_COLUMNS}
    (tmp_path / RUNS_CSV).write_text(",".join(LEGACY_RUN_COLUMNS) + "\n"
                                     + ",".join(str(old[c]) for c in LEGACY_RUN_COLUMNS) + "\n")
    (tmp_path / CONFIG_JSON).write_text('{"sweep": {}, "runs": {}}\n')
    from dcp.experiments.results import is_results_folder

    assert is_results_folder(tmp_path)  # adopted by `dcp sweep --out`, as before
    (row,) = read_runs(tmp_path)
    assert row["tokens_per_s"] == 100.0
    assert all(math.isnan(row[c]) for c in RUN_COLUMNS[len(LEGACY_RUN_COLUMNS):])
    new = _run_row("b") | {"tokens_per_step_min": 10, "tokens_per_step_median": 20.0, "tokens_per_step_max": 30,
                           "target_tokens_per_step": 0}
    write_results(tmp_path, [new], [], sweep={}, run_configs={})
    with (tmp_path / RUNS_CSV).open() as f:
        assert tuple(next(csv.reader(f))) == RUN_COLUMNS
    a, b = read_runs(tmp_path)
    assert math.isnan(a["tokens_per_step_median"]) and a["tokens_per_s"] == 100.0
    assert (b["tokens_per_step_min"], b["tokens_per_step_median"], b["target_tokens_per_step"]) == (10, 20, 0)


def test_read_runs_parses_nan(tmp_path):
    row = _run_row("a")
    row["load_avg_1m"] = float("nan")
    write_results(tmp_path, [row], [], sweep={}, run_configs={})
    assert math.isnan(read_runs(tmp_path)[0]["load_avg_1m"])


def test_ideal_step_time_prices_the_steps_own_samples_at_the_ideal_bound():
    """The same samples give the same ideal time whatever the plan; more or longer samples take longer."""
    from dcp.config import DCPConfig, PlanningConfig
    from dcp.experiments.execute import ideal_step_time_s
    from dcp.planner import plan_epoch
    from dcp.planner.analytic import CPU_SMALL, analytic_table_for
    from dcp.sim.cluster import ideal_tokens_per_s

    cfg = DCPConfig(planning=PlanningConfig(method="dcp-intra"))
    table = analytic_table_for(cfg, 4, mem_capacity_bytes=CPU_SMALL.mem_capacity_bytes)
    lengths = [100, 700, 2000, 3000, 64, 900] * 4
    plans = list(plan_epoch(lengths, table, cfg, 4))
    per_step = [ideal_step_time_s(p, table, cfg, 4) for p in plans]
    assert all(t > 0 for t in per_step)
    whole = sum(lengths) / ideal_tokens_per_s(lengths, table, cfg, 4)
    # the bound is additive over samples: the steps' ideal times add up to the epoch's
    assert sum(per_step) == pytest.approx(whole, rel=1e-9)
