"""End to end: a 2-step sweep on 2 gloo processes through the manager writes consistent result files."""

from __future__ import annotations

import csv
import json

import pytest

from dcp.experiments.launch import launch_local
from dcp.experiments.results import RUN_COLUMNS, STEP_COLUMNS, read_runs
from dcp.experiments.sweep import sweep_from_dict


def _spec(tmp_path, executor: str):
    raw = {
        "sweep": {"name": "dist_test", "world_sizes": [2], "models": ["t1d-tiny"], "datasets": ["balanced"],
                  "methods": ["bucket", "dcp-intra"], "steps": 1, "warmup_steps": 1, "num_samples": 64,
                  "scale": "cpu", "executor": executor, "out_dir": str(tmp_path / "out"),
                  "pin_cpus": executor == "manager"},
        "config": {
            # a quick profile: few candidates, one measurement each
            "profiling": {"seq_group_edges": [256, 1024, 2048], "max_micro_batch_size": 2, "warmup_iters": 0,
                          "measure_iters": 1, "cache_dir": str(tmp_path / "cache")},
            "planning": {"mem_capacity_gib": 0.016, "sp_sizes": [1, 2], "ranks_per_node": 2},
            "runtime": {"attention": "sdpa", "log_every": 1000},
        },
    }
    return sweep_from_dict(raw)


@pytest.mark.dist
def test_two_step_sweep_end_to_end(tmp_path):
    spec = _spec(tmp_path, "manager")
    outcomes = launch_local(spec, quiet=True)
    assert len(outcomes) == 2
    out = spec.output_dir
    rows = read_runs(out)
    assert [r["method"] for r in rows] == ["bucket", "dcp-intra"]
    for r in rows:
        assert r["steps"] == 1 and r["world_size"] == 2 and r["executor"] == "manager"
        assert r["profile_source"] == "profiled"
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["predicted_step_time_s"] > 0
        assert 0.0 <= r["idle_ratio"] < 1.0 and 0.0 <= r["predicted_idle_ratio"] < 1.0
        assert r["peak_mem_gib"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["step_time_s"], rel=1e-3)
    with (out / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert tuple(steps[0]) == STEP_COLUMNS
    # every SP group of the step is a row; together they cover both ranks exactly once
    for run_id in {s["run_id"] for s in steps}:
        mine = [s for s in steps if s["run_id"] == run_id]
        assert sum(int(s["sp_size"]) for s in mine) == 2
        assert all(float(s["measured_group_busy_s"]) <= float(s["measured_compute_time_s"]) + 1e-9 for s in mine)
        assert all(float(s["profiled_update_time_s"]) > 0 for s in mine)  # measured with the profile
    doc = json.loads((out / "config.json").read_text())
    assert set(doc["runs"]) == {r["run_id"] for r in rows}
    assert {d["config_hash"] for d in doc["runs"].values()} == {r["config_hash"] for r in rows}
    assert doc["sweep"]["name"] == "dist_test"
    # the bench needs these to tell runs whose ranks time-shared the cores
    assert all(d["pin_cpus"] is True and d["host_cpus"] >= 1 for d in doc["runs"].values())
    # and the host's load when each run ended and when its profile was taken
    assert all(d["load_avg_1m"] >= 0 and d["profile_load_avg_1m"] >= 0 for d in doc["runs"].values())
    with (out / "runs.csv").open() as f:
        assert tuple(next(csv.reader(f))) == RUN_COLUMNS
    # the profile was cached: a second sweep reuses it (its rows carry the same table source)
    assert list((tmp_path / "cache").glob("t1d-tiny-*-w2-*.csv"))
