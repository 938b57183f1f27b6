"""A sweep re-run never writes a finished run twice, also while rank processes of the killed sweep still append."""

from __future__ import annotations

import csv
import logging
import multiprocessing as mp
from pathlib import Path

from dcp.experiments.launch import _launch, claim_output
from dcp.experiments.results import RUN_COLUMNS, STEP_COLUMNS, write_results
from dcp.experiments.sweep import load_sweep

REPO = Path(__file__).resolve().parents[2]


def _outcome(run_id: str, method: str) -> dict:
    run = {c: 1 for c in RUN_COLUMNS} | {"run_id": run_id, "method": method}
    steps = [{c: 1 for c in STEP_COLUMNS} | {"run_id": run_id, "step": s} for s in range(4)]
    return {"run": run, "steps": steps, "config": {"method": method}}


def _write(out: Path, outcomes: list[dict]) -> None:
    write_results(out, [o["run"] for o in outcomes], [r for o in outcomes for r in o["steps"]],
                  sweep={"name": "t"}, run_configs={o["run"]["run_id"]: o["config"] for o in outcomes})


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_orphan_appending_after_the_rerun_started_leaves_one_row_per_run(tmp_path, caplog):
    spec = load_sweep(REPO / "experiments" / "cpu_small.toml", overrides={"out_dir": str(tmp_path / "out")})
    runs = spec.expand()[:3]
    out = spec.output_dir
    # the first launch: run 0 finished, then the parent was killed while its ranks ran run 1
    stamp, done = _launch(spec, claim_output(spec), runs, quiet=True)
    assert done == set()
    _write(out, [_outcome(f"{stamp}-000", runs[0].method)])
    # the re-run resumes the same launch: run 0 is done, so it runs 1 and 2
    again, done = _launch(spec, claim_output(spec), runs, quiet=True)
    assert (again, done) == (stamp, {0})
    # the orphaned rank of the killed sweep finishes run 1 now, from another process
    orphan = mp.get_context("spawn").Process(target=_write, args=(out, [_outcome(f"{stamp}-001", runs[1].method)]))
    orphan.start()
    orphan.join(60)
    assert orphan.exitcode == 0
    with caplog.at_level(logging.WARNING, logger="dcp"):
        _write(out, [_outcome(f"{stamp}-001", runs[1].method)])
        _write(out, [_outcome(f"{stamp}-002", runs[2].method)])
    ids = [r["run_id"] for r in _rows(out / "runs.csv")]
    assert ids == [f"{stamp}-000", f"{stamp}-001", f"{stamp}-002"]
    steps = [(r["run_id"], r["step"]) for r in _rows(out / "steps.csv")]
    assert len(steps) == len(set(steps)) == 12
    assert f"already holds run(s) {stamp}-001" in caplog.text and "dropped" in caplog.text


def _append_many(out: Path, who: str, n: int) -> None:
    for i in range(n):
        _write(out, [_outcome(f"{who}-{i:03d}", "bucket")])


def test_concurrent_writers_lose_no_row(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(tmp_path, who, 15)) for who in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ids = [r["run_id"] for r in _rows(tmp_path / "runs.csv")]
    assert sorted(ids) == sorted(f"{w}-{i:03d}" for w in "ab" for i in range(15))
