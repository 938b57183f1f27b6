"""``dcp simulate`` and ``dcp bench simulator`` through their own parsers."""

from __future__ import annotations

import argparse
import json

import pytest

from dcp.bench import sim as bench
from dcp.data_dists import load_distribution
from dcp.planner.analytic import CPU_SMALL
from dcp.sim import cli


def _run(module, argv):
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # a bad flag value: argparse's one-line error, exit 2
        return exc.code
    return module.run(args)


def test_simulate_dataset_json(capsys):
    rc = _run(cli, ["--dataset", "t1d-balanced", "--num-samples", "400", "--gpus", "8", "--method", "dcp-intra",
                    "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    last = json.loads(out[-1])
    assert {"tokens_per_s", "idle_ratio", "ideal_fraction"} <= set(last)
    assert last["tokens_per_s"] > 0 and 0 <= last["idle_ratio"] <= 1 and 0 < last["ideal_fraction"] <= 1
    assert any(line.startswith("dcp-intra") for line in out)


def test_simulate_states_the_default_batch_it_planned_at(capsys):
    """No batch set: the line names the default batch every method was held to, and the steps hold about it."""
    rc = _run(cli, ["--dataset", "text", "--num-samples", "400", "--gpus", "8", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    (line,) = [x for x in out if x.startswith("# global batch: ")]
    tokens = int(line.split()[3].replace(",", ""))
    assert "(default:" in line and "tokens per step" in line
    assert 0.5 * tokens <= json.loads(out[-1])["tokens_per_step_median"] <= 2 * tokens


@pytest.mark.parametrize("method", ["megatron-dyncp", "flexsp"])
def test_simulate_a_peer_at_a_global_batch(capsys, method):
    rc = _run(cli, ["--dataset", "text", "--num-samples", "400", "--gpus", "8", "--method", method,
                    "--tokens-per-step", "20000", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    last = json.loads(out[-1])
    lens = load_distribution("text", num_samples=400, seed=0)  # steps: the epoch's tokens / the batch
    # one 88k-token document takes a step alone (> 2 x the batch): fewer steps than tokens / batch
    assert (sum(lens) - max(lens)) / 40000 <= last["num_steps"] <= sum(lens) / 20000 and 0 < last["ideal_fraction"] <= 1
    assert 0.5 * 20000 <= last["tokens_per_step_min"] <= last["tokens_per_step_median"] <= last["tokens_per_step_max"]
    # within 2 x the batch, but for a step holding one sample longer than that alone
    assert last["tokens_per_step_max"] <= max(2 * 20000, max(lens)) and (
        "# global batch: 20,000 tokens per step (planning.tokens_per_step)" in out)


def test_simulate_lengths_file_all_methods(tmp_path, capsys):
    f = tmp_path / "l.csv"
    f.write_text("frames,spatial_tokens\n" + "16,144\n51,880\n204,3600\n" * 40)
    rc = _run(cli, ["--lengths", str(f), "--model", "t2d-1.2b", "--hardware", "h100", "--gpus", "8",
                    "--method", "all", "--json"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert set(last["methods"]) == {"bucket", "packed", "dcp-inter", "dcp-intra", "bucket-search"}
    # DCP's speedup is reported over the stronger of the two bucket baselines
    base = max(("bucket", "bucket-search"), key=lambda m: last["methods"][m]["tokens_per_s"])
    assert any(line.startswith(f"# speedup over {base}: dcp-inter") for line in out)
    # the table's columns line up under its header, bucket-search's row too
    header = next(line for line in out if line.startswith("method "))
    rows = [line for line in out if line.split(" ", 1)[0] in last["methods"]]
    end = header.index("steps") + len("steps")
    assert len(rows) == 5 and all(r[:end].split()[-1].isdigit() and r[end] == " " for r in rows), [header, *rows]


def test_simulate_without_lengths_uses_the_balanced_mix_and_says_so(capsys):
    # the control-plane check at scale is `dcp simulate --gpus 4096 --json`: no lengths given
    assert _run(cli, ["--gpus", "64", "--num-samples", "2000", "--json"]) == 0
    cap = capsys.readouterr()
    assert "simulating --dataset t1d-balanced (2000 samples)" in cap.err
    assert json.loads(cap.out.strip().splitlines()[-1])["control_plane_share"] >= 0.0


def test_the_default_epoch_grows_with_the_gpus_from_32_on(monkeypatch):
    # an epoch must hold many of DCP's steps, whose size grows with the GPUs: 20k samples up to 32 GPUs, then
    # 625 per GPU (at 4096 GPUs 40 per GPU made 3 steps and 0.43 of the ideal bound)
    import argparse

    import dcp.data_dists

    drawn = []
    monkeypatch.setattr(dcp.data_dists, "load_lengths",
                        lambda dataset, *, scale, num_samples, seed: drawn.append(num_samples))
    for gpus in (8, 32, 64, 4096):
        cli._lengths(argparse.Namespace(lengths=None, dataset=None, num_samples=None, gpus=gpus, scale="paper",
                                        seed=0, model="t1d-5b"))
    assert drawn == [20000, 20000, 40000, 2560000]


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--dataset", "nope"], "is not known"),
        (["--dataset", "t1d-short", "--gpus", "0"], "--gpus"),
        (["--dataset", "t1d-short", "--lookahead-per-rank", "-1"], "--lookahead-per-rank"),
    ],
)
def test_simulate_errors(argv, match, capsys):
    assert _run(cli, argv) == 2
    assert match in capsys.readouterr().err


def test_simulate_bad_csv_reports_line(tmp_path, capsys):
    f = tmp_path / "l.csv"
    f.write_text("tokens\n100\nlots\n")
    assert _run(cli, ["--lengths", str(f)]) == 2
    assert "l.csv:3" in capsys.readouterr().err


def test_print_config(capsys):
    assert _run(cli, ["--print-config", "--method", "bucket"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["planning"]["method"] == "bucket" and cfg["model"]["name"] == "t1d-5b"
    assert cfg["advanced"]["micro_batch_tokens"] == "auto"  # the config's default
    assert _run(cli, ["--print-config", "--micro-batch-tokens", "off"]) == 0
    assert json.loads(capsys.readouterr().out)["advanced"]["micro_batch_tokens"] == "off"
    assert _run(cli, ["--micro-batch-tokens", "on"]) == 2  # argparse names the choices


def test_compare_step_times():
    st = bench.compare_step_times([(1.0, 1.0), (1.1, 1.0), (0.8, 1.0), (2.0, 1.0)])
    assert st.n == 4 and st.median_pct == pytest.approx(15.0) and st.p90_pct == pytest.approx(100.0)
    assert st.mean_signed_pct == pytest.approx((0 + 10 - 20 + 100) / 4)
    assert bench.percentile([5, 1, 3], 50) == 3
    with pytest.raises(bench.BenchError, match="empty"):
        bench.compare_step_times([])
    with pytest.raises(bench.BenchError, match="measured > 0"):
        bench.compare_step_times([(1.0, 0.0)])


def _steps_csv(tmp_path, rows):
    f = tmp_path / "steps.csv"
    head = "run_id,method,world_size,step,predicted_step_time_s,measured_step_time_s,group\n"
    f.write_text(head + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return f


def test_bench_reads_steps_once_per_step(tmp_path, capsys):
    f = _steps_csv(tmp_path, [("a", "dcp-inter", 2, 0, 5.0, 1.0, 0), ("a", "dcp-inter", 2, 1, 1.0, 1.05, 0),
                              ("a", "dcp-inter", 2, 1, 1.0, 1.05, 1), ("a", "dcp-inter", 2, 2, 1.0, 0.95, 0)])
    pairs = bench.read_step_pairs(f, skip_first=1)
    o = CPU_SMALL.step_overhead_s  # the framework's per-step time the bench adds to CPU runs
    assert pairs == {"a": [(1.0 + o, 1.05), (1.0 + o, 0.95)]}
    rc = _run(bench, ["--results", str(f), "--skip-first", "1", "--json"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and last["steps"] == 2 and last["step_time_err_median_pct"] == pytest.approx(5.0, rel=0.05)


def test_bench_adds_sync_from_run_config(tmp_path):
    f = _steps_csv(tmp_path, [("a", "dcp-inter", 4, 0, 1.0, 1.0, 0)])
    (tmp_path / "config.json").write_text(json.dumps({"runs": {"a": {"config": {"model": {"name": "m", "num_layers": 2,
                                                                   "hidden_size": 64, "num_heads": 4}}}}}))
    ((pred, _),) = bench.read_step_pairs(f)["a"]
    assert pred > 1.0


def test_bench_nothing_to_compare(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(bench, ["--json"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert "nothing to compare" in "\n".join(out)
    assert json.loads(out[-1])["step_time_err_median_pct"] is None


def test_bench_bad_files(tmp_path, capsys):
    f = tmp_path / "steps.csv"
    f.write_text("run_id,step\na,0\n")
    assert _run(bench, ["--results", str(f)]) == 2
    assert "columns" in capsys.readouterr().err
    f = _steps_csv(tmp_path, [("a", "x", 2, 0, "fast", 1.0, 0)])
    assert _run(bench, ["--results", str(f)]) == 2
    assert "steps.csv:2" in capsys.readouterr().err


def test_bench_measure_refuses_used_folder(tmp_path, capsys):
    (tmp_path / "steps.csv").write_text("run_id\n")
    assert _run(bench, ["--measure", str(tmp_path)]) == 2
    assert "already holds" in capsys.readouterr().err


def test_simulate_with_config_on_cpu_model(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[model]\nname = "t1d-tiny"\nnum_layers = 4\nhidden_size = 64\nnum_heads = 8\n'
                   "[profiling]\nseq_group_edges = [128, 256, 512, 1024, 2048]\nmax_micro_batch_size = 8\n"
                   "[planning]\nmem_capacity_gib = 0.016\nsp_sizes = [1, 2]\nranks_per_node = 4\n")
    rc = _run(cli, ["--dataset", "t1d-balanced", "--scale", "cpu", "--num-samples", "128", "--config", str(cfg),
                    "--hardware", "cpu", "--gpus", "2", "--method", "dcp-inter", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and "model t1d-tiny, cpu-small" in out[0]
    assert json.loads(out[-1])["tokens_per_s"] > 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[modle]\n")
    assert _run(cli, ["--dataset", "t1d-short", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dcp simulate: error: [modle] is not a known section") and "did you mean 'model'?" in err


def test_bench_prefers_the_profiled_update_time(tmp_path):
    f = tmp_path / "steps.csv"
    f.write_text("run_id,method,world_size,step,predicted_step_time_s,measured_step_time_s,group,profiled_update_time_s\n"
                 "a,dcp-inter,4,0,1.0,1.1,0,0.25\n")
    (tmp_path / "config.json").write_text(json.dumps({"runs": {"a": {"config": {"model": {"name": "m", "num_layers": 2,
                                                                   "hidden_size": 64, "num_heads": 4}}}}}))
    # the measured 0.25 s replaces the analytic cpu-small sync + optimizer figure
    assert bench.read_step_pairs(f) == {"a": [(1.25 + CPU_SMALL.step_overhead_s, 1.1)]}
    f.write_text(f.read_text().replace(",0.25", ",slow"))
    with pytest.raises(bench.BenchError, match="steps.csv:2"):
        bench.read_step_pairs(f)


def test_bench_reports_each_world_size(tmp_path, capsys):
    f = _steps_csv(tmp_path, [("a", "bucket", 2, 0, 1.0, 1.0, 0), ("b", "bucket", 4, 0, 1.0, 2.0, 0)])
    rc = _run(bench, ["--results", str(f), "--json"])
    out = capsys.readouterr().out
    last = json.loads(out.strip().splitlines()[-1])
    o = CPU_SMALL.step_overhead_s
    assert rc == 0 and f"W=4: 1 steps, median error {100 * (1 - (1 + o) / 2):.1f}%" in out
    assert last["by_world_size"]["2"]["step_time_err_median_pct"] == pytest.approx(100 * o)
    assert last["by_world_size"]["4"]["steps"] == 1
    assert "time-shared" not in out and last["by_world_size"]["4"]["oversubscribed"] is False  # host unknown
    # with the host's cores recorded (config.json), W x threads > cores is named
    (tmp_path / "config.json").write_text(json.dumps({"runs": {
        "a": {"world_size": 2, "threads_per_rank": 1, "host_cpus": 2, "device": "cpu"},
        "b": {"world_size": 4, "threads_per_rank": 1, "host_cpus": 2, "device": "cpu"}}}))
    _run(bench, ["--results", str(f), "--json"])
    out = capsys.readouterr().out
    last = json.loads(out.strip().splitlines()[-1])
    assert "(ranks time-shared the host's cores" in out.split("W=4:")[1].splitlines()[0]
    assert "time-shared" not in out.split("W=2:")[1].splitlines()[0]
    assert (last["by_world_size"]["2"]["oversubscribed"], last["by_world_size"]["4"]["oversubscribed"]) == (False, True)


def test_oversubscribed_needs_the_host_facts():
    assert bench.oversubscribed({"world_size": 4, "threads_per_rank": 2, "host_cpus": 8, "device": "cpu"}) is False
    assert bench.oversubscribed({"world_size": 4, "threads_per_rank": 2, "host_cpus": 4, "device": "cpu"}) is True
    assert bench.oversubscribed({"world_size": 4, "device": "cpu"}) is None
    assert bench.oversubscribed({"world_size": 8, "host_cpus": 2, "device": "cuda"}) is None


def test_load_averages_read_from_the_run_config():
    assert bench.load_averages({"load_avg_1m": 3.4, "profile_load_avg_1m": 6}) == (3.4, 6.0)
    assert bench.load_averages({"load_avg_1m": None, "profile_load_avg_1m": True}) == (None, None)
    assert bench.load_averages({"load_avg_1m": float("nan")}) == (None, None)
    assert bench.load_averages(None) == (None, None)


def test_bench_prints_run_and_profile_load(tmp_path, capsys):
    f = _steps_csv(tmp_path, [("a", "bucket", 2, 0, 1.0, 1.0, 0), ("b", "bucket", 2, 0, 1.0, 2.0, 0)])
    _run(bench, ["--results", str(f)])
    out = capsys.readouterr().out
    assert "host load average" not in out and out.split("\n")[1].split()[-2:] == ["-", "-"]  # not recorded
    (tmp_path / "config.json").write_text(json.dumps({"runs": {
        "a": {"load_avg_1m": 2.5, "profile_load_avg_1m": 6.25}, "b": {"load_avg_1m": 3.0, "profile_load_avg_1m": 6.25}}}))
    _run(bench, ["--results", str(f)])
    out = capsys.readouterr().out
    assert out.split("\n")[1].split()[-2:] == ["2.5", "6.2"]
    assert "host load average (1 min): runs 2.5-3.0, their profiles 6.2-6.2" in out
