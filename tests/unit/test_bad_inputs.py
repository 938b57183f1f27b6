"""The catalogue of bad inputs: every case is one clear error naming the field or file (exit 2 and
no traceback for the CLI), or a handled outcome; none silent, none hanging. Add a row for every new probe."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dcp.cli import main

UTF8_BOM = "\ufeff"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``dcp ARGV`` (argparse's own errors exit through SystemExit)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_clear(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dcp ")]
    assert len(lines) == 1, err  # one line says what is wrong (after argparse's usage lines, if any)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def files(tmp_path):
    """Bad files of every kind, by name."""
    out = {"dir": tmp_path}
    for name, data in {
        "non_utf8.toml": b"[planning]\ngmax = 4\n# \xff\xfe\n",
        "bom.toml": (UTF8_BOM + "[planning]\ngmax = 3\n").encode(),
        "inf_mem.toml": b"[planning]\nmem_capacity_gib = inf\n",
        "nan_mem.toml": b"[planning]\nmem_capacity_gib = nan\n",
        "inf_timeout.toml": b"[advanced]\nplan_check_timeout_s = inf\n",
        "zero_collective.toml": b"[runtime]\ncollective_timeout_s = 0\n",
        "huge_gmax.toml": b"[planning]\ngmax = 4611686018427387904\n",
        "huge_edge.toml": b"[profiling]\nseq_group_edges = [512, 9223372036854775807]\n",
        "bool_gmax.toml": b"[planning]\ngmax = true\n",
        "bad_toml.toml": b"[planning\n",
    }.items():
        path = tmp_path / name
        path.write_bytes(data)
        out[name] = path
    return out


# ----- dcp profile: flags and config are parsed inside its error handling ----------------------------------
@pytest.mark.parametrize("argv, needles", [
    (["--nproc", "0"], ["--nproc", "'0'", ">= 1"]),
    (["--nproc", "-2"], ["--nproc", ">= 1"]),
    (["--nproc", "two"], ["--nproc", "not an integer"]),
    (["--edges", "abc"], ["--edges", "'abc'"]),
    (["--edges", "256,,512"], ["--edges"]),
    (["--edges", "1" * 20], ["--edges", "beyond"]),
    (["--mem-capacity-gib", "0"], ["--mem-capacity-gib", "> 0"]),
    (["--mem-capacity-gib", "inf"], ["--mem-capacity-gib", "finite"]),
    (["--mem-capacity-gib", "nan"], ["--mem-capacity-gib", "finite"]),
    (["--mem-capacity-gib", "0.000001"], ["planning.mem_capacity_gib", "constant memory"]),
    (["--config", "/nonexistent/run.toml"], ["/nonexistent/run.toml", "does not exist"]),
    (["--edges", "512,256"], ["profiling.seq_group_edges", "strictly increasing"]),
])
def test_profile_flag_errors_are_one_line(capsys, argv, needles):
    code, _, err = cli(capsys, "profile", *argv, "--print-config")
    assert_clear(code, err, *needles)


@pytest.mark.parametrize("name, needles", [
    ("dir", ["is a directory"]),
    ("non_utf8.toml", ["non_utf8.toml", "line 3", "not UTF-8"]),
    ("inf_mem.toml", ["planning.mem_capacity_gib", "inf", "finite"]),
    ("nan_mem.toml", ["planning.mem_capacity_gib", "nan", "finite"]),
    ("inf_timeout.toml", ["advanced.plan_check_timeout_s", "finite"]),
    ("zero_collective.toml", ["runtime.collective_timeout_s", "> 0"]),
    ("huge_gmax.toml", ["planning.gmax", "beyond 65536"]),
    ("huge_edge.toml", ["profiling.seq_group_edges", "beyond"]),
    ("bool_gmax.toml", ["planning.gmax", "True"]),
    ("bad_toml.toml", ["bad_toml.toml", "not valid TOML"]),
])
def test_config_file_errors_name_the_file_or_field(capsys, files, name, needles):
    for command in (["profile", "--print-config"], ["plan", "--synthetic", "50"], ["simulate", "--print-config"]):
        code, _, err = cli(capsys, *command[:1], "--config", str(files[name]), *command[1:])
        assert_clear(code, err, *needles)


def test_a_pipelined_clock_is_refused_before_any_process_starts(capsys, tmp_path):
    # dcp profile runs CPU processes: the CUDA-only clock fails in the parent, one line, for any --nproc
    path = tmp_path / "run.toml"
    path.write_text('[advanced]\nclock = "pipelined"\n')
    for nproc in ("1", "2"):
        code, _, err = cli(capsys, "profile", "--config", str(path), "--nproc", nproc, "--print-config")
        assert_clear(code, err, "advanced.clock ('pipelined') needs a CUDA device", 'clock = "auto"')


def test_a_config_with_a_bom_is_read(capsys, files):
    code, out, err = cli(capsys, "profile", "--config", str(files["bom.toml"]), "--print-config")
    assert code == 0 and '"gmax": 3' in out, err


def test_profile_out_must_be_a_writable_file_path_before_profiling(capsys, tmp_path):
    code, _, err = cli(capsys, "profile", "--out", str(tmp_path), "--edges", "32")
    assert_clear(code, err, "--out", "is a directory")
    code, _, err = cli(capsys, "profile", "--out", str(tmp_path / "missing" / "t.csv"), "--edges", "32")
    assert_clear(code, err, "--out", "does not exist")


# ----- dcp plan / simulate: counts, tables, lengths files -------------------------------------------------
@pytest.mark.parametrize("argv, needles", [
    (["plan", "--world-size", "0"], ["--world-size", ">= 1"]),
    (["plan", "--synthetic", "0"], ["--synthetic", ">= 1"]),
    (["plan", "--synthetic", "-5"], ["--synthetic", ">= 1"]),
    (["plan", "--epoch", "-1"], ["--epoch", ">= 0"]),
    (["plan", "--table", "/nonexistent/t.csv"], ["/nonexistent/t.csv", "does not exist"]),
    (["plan", "--lengths", "/nonexistent/l.csv"], ["/nonexistent/l.csv", "does not exist"]),
    (["simulate", "--gpus", "0"], ["--gpus", ">= 1"]),
    (["simulate", "--num-samples", "0", "--dataset", "t1d-short"], ["--num-samples", ">= 1"]),
    (["simulate", "--gmax", "0"], ["--gmax", ">= 1"]),
    (["simulate", "--lookahead-per-rank", "-1"], ["--lookahead-per-rank", ">= 0"]),
    (["simulate", "--table", "/nonexistent/t.csv", "--dataset", "t1d-short", "--num-samples", "50"],
     ["/nonexistent/t.csv", "does not exist"]),
])
def test_count_and_path_flags(capsys, argv, needles):
    code, _, err = cli(capsys, *argv)
    assert_clear(code, err, *needles)


def test_a_table_that_is_a_directory_or_not_a_table(capsys, tmp_path):
    code, _, err = cli(capsys, "plan", "--table", str(tmp_path), "--synthetic", "50")
    assert_clear(code, err, str(tmp_path), "is a directory")
    bad = tmp_path / "t.csv"
    bad.write_bytes(b"\xff\xfe garbage")
    code, _, err = cli(capsys, "plan", "--table", str(bad), "--synthetic", "50")
    assert_clear(code, err, str(bad), "not UTF-8")


LENGTHS = {
    "underscore.csv": ("tokens\n100\n1_000\n", ["underscore.csv:3", "'1_000'", "ASCII digits"]),
    "non_ascii.csv": ("tokens\n100\n\u0663\u0660\u0660\n", ["non_ascii.csv:3", "ASCII digits"]),
    "float.csv": ("tokens\n5.7\n3.2\n", ["float.csv:2", "'5.7'", "not an integer"]),
    "nan.csv": ("tokens\n100\nNaN\n", ["nan.csv:3", "'NaN'"]),
    "headerless_underscore.csv": ("1_000\n200\n", ["headerless_underscore.csv:1", "'1_000'"]),
    "headerless_float.csv": ("5.7\n3.2\n", ["headerless_float.csv:1", "'5.7'"]),
    "twenty_digits.csv": ("tokens\n" + "9" * 20 + "\n", ["twenty_digits.csv:2", "beyond"]),
    "zero.csv": ("tokens\n0\n", ["zero.csv:2", ">= 1"]),
    "negative.csv": ("tokens\n-4\n", ["negative.csv:2", ">= 1"]),
    "empty.csv": ("", ["empty.csv", "empty"]),
    "header_only.csv": ("tokens\n", ["header_only.csv", "no rows"]),
}


@pytest.mark.parametrize("name", list(LENGTHS))
def test_lengths_files_are_ascii_integers_named_by_file_and_line(capsys, tmp_path, name):
    text, needles = LENGTHS[name]
    path = tmp_path / name
    path.write_text(text)
    for command in ("plan", "simulate"):
        code, _, err = cli(capsys, command, "--lengths", str(path))
        assert_clear(code, err, *needles)


def test_lengths_file_encoding_and_kind(capsys, tmp_path):
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"tokens\n100\n\xe9\n")
    code, _, err = cli(capsys, "plan", "--lengths", str(bad))
    assert_clear(code, err, "latin1.csv", "line 3", "not UTF-8")
    code, _, err = cli(capsys, "plan", "--lengths", str(tmp_path))
    assert_clear(code, err, str(tmp_path), "is a directory")
    bom = tmp_path / "bom.csv"
    bom.write_text(UTF8_BOM + "tokens\n100\n200\n")
    code, out, err = cli(capsys, "plan", "--lengths", str(bom), "--steps", "0")
    assert code == 0 and "samples=2" in out, err


# ----- dcp sweep ------------------------------------------------------------------------------------------
SWEEP = '[sweep]\nname = "probe"\nmodels = ["t1d-tiny"]\nmethods = ["dcp-intra"]\n'


def test_sweep_without_a_name_is_a_clear_error(capsys, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[sweep]\nworld_sizes = [2]\n")
    code, out, err = cli(capsys, "sweep", str(path), "--dry-run")
    assert code == 2 and "sweep.name (missing) is required" in out + err and "Traceback" not in out + err


def test_sweep_on_cpu_refuses_the_pipelined_clock(capsys, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP + '[config.advanced]\nclock = "pipelined"\n')
    code, out, err = cli(capsys, "sweep", str(path), "--dry-run")
    assert code == 2 and "advanced.clock ('pipelined') needs sweep.device = 'cuda'" in out + err
    assert "Traceback" not in out + err


def test_sweep_dry_run_warns_about_cores_and_cuda_and_refuses_a_file_as_output(capsys, tmp_path, monkeypatch):
    import os

    import torch

    path = tmp_path / "s.toml"
    path.write_text(SWEEP + "world_sizes = [2, 64]\n")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    code, out, err = cli(capsys, "sweep", str(path), "--dry-run", "--out", str(tmp_path / "res"))
    assert code == 0 and "warning: sweep.world_sizes [64]" in err and "2 cores" in err
    path.write_text(SWEEP + 'device = "cuda"\nbackend = "nccl"\n')
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = cli(capsys, "sweep", str(path), "--dry-run", "--out", str(tmp_path / "res"))
    assert code == 0 and "warning: sweep.device is 'cuda' but CUDA is not available" in err
    taken = tmp_path / "passwd"
    taken.write_text("root:x:0:0\n")
    code, out, err = cli(capsys, "sweep", str(path), "--dry-run", "--out", str(taken))
    assert code == 2 and "sweep.out_dir" in out + err and "existing file" in out + err
    assert taken.read_text() == "root:x:0:0\n"
    code, _, err = cli(capsys, "sweep", str(path), "--dry-run", "--world-sizes", "abc")
    assert_clear(code, err, "--world-sizes", "'abc'")
    code, _, err = cli(capsys, "sweep", str(path), "--dry-run", "--world-sizes", "0")
    assert_clear(code, err, "--world-sizes", ">= 1")


def test_sweep_file_that_is_a_directory_or_not_utf8(capsys, tmp_path):
    code, out, err = cli(capsys, "sweep", str(tmp_path), "--dry-run")
    assert code == 2 and "is a directory" in out + err
    bad = tmp_path / "s.toml"
    bad.write_bytes(b'[sweep]\nname = "\xff"\n')
    code, out, err = cli(capsys, "sweep", str(bad), "--dry-run")
    assert code == 2 and "not UTF-8" in out + err and str(bad) in out + err


# ----- Python API ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    ({"mem_capacity_gib": math.inf}, "planning.mem_capacity_gib (inf) must be a finite number"),
    ({"mem_capacity_gib": math.nan}, "planning.mem_capacity_gib (nan) must be a finite number"),
    ({"gmax": 2**62}, "planning.gmax (4611686018427387904) is beyond 65536"),
    ({"gmin": 2.5}, "planning.gmin (2.5) must be an integer"),
    ({"sp_sizes": (1, 2.0)}, "planning.sp_sizes ((1, 2.0)) must be a list of integers"),
    ({"seed": -1}, "planning.seed (-1) must be >= 0"),
])
def test_planning_config_values(kwargs, needle):
    from dcp.config import ConfigError, PlanningConfig

    with pytest.raises(ConfigError) as info:
        PlanningConfig(**kwargs)
    assert needle in str(info.value)


@pytest.mark.parametrize("cls, kwargs, needle", [
    ("AdvancedConfig", {"plan_check_timeout_s": math.inf}, "advanced.plan_check_timeout_s (inf) must be a finite"),
    ("RuntimeConfig", {"collective_timeout_s": -1.0}, "runtime.collective_timeout_s (-1.0) must be > 0"),
    ("AdvancedConfig", {"check_plan_hash": 1}, "advanced.check_plan_hash (1) must be true or false"),
    ("ProfilingConfig", {"seq_group_edges": (512, 10**20)}, "profiling.seq_group_edges ([512, "),
    ("ProfilingConfig", {"seq_group_edges": (512.0,)}, "must be a list of integers"),
    ("ModelShapeConfig", {"num_layers": True}, "model.num_layers (True) must be an integer"),
])
def test_section_values(cls, kwargs, needle):
    import dcp.config as config

    with pytest.raises(config.ConfigError) as info:
        getattr(config, cls)(**kwargs)
    assert needle in str(info.value)


def test_dcp_config_sections_must_be_section_objects():
    from dcp.config import DCPConfig

    with pytest.raises(TypeError, match=r"DCPConfig.planning \(\{'gmax': 2\}\) must be a PlanningConfig"):
        DCPConfig(planning={"gmax": 2})


@pytest.mark.parametrize("lengths, needle", [
    ([5.7, 3.2], "[0] (5.7) is not an integer"),
    ([100, math.nan], "[1] (nan) is not an integer"),
    ([100, 10**20], "[1] (100000000000000000000) must be in [1, 1099511627776]"),
    ([True, 5], "[0] (True) is not an integer"),
    (["100"], "[0] ('100') is not an integer"),
    ([], "is empty"),
    (np.array([100, 0, 7]), "[1] (0) must be in [1, 1099511627776]"),
    (np.array([5, 2**41], dtype=np.int64), "[1] (2199023255552) must be in [1, 1099511627776]"),
    (np.array([], dtype=np.int64), "is empty"),
])
def test_check_lengths(lengths, needle):
    from dcp.planner.lengths import check_lengths

    with pytest.raises(ValueError) as info:
        check_lengths(lengths, what="dataset.lengths()")
    assert needle in str(info.value)


def test_check_lengths_takes_plain_and_numpy_ints_alike():
    from dcp.planner.lengths import check_lengths

    for ok in ([3, 4], [3, np.int64(4)], np.array([3, 4]), (3, 4)):
        out = check_lengths(ok)
        assert out == [3, 4] and all(type(v) is int for v in out)
    assert check_lengths([], allow_empty=True) == []


def test_the_planner_refuses_non_integer_lengths():
    from dcp.config import DCPConfig
    from dcp.planner.analytic import analytic_table_for
    from dcp.planner.assemble import EpochPlanner
    from dcp.planner.stream import PlanningError

    table = analytic_table_for(DCPConfig(), 2)
    for bad, needle in (([5.7, 3.2], "(5.7) is not an integer"), ([100, 10**20], "must be in")):
        with pytest.raises(PlanningError) as info:
            EpochPlanner(bad, table, DCPConfig(), 2)
        assert needle in str(info.value)


class _Data:
    def __init__(self, lengths):
        self._lengths = lengths

    def __len__(self):
        return len(self._lengths)

    def __getitem__(self, i):
        return i

    def lengths(self):
        return self._lengths

    def collate(self, samples):
        return samples


@pytest.mark.parametrize("case, error, needle", [
    ("config-dict", TypeError, "config (dict) must be a dcp.DCPConfig: build it with dcp.config.config_from_dict"),
    ("table-str", TypeError, "table (str) must be a ProfileTable: load it with"),
    ("model-none", TypeError, "model (NoneType) must be a torch.nn.Module"),
    ("empty-dataset", ValueError, "dataset.lengths() is empty"),
    ("float-lengths", ValueError, "dataset.lengths()[0] (5.7) is not an integer"),
    ("launched-no-group", ValueError, "WORLD_SIZE is 2 (a launcher such as torchrun started 2 processes) but "
                                        "torch.distributed is not initialised"),
])
def test_set_manager_arguments(case, error, needle, monkeypatch):
    import torch

    from dcp.api import set_manager
    from dcp.models import build_model

    model = build_model("t1d-tiny")
    args = {"model": model, "dataset": _Data([64, 32]), "config": None, "table": None}
    if case == "config-dict":
        args["config"] = {"planning": {"gmax": 2}}
    elif case == "table-str":
        args["table"] = "table.csv"
    elif case == "model-none":
        args["model"] = None
    elif case == "empty-dataset":
        args["dataset"] = _Data([])
    elif case == "float-lengths":
        args["dataset"] = _Data([5.7, 3.2])
    elif case == "launched-no-group":
        monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's environment, init_process_group() forgotten
    with pytest.raises(error) as info:
        set_manager(args["model"], args["dataset"], args["config"], table=args["table"],
                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert needle in str(info.value)


def test_profile_with_an_unwritable_cache_folder_keeps_the_table(capsys, tmp_path, monkeypatch):
    from dcp.planner.table import ProfileTable
    from dcp.profiler import cache

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")  # cache_dir below a file: no folder can be made there, even as root
    toml = tmp_path / "run.toml"
    toml.write_text(f'[profiling]\ncache_dir = "{blocker / "cache"}"\n'
                    "max_micro_batch_size = 1\n[advanced]\nwarmup_iters = 0\nmeasure_iters = 1\n")
    monkeypatch.setattr(cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    out = tmp_path / "table.csv"
    with pytest.warns(cache.CacheWriteWarning, match="is not writable"):
        code, stdout, err = cli(capsys, "profile", "--config", str(toml), "--edges", "32", "--out", str(out),
                                "--quiet")
    assert code == 0, err
    assert len(ProfileTable.load(out)) >= 1  # --out was written
    spare = next((tmp_path / "tmp").rglob("*.csv"))
    assert f"table: {spare}" in stdout and ProfileTable.load(spare).rows == ProfileTable.load(out).rows


@pytest.mark.parametrize("argv, needles", [
    (["bench", "runtime", "--steps", "0"], ["--steps (0) must be >= 1"]),
    (["bench", "runtime", "--rounds", "-1"], ["--rounds (-1) must be >= 1"]),
    (["bench", "runtime", "--mb-size", "0"], ["--mb-size (0) must be >= 1"]),
    (["bench", "runtime", "--mb-size", "60", "--ga-steps", "2"], ["--mb-size x --ga-steps (120) must be <= 100"]),
    (["bench", "planner", "--steps", "0"], ["--steps (0) must be >= 1"]),
    (["bench", "profiler", "--nproc", "0"], ["--nproc: '0' must be >= 1"]),
])
def test_bench_count_flags(capsys, argv, needles):
    code, out, err = cli(capsys, *argv)
    assert_clear(code, err, *needles)  # on stderr (dcp bench planner printed its errors on stdout)


@pytest.mark.parametrize("body, needle", [
    ("tier_edges_tokens = [64, true]\nattention_crossover_tokens = 512\n", "tier_edges_tokens"),
    ("tier_edges_tokens = [64, 99999999999999999999]\nattention_crossover_tokens = 512\n", "tier_edges_tokens"),
    ("tier_edges_tokens = [64, 128]\nattention_crossover_tokens = 512\nround_tokens = 2.5\n", "round_tokens (2.5)"),
    ("tier_edges_tokens = [64, 128]\nattention_crossover_tokens = 5e2\n", "attention_crossover_tokens (500.0)"),
])
def test_distribution_grids_are_strict(tmp_path, body, needle):
    from dcp.data_dists import DistributionError, load_grid_scale

    (tmp_path / "grids.toml").write_text(f'[t1d]\ndims = "1d"\n[t1d.cpu]\n{body}')
    with pytest.raises(DistributionError) as info:
        load_grid_scale("t1d", "cpu", tmp_path)
    assert needle in str(info.value) and "grids.toml" in str(info.value)


def test_distribution_spec_file_not_utf8_names_the_file(tmp_path):
    from dcp.data_dists import DistributionError, get_spec

    (tmp_path / "mine.toml").write_bytes(b'name = "mine"\ndescription = "\xe9"\n')
    with pytest.raises(DistributionError, match=r"mine.toml'\) line 2 is not UTF-8"):
        get_spec("mine", tmp_path)


def test_sweep_results_files_are_named(capsys, tmp_path):
    from dcp.experiments.results import RUN_COLUMNS, ResultsError, read_runs

    for name, runs in (("latin1", b"a,b\n\xe9\n"), ("dir", None)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        if runs is None:
            (folder / "runs.csv").mkdir()
        else:
            (folder / "runs.csv").write_bytes(runs)
        code, out, err = cli(capsys, "sweep", "--plot", str(folder))
        assert code == 2 and str(folder / "runs.csv") in out + err
        assert ("not UTF-8" if runs else "is a directory") in out + err
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "config.json").write_text("{}")
    row = ["x" if c in ("world_size", "tokens") else "1" for c in RUN_COLUMNS]
    (edited / "runs.csv").write_text(",".join(RUN_COLUMNS) + "\n" + ",".join(row) + "\n")
    with pytest.raises(ResultsError, match=r"runs.csv:2: column \w+ \('x'\) is not a number"):
        read_runs(edited)
