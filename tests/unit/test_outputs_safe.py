"""Nothing lost: atomic writes, output folders dcp owns, writability checked before work, truncated
files named, a sweep that resumes after its last finished run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dcp import files
from dcp.cli import main
from dcp.experiments.results import RUN_COLUMNS, ResultsError, read_runs, write_results

REPO = Path(__file__).resolve().parents[2]


def cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out + out.err


def unwritable_dir(tmp_path: Path) -> Path:
    """A folder no file can be created in, also for root (who ignores permission bits): /proc."""
    if os.getuid() == 0 or not hasattr(os, "getuid"):
        return Path("/proc")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    return d


# ----- atomic writes -----------------------------------------------------------------------------------
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "config.json"
    files.write_text(target, '{"old": 1}\n')

    def boom(tmp):
        tmp.write_text('{"half')  # a writer that dies mid-file (a full disk)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.write_with(target, boom)
    assert target.read_text() == '{"old": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_append_csv_rewrites_whole_and_refuses_a_cut_or_foreign_file(tmp_path):
    path = tmp_path / "runs.csv"
    files.append_csv(path, ("a", "b"), [{"a": 1, "b": 2}])
    files.append_csv(path, ("a", "b"), [{"a": 3, "b": 4}])
    assert path.read_text() == "a,b\n1,2\n3,4\n"
    path.write_text("a,b\n1,2\n3,")  # a full disk cut the last row
    with pytest.raises(files.OutputError, match=r"runs.csv.*is truncated: line 3 ends mid-row.*delete its last"):
        files.append_csv(path, ("a", "b"), [{"a": 5, "b": 6}])
    path.write_text("x,y\n1,2\n")
    with pytest.raises(files.OutputError, match=r"has columns \['x', 'y'\].*new --out folder"):
        files.append_csv(path, ("a", "b"), [{"a": 5, "b": 6}])
    assert path.read_text() == "x,y\n1,2\n"  # never overwritten


@pytest.mark.parametrize("text, needle", [
    ("", "is empty (0 bytes of JSON"),
    ('{"sweep": {"name": "t"}, "ru', "is truncated (it ends mid-document"),
    ("{oops}", "is not valid JSON"),
])
def test_read_json_names_the_file_and_says_it_is_truncated(tmp_path, text, needle):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(files.TruncatedFileError) as info:
        files.read_json(path, what="results config", fix="re-run it")
    msg = str(info.value)
    assert str(path) in msg and needle in msg and msg.endswith("re-run it")


# ----- output folders ----------------------------------------------------------------------------------
def test_claim_dir_takes_new_empty_and_marked_folders_and_refuses_foreign_ones(tmp_path):
    new = tmp_path / "new"
    assert files.claim_dir(new, flag="--out", command="dcp demo") == {}
    assert (new / files.MARKER).exists()
    (new / "reps.csv").write_text("x\n")
    assert files.claim_dir(new, flag="--out", command="dcp demo")["made_by"] == "dcp demo"  # marked: fine
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"my": "settings"}')
    with pytest.raises(files.OutputError, match=r"--out \(.*mine'\) is a non-empty folder that dcp did not make "
                                                r"\(it holds config.json\).*pass a new or empty folder"):
        files.claim_dir(foreign, flag="--out", command="dcp demo")
    assert (foreign / "config.json").read_text() == '{"my": "settings"}' and not (foreign / files.MARKER).exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(files.OutputError, match="is a file: pass a folder"):
        files.claim_dir(afile, flag="--out", command="dcp demo")


def test_claim_dir_and_check_writable_file_refuse_an_unwritable_place(tmp_path):
    ro = unwritable_dir(tmp_path)
    with pytest.raises(files.OutputError, match=r"--out .* is not writable"):
        files.claim_dir(ro / "sub", flag="--out", command="dcp sweep")
    with pytest.raises(files.OutputError, match=r"--out .* is not writable"):
        files.check_writable_file(ro / "table.csv", flag="--out")


def test_profile_out_on_an_unwritable_folder_fails_before_profiling(capsys, tmp_path):
    code, text = cli(capsys, "profile", "--out", str(unwritable_dir(tmp_path) / "t.csv"), "--edges", "32")
    assert code == 2 and "--out" in text and "is not writable" in text and "profile table:" not in text


def test_profile_is_cached_before_out_and_a_failing_out_names_where_it_is(capsys, tmp_path, monkeypatch):
    from dcp.planner.table import ProfileTable

    toml = tmp_path / "run.toml"
    toml.write_text(f'[profiling]\ncache_dir = "{tmp_path / "cache"}"\n'
                    "max_micro_batch_size = 1\n[advanced]\nwarmup_iters = 0\nmeasure_iters = 1\n")

    def full_disk(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ProfileTable, "save", full_disk)
    code, text = cli(capsys, "profile", "--config", str(toml), "--edges", "32", "--out", str(tmp_path / "t.csv"),
                     "--quiet")
    assert code == 2 and "--out" in text and "No space left on device" in text
    cached = next((tmp_path / "cache").glob("*.csv"))
    assert f"the table is kept at {cached}" in text and len(ProfileTable.load(cached)) >= 1


def test_demo_out_into_a_folder_of_the_users_files_is_refused_before_work(capsys, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"lr": 0.1}')
    code, text = cli(capsys, "demo", "--out", str(mine), "--samples", "16", "--reps", "1")
    assert code == 2 and "non-empty folder that dcp did not make" in text and "dcp demo: bucket" not in text
    assert (mine / "config.json").read_text() == '{"lr": 0.1}'


@pytest.mark.parametrize("name, content", [("config.json", '{"mine": true}'), ("runs.csv", "when,what\n1,2\n")])
def test_sweep_out_into_a_folder_with_a_foreign_file_is_refused_before_any_run(capsys, tmp_path, name, content):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text(content)
    code, text = cli(capsys, "sweep", str(REPO / "experiments" / "cpu_small.toml"), "--out", str(out))
    assert code == 2 and "non-empty folder that dcp did not make" in text and "==" not in text
    assert (out / name).read_text() == content


def test_an_unmarked_results_folder_of_an_older_dcp_is_adopted(tmp_path):
    from dcp.experiments.results import is_results_folder

    out = tmp_path / "old"
    write_results(out, [], [], sweep={"name": "t"}, run_configs={})
    assert is_results_folder(out)
    files.claim_dir(out, flag="--out", command="dcp sweep", adopt=is_results_folder)
    assert (out / files.MARKER).exists()


@pytest.mark.parametrize("cut", ["config", "runs"])
def test_a_truncated_results_file_is_named_with_the_fix(tmp_path, cut):
    row = {c: 1 for c in RUN_COLUMNS}
    write_results(tmp_path, [row], [], sweep={"name": "t"}, run_configs={"1": {}})
    if cut == "config":
        (tmp_path / "config.json").write_bytes(b"")
        needle = "config.json') is empty (0 bytes of JSON"
    else:
        text = (tmp_path / "runs.csv").read_text()
        (tmp_path / "runs.csv").write_text(text[:-5])
        needle = "runs.csv') is truncated: line 2 ends mid-row"
    with pytest.raises(ResultsError) as info:
        read_runs(tmp_path)
    assert needle in str(info.value)
    with pytest.raises(ResultsError):  # and the next sweep refuses to append to it, naming it the same way
        write_results(tmp_path, [row], [], sweep={"name": "t"}, run_configs={"2": {}})


# ----- a sweep resumes after its last finished run ----------------------------------------------------------
def _spec(tmp_path):
    from dcp.experiments.sweep import sweep_from_dict

    return sweep_from_dict({"sweep": {"name": "resume", "world_sizes": [2], "models": ["t1d-tiny"],
                                      "datasets": ["balanced"], "methods": ["bucket", "dcp-inter", "dcp-intra"],
                                      "steps": 1, "warmup_steps": 0, "num_samples": 16,
                                      "out_dir": str(tmp_path / "out")}})


def _fake_runner(log, fail_at=None, error=None):
    """Stands for run_distributed(run_group, ...): rank 0 writes each run's rows as it ends; the run with
    index ``fail_at`` dies (a killed rank), or raises ``error`` (e.g. Ctrl-C's KeyboardInterrupt)."""
    from dcp.distributed.launch import DistributedFailure
    from dcp.experiments.runner import save_outcomes

    def run(fn, w, group, info, **kw):
        outcomes = []
        for run_, index in zip(group, info.indices, strict=True):
            if index == fail_at:
                raise error or DistributedFailure("rank 1 exited with code -9 without reporting")
            log.append(index)
            row = {c: 1 for c in RUN_COLUMNS} | {"run_id": f"{info.stamp}-{index:03d}", "method": run_.method,
                                                 "config_hash": run_.config_hash()}
            outcomes.append({"run": row, "steps": [], "config": {"config_hash": run_.config_hash()}})
            save_outcomes(info.out_dir, run_.sweep.to_dict(), outcomes[-1:])
        return [outcomes, None]

    return run


def test_a_sweep_killed_in_its_second_run_keeps_the_first_and_resumes_after_it(tmp_path, monkeypatch, capsys):
    import dcp.distributed.launch as launcher
    from dcp.distributed.launch import DistributedFailure
    from dcp.experiments.launch import launch_local

    spec = _spec(tmp_path)
    log: list[int] = []
    monkeypatch.setattr(launcher, "run_distributed", _fake_runner(log, fail_at=1))
    with pytest.raises(DistributedFailure):
        launch_local(spec, quiet=True)
    first = read_runs(spec.output_dir)
    assert [r["method"] for r in first] == ["bucket"] and log == [0]
    monkeypatch.setattr(launcher, "run_distributed", _fake_runner(log))
    launch_local(spec)
    assert "resuming the unfinished sweep launch" in capsys.readouterr().out
    rows = read_runs(spec.output_dir)
    assert log == [0, 1, 2]  # run 0 was not run again
    assert [r["method"] for r in rows] == ["bucket", "dcp-inter", "dcp-intra"]
    assert rows[0]["run_id"] == first[0]["run_id"] and len({r["run_id"] for r in rows}) == 3
    assert json.loads((spec.output_dir / files.MARKER).read_text())["launch"]["complete"] is True
    launch_local(spec, quiet=True)  # a finished sweep started again is a new sweep launch: it appends 3 more runs
    assert log == [0, 1, 2, 0, 1, 2] and len(read_runs(spec.output_dir)) == 6


def test_a_finished_sweep_started_again_says_it_appends(tmp_path, monkeypatch, capsys):
    import dcp.distributed.launch as launcher
    from dcp.experiments.launch import launch_local

    spec = _spec(tmp_path)
    monkeypatch.setattr(launcher, "run_distributed", _fake_runner([]))
    launch_local(spec)
    assert "earlier launches" not in capsys.readouterr().out
    launch_local(spec)
    assert (f"{spec.output_dir / 'runs.csv'} holds 3 rows of earlier launches: this one appends its 3 runs, and the "
            "table and plot show each run's newest row") in capsys.readouterr().out
    assert len(read_runs(spec.output_dir)) == 6


def test_ctrl_c_in_a_sweep_says_where_the_finished_runs_are_and_resumes_after_them(tmp_path, monkeypatch, capsys):
    import dcp.distributed.launch as launcher

    toml = tmp_path / "resume.toml"
    toml.write_text('[sweep]\nname = "resume"\nworld_sizes = [2]\nmodels = ["t1d-tiny"]\ndatasets = ["balanced"]\n'
                    'methods = ["bucket", "dcp-inter", "dcp-intra"]\nsteps = 1\nwarmup_steps = 0\nnum_samples = 16\n'
                    f'out_dir = "{tmp_path / "out"}"\n')
    log: list[int] = []
    monkeypatch.setattr(launcher, "run_distributed", _fake_runner(log, fail_at=1, error=KeyboardInterrupt()))
    code, text = cli(capsys, "sweep", str(toml))
    assert code == 130, text
    assert f"dcp sweep: interrupted: the finished runs' results are in {tmp_path / 'out'}; the same command resumes" in text
    assert "Traceback" not in text and [r["method"] for r in read_runs(tmp_path / "out")] == ["bucket"]
    monkeypatch.setattr(launcher, "run_distributed", _fake_runner(log))
    code, text = cli(capsys, "sweep", str(toml))
    assert code == 0 and log == [0, 1, 2]  # the same command ran only the two unfinished runs


def test_a_failed_job_is_summed_up_in_one_line_naming_the_rank_and_its_phase():
    from dcp.distributed.launch import DistributedFailure

    text = ("rank 1 exited with code 3 without reporting\nrank 0 of 2 failed:\nTraceback (most recent call last):\n"
            '  File "x.py", line 1, in <module>\nRuntimeError: Connection closed by peer\n\nThe above exception ...\n'
            "dcp.runtime.phases.CollectiveError: rank 0: profiling seq_group 0 (s=128) b=1 p=2 failed after 0.1 s: "
            "rank 1 is in 'profiling seq_group 0 (s=128) b=1 p=2' (since 0.2 s) and its heartbeat stopped\n")
    line = DistributedFailure(text).summary()
    assert line == ("rank 0 of 2 failed: CollectiveError: rank 0: profiling seq_group 0 (s=128) b=1 p=2 failed after "
                    "0.1 s: rank 1 is in 'profiling seq_group 0 (s=128) b=1 p=2' (since 0.2 s) and its heartbeat "
                    "stopped; rank 1 exited with code 3 without reporting")
    assert "\n" not in DistributedFailure("ranks [1] of 2 did not finish within 5 s").summary()


def test_figures_and_parity_refuse_a_folder_of_the_users_files_before_work(capsys, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "steps.csv").write_text("when,what\n")
    code, text = cli(capsys, "figures", "--quick", "--only", "fig4", "--out", str(mine))
    assert code == 2 and "non-empty folder that dcp did not make" in text
    pytest.importorskip("pandas")
    code, text = cli(capsys, "parity", "--out", str(mine))
    assert code == 2 and "non-empty folder that dcp did not make" in text
    assert (mine / "steps.csv").read_text() == "when,what\n" and sorted(p.name for p in mine.iterdir()) == ["steps.csv"]


def test_the_committed_figures_folder_is_adopted(tmp_path):
    from dcp.figures import _only_figures

    (tmp_path / "fig4_imbalance.png").write_bytes(b"x")
    (tmp_path / "fig10_intra_speedup.csv").write_text("a\n")
    assert _only_figures(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert not _only_figures(tmp_path)


def test_bench_planner_bounds_its_world_sizes(capsys):
    code, text = cli(capsys, "bench", "planner", "--world-sizes", "8,100000000000")
    assert code == 2 and "--world-sizes ('8,100000000000') must be integers in [1, 131,072]" in text


def test_readers_name_an_unreadable_or_empty_file(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(files.TruncatedFileError, match=r"config.json'\) cannot be read"):
        files.read_json(tmp_path / "config.json", what="results config")
    (tmp_path / "runs.csv").write_text("")
    with pytest.raises(files.TruncatedFileError, match=r"runs.csv'\) is empty \(0 bytes"):
        files.read_csv_text(tmp_path / "runs.csv", what="results file")
