"""``dcp bench gpu --only cp`` and ``--only engines`` on their hidden tiny CPU paths (their figures are a GPU's)."""

from __future__ import annotations

import json

import pytest
import torch

from dcp.bench import gpu_cp
from dcp.cli import main
from dcp.runtime import context_parallel


def test_only_cp_finds_every_context_rank_equal_to_one_call(capsys):
    assert main(["bench", "gpu", "--device", "cpu", "--tiny", "--only", "cp", "--precision", "bf16", "--reps", "1",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["check"] == "cp" and summary["cp_equal"] is True
    rows = summary["rows"]
    assert [(r["context"], r["docs"]) for r in rows] == [(c, d) for _, c, _, _, _, d in gpu_cp.TINY_CASES]
    for r in rows:  # bf16 rounds: both sides are off fp32 by a little, the CP path by no more than the slack allows
        assert 0 < r["ref_err"] < 0.05 and 0 < r["cp_err"] <= gpu_cp.ERROR_SLACK * r["ref_err"] + 1e-6
        assert len(r["rank_ms"]) == r["context"] and r["slowest_rank_ms"] == pytest.approx(max(r["rank_ms"]), rel=1e-3)


def test_cp_check_fails_a_path_that_drops_a_chunk(monkeypatch):
    """A CP path that loses the back chunk's keys (every rank attends only its front chunk's prefix) is caught."""
    real = context_parallel.attend_gathered

    def front_only(q, k, v, **kw):
        out = real(q, k, v, **kw)
        return torch.cat([out[:, : out.shape[1] // 2], torch.zeros_like(out[:, out.shape[1] // 2:])], dim=1)

    monkeypatch.setattr(context_parallel, "attend_gathered", front_only)
    row = gpu_cp.cp_case(256, 2, 4, 2, 16, 1, device=torch.device("cpu"), dtype=torch.bfloat16, reps=1)
    assert row["equal"] is False and row["cp_err"] > 10 * row["ref_err"]


def test_attend_gathered_refuses_local_kv_in_one_line():
    q = torch.zeros(1, 8, 4, 16)
    kv = torch.zeros(1, 8, 2, 16)  # this rank's chunk, not the gathered sequence of 2 x 8 tokens
    with pytest.raises(ValueError, match=r"must be \[b, 16, H_kv, d\].*gathered K/V of the whole sequence"):
        context_parallel.attend_gathered(q, kv, kv, context=2, context_rank=0, causal=True)


@pytest.mark.dist
def test_only_engines_predicts_each_engines_peak_from_its_profile(monkeypatch, tmp_path):
    """On CPU the allocator has no peak counter: the row is the prediction alone, from the profiled table with the
    engine's state, and fsdp2's beside it with its reduce-scatter staging."""
    from dcp.bench import gpu_engines
    from dcp.memory import staging_bytes
    from dcp.models import build_model

    monkeypatch.setattr(gpu_engines, "installed", lambda engines=("ddp", "fsdp2"): list(engines))
    rows = gpu_engines.run_engines(torch.device("cpu"), True, str(tmp_path))
    assert [r["engine"] for r in rows] == ["ddp", "fsdp2"] and all("error" not in r for r in rows)
    shape = build_model(gpu_engines.TINY_CASE[0], num_layers=gpu_engines.TINY_CASE[1]).config.shape()
    ddp, fsdp2 = rows
    assert ddp["measured_bytes"] is None and ddp["predicted_bytes"] > ddp["state_bytes"] > 0
    assert ddp["with_staging_bytes"] == ddp["predicted_bytes"]  # only fsdp2 stages its reduce-scatter
    assert fsdp2["with_staging_bytes"] - fsdp2["predicted_bytes"] == staging_bytes(shape, "fsdp2") > 0


def test_only_sweeps_runs_each_installed_engines_sweep_alone(capsys, monkeypatch):
    """`--only sweeps`: one manager sweep per installed engine and nothing else of the bench (the sweeps
    themselves are tested in test_gpu_bench; here a failed one must fail the summary)."""
    from dcp.bench import gpu as gpu_bench

    ran = []

    def sweep(engine, device, out_dir, **kw):
        ran.append((engine, device))
        return {"engine": engine, "runs": 1, "expected": 1, "ok": engine != "fsdp2", "error": ""}

    monkeypatch.setattr(gpu_bench, "manager_sweep", sweep)
    monkeypatch.setattr(gpu_bench, "installed_engines", lambda: ["ddp", "fsdp2"])
    assert main(["bench", "gpu", "--device", "cpu", "--tiny", "--only", "sweeps", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ran == [("ddp", "cpu"), ("fsdp2", "cpu")] and summary["check"] == "sweeps"
    assert [s["engine"] for s in summary["sweeps"]] == ["ddp", "fsdp2"] and summary["manager_runs_ok"] is False
