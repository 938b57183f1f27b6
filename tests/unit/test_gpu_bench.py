"""``dcp bench gpu`` on CPU: the no-CUDA answer, and its measurements through the hidden tiny CPU path (the
CUDA-only figures, sync count and GPU busy share, cannot run here)."""

from __future__ import annotations

import json

import pytest
import torch

from dcp.bench import gpu as gpu_bench
from dcp.bench import gpu_steps
from dcp.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without CUDA")
def test_without_cuda_it_says_so_and_exits_0(capsys):
    assert main(["bench", "gpu", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "no CUDA device" in out[0]
    assert json.loads(out[-1]) == {"cuda": False}


def test_tiny_cpu_path_prints_the_table_and_the_summary(capsys):
    assert main(["bench", "gpu", "--device", "cpu", "--tiny", "--no-tests", "--no-sweep", "--reps", "1", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    for key in ("time_err_median_pct", "mem_err_median_pct", "padded_efficiency", "syncs_per_micro_batch",
                "gpu_busy_short", "manager_runs_ok", "engines", "many_docs_efficiency", "time_err_median_pct_by_clock"):
        assert key in summary
    assert summary["cuda"] is False and summary["precision"] == "fp32"
    assert summary["time_err_median_pct"] >= 0 and summary["mem_err_median_pct"] >= 0
    assert summary["padded_efficiency"] > 0 and summary["many_docs_efficiency"] > 0
    assert list(summary["time_err_median_pct_by_clock"]) == ["wall"]  # 'auto' is the wall clock on CPU
    assert any(ln.startswith("8 documents of 8 tokens") for ln in out)
    assert summary["syncs_per_micro_batch"] is None and summary["gpu_busy_short"] is None  # CUDA only
    rows = [ln for ln in out if ln.startswith(("t1d-tiny", "t2d-tiny"))]
    assert [ln.split()[3] for ln in rows] == ["0", "2", "0", "2"]  # r = 0 and r = L for both models


def test_compile_runs_every_check_on_compiled_blocks(capsys, monkeypatch):
    compiled = []
    real = gpu_bench._build

    def spy(name, layers, device, compile_mode):
        model = real(name, layers, device, compile_mode)
        compiled.append(all(layer._compiled_call_impl is not None for layer in model.layers))
        return model

    monkeypatch.setattr(gpu_bench, "_build", spy)
    argv = ["bench", "gpu", "--device", "cpu", "--tiny", "--no-tests", "--no-sweep", "--reps", "1", "--json"]
    assert main(argv + ["--compile", "default"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["compile"] == "default" and summary["padded_efficiency"] > 0
    assert compiled == [True] * 4  # dual-layer x 2 models, padded, many documents


def test_bad_layers_is_refused(capsys):
    assert main(["bench", "gpu", "--device", "cpu", "--tiny", "--layers", "1"]) == 2
    assert "--layers (1) must be >= 2" in capsys.readouterr().err


def test_busy_union_merges_overlapping_kernels():
    assert gpu_steps.busy_union_us([]) == 0.0
    assert gpu_steps.busy_union_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17.0


@pytest.mark.slow
def test_manager_sweep_on_cpu(tmp_path):
    out = gpu_bench.manager_sweep("ddp", "cpu", str(tmp_path), models=("t1d-tiny",), methods=("bucket", "dcp-intra"))
    assert out == {"engine": "ddp", "runs": 2, "expected": 2, "ok": True, "error": ""}


def test_count_cuda_syncs_counts_torchs_sync_warnings_and_passes_the_others_on(monkeypatch):
    import warnings

    modes = ["error"]  # the caller's mode, restored afterwards
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: modes[-1])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: modes.append(mode))

    def step():
        warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                      "synchronizing operations", stacklevel=1)
        for _ in range(2):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("a model's own notice", DeprecationWarning, stacklevel=1)
        return 5

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        out, syncs = gpu_steps.count_cuda_syncs(step)
    assert (out, syncs) == (5, 2)
    assert [str(w.message) for w in shown] == ["a model's own notice"]
    assert modes == ["error", "warn", "error"]


@pytest.mark.parametrize(("args", "message"), [
    ([], "usage: [PYTHON=python-with-torch] bash scripts/gpu_checks.sh bench"),
    (["tests"], "usage: [PYTHON=python-with-torch] bash scripts/gpu_checks.sh bench"),
    (["suite-xdist"], "suite-xdist needs a worker count N >= 1, e.g. suite-xdist 6"),
    (["suite-xdist", "0"], "suite-xdist needs a worker count N >= 1"),
    (["suite", "2", "2"], "suite needs a slice K and a count N with 0 <= K < N"),
    (["suite", "a", "2"], "suite needs a slice K and a count N with 0 <= K < N"),
])
def test_gpu_checks_script_refuses_bad_arguments_with_its_usage(args, message):
    # checked before anything is imported or installed: exit 2 and one line naming the rule
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_checks.sh"
    out = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, (out.returncode, out.stderr)
    assert out.stdout == ""


def test_gpu_checks_script_names_a_python_without_torch():
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_checks.sh"
    out = subprocess.run(["bash", str(script), "bench"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHON": "false"})
    assert out.returncode == 2 and "false cannot import torch: set PYTHON to a Python with torch" in out.stderr


def test_only_knobs_runs_both_settings_on_and_off_through_the_manager_on_cpu(capsys):
    """`dcp bench gpu --only knobs` through its hidden tiny CPU path (gloo, W = 1, bf16 autocast): both cases x
    both settings, each mode timed in every round, and only the prefetching manager's micro-batches came from
    the prefetch thread."""
    assert main(["bench", "gpu", "--device", "cpu", "--tiny", "--only", "knobs", "--precision", "bf16", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(out[-1])["rows"]
    assert [(r["model"], r["tokens"], r["b"], r["knob"]) for r in rows] == [
        ("t1d-tiny", 64, 2, "prefetch"), ("t1d-tiny", 64, 2, "cache_weight_casts"),
        ("t2d-tiny", 64, 1, "prefetch"), ("t2d-tiny", 64, 1, "cache_weight_casts")]
    for r in rows:
        assert r["step_ms_on"] > 0 and r["step_ms_off"] > 0
        assert 0 <= r["saving_positive_rounds"] <= r["rounds"] == 5
        if r["knob"] == "prefetch":
            assert r["collate_ms_per_micro_batch"] > 0
            # 1 warm-up + 5 rounds of 6 steps x 4 micro-batches; each epoch's first micro-batch is collated in place
            assert r["prefetched"] == {"on": 6 * (6 * 4 - 1), "off": 0}
    assert any(ln.startswith("model") and "saving ms" in ln for ln in out)


def test_a_knob_case_of_a_video_model_needs_whole_frames():
    from dcp.bench.gpu_knobs import _dataset
    from dcp.models import build_model

    want = r"tokens \(66\) must be a multiple of t2d.synthetic_frames \(4\): use 64"
    with pytest.raises(ValueError, match=want):
        _dataset(build_model("t2d-tiny"), 4, 66)
