"""End to end: a 2-step sweep on 2 gloo processes through the manager writes consistent result files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dcp.experiments.launch import launch_local
from dcp.experiments.results import RUN_COLUMNS, STEP_COLUMNS, read_runs
from dcp.experiments.sweep import sweep_from_dict


def _spec(tmp_path, executor: str, engine: str = "ddp"):
    raw = {
        "sweep": {"name": "dist_test", "world_sizes": [2], "models": ["t1d-tiny"], "datasets": ["balanced"],
                  "methods": ["bucket", "dcp-intra"], "steps": 1, "warmup_steps": 1, "num_samples": 64,
                  "scale": "cpu", "executor": executor, "out_dir": str(tmp_path / "out"),
                  "pin_cpus": executor == "manager"},
        "config": {
            # a quick profile: few candidates, one measurement each
            "profiling": {"seq_group_edges": [256, 1024, 2048], "max_micro_batch_size": 2,
                          "cache_dir": str(tmp_path / "cache")},
            "advanced": {"warmup_iters": 0, "measure_iters": 1},
            "planning": {"mem_capacity_gib": 0.016, "sp_sizes": [1, 2], "ranks_per_node": 2},
            "runtime": {"attention": "sdpa", "log_every": 1000, "engine": engine},
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
        # one measured step: its tokens are the min, median and max; no planning.tokens_per_step set
        assert r["tokens_per_step_min"] == r["tokens_per_step_median"] == r["tokens_per_step_max"] == r["tokens"]
        assert r["target_tokens_per_step"] == 0
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


@pytest.mark.dist
def test_a_sweep_and_the_demo_run_under_the_fsdp2_engine(tmp_path, capsys):
    spec = _spec(tmp_path, "manager", engine="fsdp2")
    assert len(launch_local(spec, quiet=True)) == 2
    rows = read_runs(spec.output_dir)
    assert [r["method"] for r in rows] == ["bucket", "dcp-intra"] and all(r["tokens_per_s"] > 0 for r in rows)
    doc = json.loads((spec.output_dir / "config.json").read_text())
    assert {d["config"]["runtime"]["engine"] for d in doc["runs"].values()} == {"fsdp2"}
    from dcp.cli import main

    assert main(["demo", "--engine", "fsdp2", "--reps", "1", "--samples", "8", "--out", str(tmp_path / "demo")]) == 0
    assert "runtime.engine fsdp2" in capsys.readouterr().out
    assert json.loads((tmp_path / "demo" / "config.json").read_text())["settings"]["config"]["runtime"]["engine"] == "fsdp2"


def _rank_processes(parent: int) -> list[int]:
    """Pids of the spawned rank processes of ``parent`` (multiprocessing's resource tracker excluded)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == parent and "spawn_main" in cmd and "resource_tracker" not in cmd:
            out.append(int(stat.parent.name))
    return sorted(out)


@pytest.mark.dist
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the rank processes through /proc")
def test_a_sweep_killed_in_its_second_run_keeps_the_first_and_a_rerun_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    spec_file = tmp_path / "sweep.toml"
    spec_file.write_text(
        '[sweep]\nname = "killed"\nworld_sizes = [2]\nmodels = ["t1d-tiny"]\ndatasets = ["balanced"]\n'
        'methods = ["bucket", "dcp-intra"]\nsteps = 1\nwarmup_steps = 0\nnum_samples = 32\nscale = "cpu"\n'
        f'out_dir = "{tmp_path / "out"}"\n'
        f'[config.profiling]\nseq_group_edges = [256, 1024, 2048]\nmax_micro_batch_size = 1\n'
        f'cache_dir = "{tmp_path / "cache"}"\n[config.advanced]\nwarmup_iters = 0\nmeasure_iters = 1\n'
        '[config.planning]\nmem_capacity_gib = 0.016\nsp_sizes = [1, 2]\nranks_per_node = 2\n'
        '[config.runtime]\nattention = "sdpa"\nlog_every = 1000\n')
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "dcp.cli", "sweep", str(spec_file)]
    runs_csv = tmp_path / "out" / "runs.csv"
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not runs_csv.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = _rank_processes(proc.pid)
    assert runs_csv.exists() and len(ranks) == 2, proc.communicate(timeout=60)[0][-3000:]
    os.kill(ranks[-1], signal.SIGKILL)  # one rank of the second run
    text = proc.communicate(timeout=240)[0]
    assert proc.returncode != 0, text[-3000:]
    assert "a run failed (the finished runs' results are in" in text and "exited with code -9" in text, text[-3000:]
    first = read_runs(tmp_path / "out")
    assert [r["method"] for r in first] == ["bucket"]  # the finished first run was kept
    again = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert "resuming the unfinished sweep launch" in again.stdout and "1 of 2 runs are already in" in again.stdout
    rows = read_runs(tmp_path / "out")
    assert [r["method"] for r in rows] == ["bucket", "dcp-intra"] and rows[0]["run_id"] == first[0]["run_id"]
