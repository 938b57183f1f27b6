"""The calibrated analytic model: activation counts from the reference models, `dcp bench calibration`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dcp.cli import main
from dcp.models import build_model
from dcp.planner.analytic import ACT_F, ACT_H, NORMS, STAT_BYTES, activation_bytes_per_token
from dcp.profiler.adapters import ProtocolAdapter
from dcp.runtime.context import SPContext
from dcp.sim.calibration import CalibrationError, compare, fit, load_calibration
from dcp.sim.hardware import H100

H100_RECORD = Path(__file__).resolve().parents[2] / "dcp" / "sim" / "data" / "h100-bf16-2026-11-22.json"
"""The H100 record the simulator was fitted to, committed in the repository (so this test runs in a clone)."""


def _saved_bytes_per_token(name: str, seq_len: int, **overrides) -> tuple[float, int]:
    """Bytes one layer's autograd graph keeps per token (distinct storages; parameters and the layer input
    and aux excluded), counted with saved-tensor hooks as the profiler's SavedTensorMeter does; plus the count of
    fp32 h-wide storages (CPU's composite RMSNorm keeps an fp32 input copy and fp32 output; CUDA's fused
    kernel keeps the bf16 input and rstd instead)."""
    torch.manual_seed(0)
    model = build_model(name, num_layers=2, **overrides).to(torch.bfloat16)
    adapter = ProtocolAdapter(model)
    ctx = SPContext.single()
    batch = adapter.synthetic_batch(1, seq_len, generator=torch.Generator().manual_seed(0))
    hidden, aux = adapter.layer_inputs(batch, ctx)
    x = hidden.detach().requires_grad_(True)
    from dcp.profiler.memory import tensors_in

    # Parameters, the layer input and the per-micro-batch aux tensors (RoPE tables, masks: shared by every
    # layer, the profiler books them in M_C) are not the layer's activations.
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x, *tensors_in(aux)]}
    seen: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in skip:
            seen.setdefault(key, t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        adapter.run_layer(1, x, aux, ctx)
    h = model.config.hidden_size
    fp32_h = sum(1 for t in seen.values() if t.dtype == torch.float32 and t.shape[-1] == h)
    return sum(t.untyped_storage().nbytes() for t in seen.values()) / seq_len, fp32_h


@pytest.mark.parametrize("name,attention,seq_len", [("t1d", "1d", 32), ("t2d", "2d", 64)])
def test_activation_count_matches_the_models_saved_tensors(name, attention, seq_len):
    # A small model of each layout with real structure; the analytic count is CUDA's (fused RMSNorm:
    # bf16 input + fp32 rstd). On CPU each norm keeps an fp32 copy of its input and its fp32 output
    # instead of the bf16 input, which is converted here so the rest of the count is checked exactly.
    overrides = dict(hidden_size=64, num_heads=4, ffn_hidden_size=96)
    got, fp32_h = _saved_bytes_per_token(f"{name}-tiny", seq_len, **overrides)
    norms = NORMS[attention]
    assert fp32_h == 2 * norms
    h, d = 64, 2
    # CPU: 2 fp32 h-wide per norm; CUDA: bf16 input of every norm but the first (the layer input).
    cuda = got - norms * 2 * h * 4 + (norms - 1) * h * d
    shape = build_model(f"{name}-tiny", **overrides).config.shape(param_bytes=2)
    assert cuda == pytest.approx(activation_bytes_per_token(shape, attention, d))
    assert activation_bytes_per_token(shape, attention, d) == (
        (ACT_H[attention] * 64 + ACT_F * 96) * d + STAT_BYTES * ((1 if attention == "1d" else 2) * 4 + norms))


def _write(tmp_path: Path, data) -> str:
    p = tmp_path / "cal.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def _rows(model="t1d-5b", **row):
    base = dict(s=8192, b=1, t_f_ms=4.6, t_b_ms=10.6, T_C_ms=13.0, m_act_mib=472.8, m_inp_mib=48.0)
    return {"num_layers": 8, "profile_rows": {model: [{**base, **row}]}}


def test_load_errors_name_file_field_and_fix(tmp_path):
    with pytest.raises(CalibrationError, match=r"no such file"):
        load_calibration(tmp_path / "missing.json")
    with pytest.raises(CalibrationError, match=r"not JSON"):
        load_calibration(_write(tmp_path, "{oops"))
    with pytest.raises(CalibrationError, match=r"profile_rows \('NoneType'\) must be an object"):
        load_calibration(_write(tmp_path, {"what": 1}))
    with pytest.raises(CalibrationError, match=r"profile_rows model \('gpt9'\) is not one of"):
        load_calibration(_write(tmp_path, _rows("gpt9")))
    with pytest.raises(CalibrationError, match=r"\.t_b_ms \(-1\) must be a finite number > 0"):
        load_calibration(_write(tmp_path, _rows(t_b_ms=-1)))
    bad = _rows()
    del bad["num_layers"]
    with pytest.raises(CalibrationError, match=r"num_layers of t1d-5b \(None\) must be a positive int"):
        load_calibration(_write(tmp_path, bad))


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["bench", "calibration", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dcp bench calibration:") and "nope.json" in err and "\n" not in err


def test_cli_json_last_line(tmp_path, capsys):
    assert main(["bench", "calibration", _write(tmp_path, _rows()), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) >= {"time_err_median_pct", "mem_err_median_pct", "tconst_err_median_pct", "rows"}
    assert out["rows"] == 1


def test_compare_is_zero_on_the_models_own_rows_and_fit_recovers_its_constants():
    # Synthetic "measurements" made by the model itself: zero error, and the fit finds the constants back.
    import dataclasses

    from dcp.sim.calibration import MeasuredRow, model_row

    shapes = [("t1d-5b", s, b) for s in (1024, 4096, 16384) for b in (1, 4)] + [
        ("t2d-1.2b", s, b) for s in (4096, 65536) for b in (1, 2)]
    rows = []
    for m, s, b in shapes:
        proto = MeasuredRow(model=m, seq_len=s, micro_batch_size=b, num_layers=8, t_f_s=1, t_b_s=1,
                            t_const_s=1, m_act_bytes=1, m_inp_bytes=1)
        a = model_row(proto, H100)
        rows.append(dataclasses.replace(proto, t_f_s=a.t_f_s, t_b_s=a.t_b_s, t_const_s=a.t_const_s,
                                        m_act_bytes=a.m_act_bytes, m_inp_bytes=a.m_inp_bytes))
    stats = compare(rows, H100)
    assert all(s.median_pct < 1e-6 for s in stats.values())
    refit = fit(rows, H100)
    assert refit.kernel_overhead_s == pytest.approx(H100.kernel_overhead_s, rel=1e-3)
    assert refit.linear_efficiency == pytest.approx(H100.linear_efficiency, rel=1e-3)
    assert refit.backward_factor == pytest.approx(H100.backward_factor, abs=0.006)
    assert refit.micro_batch_overhead_s == pytest.approx(H100.micro_batch_overhead_s, rel=1e-3)


def test_h100_file_meets_the_targets():
    rows = load_calibration(H100_RECORD)
    stats = compare(rows, H100)
    assert len(rows) == 32
    assert stats["micro_batch_time"].median_pct <= 10
    assert stats["m_act"].median_pct <= 10
    assert stats["t_const"].median_pct <= 10


@pytest.mark.parametrize("field,value,match", [
    ("linear_efficiency", 0.0, r"HardwareSpec.linear_efficiency \(0.0\) must be > 0"),
    ("backward_factor", -1.0, r"HardwareSpec.backward_factor \(-1.0\) must be > 0"),
    ("step_overhead_s", -1e-3, r"HardwareSpec.step_overhead_s \(-0.001\) must be >= 0"),
    ("micro_batch_overhead_s", -1.0, r"HardwareSpec.micro_batch_overhead_s \(-1.0\) must be >= 0"),
    ("attention_flops_per_s_by_seq", ((4096, 1e14), (1024, 1e14)), r"attention_flops_per_s_by_seq .* increasing"),
    ("attention_flops_per_s_by_seq", ((4096, 0.0),), r"attention_flops_per_s_by_seq .* pairs > 0"),
])
def test_hardware_spec_rejects_bad_calibration_fields(field, value, match):
    import dataclasses

    with pytest.raises(ValueError, match=match):
        dataclasses.replace(H100, **{field: value})


def test_measured_attention_curve_interpolates_and_clamps():
    # 3.5 x forward FLOPs at the measured rate: at a measured point exactly, between points in log2(s).
    (s0, r0), (s1, r1) = H100.attention_flops_per_s_by_seq[:2]
    f, b = H100.attention_time_s(1e12, s0)
    assert f + b == pytest.approx(3.5e12 / r0) and b / f == pytest.approx(2.5)
    mid = int((s0 * s1) ** 0.5)
    assert sum(H100.attention_time_s(1e12, mid)) == pytest.approx(3.5e12 / ((r0 + r1) / 2), rel=1e-3)
    assert sum(H100.attention_time_s(1e12, 16)) == pytest.approx(3.5e12 / r0)  # clamped below 4k
