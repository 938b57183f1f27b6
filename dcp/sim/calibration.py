"""``dcp bench calibration FILE``: the analytic GPU model against a measured profile of the same shapes.

FILE is a calibration record like ``dcp/sim/data/h100-bf16-2026-11-22.json``
(committed: the H100 record the constants of ``dcp.sim.hardware.H100`` were fitted to): the project's
dual-layer profiler run on one GPU (p = 1) on the paper's model shapes with few layers. It must hold

- ``profile_rows``: ``{model: [{"s", "b", "t_f_ms", "t_b_ms", "T_C_ms", "m_act_mib", "m_inp_mib", ...}]}``
  with model one of ``dcp.named_models.PAPER_MODELS`` (t1d-5b, t2d-1.2b);
- the layer count the rows were measured with: ``num_layers`` (an int, or per model), or the
  ``num_layers`` column of ``profile_tables_csv[model]`` (the profiler's CSV).

For every row the bench builds the analytic row of the same shape (``dcp.planner.analytic.analytic_row``,
p = 1, bf16, 2d samples of ``T2D_FRAMES`` frames as the profiler's synthetic batches) and prints, per term,
the median and 90th-percentile absolute error ``|model - measured| / measured``:

- ``micro_batch_time``: one micro-batch at r = 0, ``L (t_f + t_b) + T_C`` (paper Eq. 4) with the measured L;
- ``t_f``, ``t_b``: one layer's forward and backward (at small shapes the profiler's split between them is
  host-bound and noisy; their sum is what a step pays);
- ``t_const``: the part outside the layers (T_C); ``m_act``, ``m_inp``: a layer's kept activations and input.

With ``--json`` the last line is ``{"time_err_median_pct", "mem_err_median_pct", "tconst_err_median_pct",
"rows", "terms": {term: {"median_pct", "p90_pct", "mean_signed_pct", "n"}}}``.

``--fit`` also refits the calibrated constants of ``dcp.sim.hardware`` (``fit``) on the file's rows, prints
them, and prints the leave-one-model-out error (fit on one model, check the other).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dcp.config import ModelShapeConfig
from dcp.named_models import MODELS, PAPER_MODELS
from dcp.planner.analytic import (
    ELEMENTWISE_F,
    ELEMENTWISE_H,
    KERNELS_PER_LAYER,
    HardwareSpec,
    analytic_row,
    attention_time_s,
    layer_linear_params,
)
from dcp.sim.hardware import HARDWARE

T2D_FRAMES = 16
"""Frames of the profiler's synthetic t2d-1.2b samples (T2DConfig.paper_1_2b synthetic_frames)."""
BF16_BYTES = 2
"""The calibration records are bf16."""
MIB = 2**20
TERMS = ("micro_batch_time", "t_f", "t_b", "t_const", "m_act", "m_inp")
"""Compared terms, in print order."""
FIT_FWD_MIN_TOKENS = 8192
"""The forward/backward split enters the fit only from this many tokens per micro-batch: below it the
profiler's forward timer also pays the host's launch backlog, so the split says little."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sequence."""
    if not values:
        raise ValueError("values ([]) is empty: a percentile needs at least one value")
    s = sorted(values)
    k = max(1, math.ceil(q / 100 * len(s)))
    return s[k - 1]


def _shape(name: str) -> tuple[ModelShapeConfig, str]:
    """(paper shape, attention layout) of a paper model name (checked by load_calibration)."""
    named = MODELS[name]
    if named.paper_shape is None:
        raise CalibrationError(f"model ({name!r}) has no paper shape: use one of {sorted(PAPER_MODELS)}")
    return named.paper_shape, named.attention


class CalibrationError(ValueError):
    """The calibration file is missing or malformed; the message names the file, the field and a fix."""


@dataclass(kw_only=True, slots=True, frozen=True)
class MeasuredRow:
    """One measured (model, s, b) row at p = 1."""

    model: str
    """A name of dcp.named_models.PAPER_MODELS."""
    seq_len: int
    """Tokens per sample (s)."""
    micro_batch_size: int
    """Samples per micro-batch (b)."""
    num_layers: int
    """Layers of the measured model (L of the micro-batch time)."""
    t_f_s: float
    """One layer's forward (s)."""
    t_b_s: float
    """One layer's backward (s)."""
    t_const_s: float
    """The micro-batch's time outside the layers, T_C (s)."""
    m_act_bytes: float
    """Activations one layer keeps for backward."""
    m_inp_bytes: float
    """One layer's input."""

    def value(self, term: str) -> float:
        return term_value(term, self.t_f_s, self.t_b_s, self.t_const_s, self.m_act_bytes, self.m_inp_bytes,
                          self.num_layers)


def term_value(term: str, t_f: float, t_b: float, t_c: float, m_act: float, m_inp: float, layers: int) -> float:
    """The value of one of TERMS from a row's fields."""
    return {
        "micro_batch_time": layers * (t_f + t_b) + t_c,
        "t_f": t_f,
        "t_b": t_b,
        "t_const": t_c,
        "m_act": m_act,
        "m_inp": m_inp,
    }[term]


def _fail(path: str, field: str, value: object, rule: str, fix: str) -> CalibrationError:
    return CalibrationError(f"{path}: {field} ({value!r}) {rule}: {fix}")


def _csv_layers(path: str, text: object, model: str) -> int | None:
    if not isinstance(text, str):
        return None
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    vals = {r.get("num_layers") for r in rows}
    if len(vals) != 1 or None in vals:
        raise _fail(path, f"profile_tables_csv[{model!r}].num_layers", sorted(map(str, vals)),
                    "must hold one layer count", "give the profiler's CSV of one model")
    return int(next(iter(vals)))  # type: ignore[arg-type]


def load_calibration(path: str | Path) -> list[MeasuredRow]:
    """The measured rows of a calibration file (see the module docstring); CalibrationError if it is
    missing, not JSON, or lacks a field."""
    p = str(path)
    try:
        data = json.loads(Path(p).read_text())
    except FileNotFoundError:
        raise CalibrationError(f"{p}: no such file: pass a calibration record such as "
                               "dcp/sim/data/h100-bf16-2026-11-22.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{p}: cannot read it ({exc}): pass a readable JSON file") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{p}: not JSON ({exc.msg} at line {exc.lineno}): pass the calibration record "
                               "as written by the GPU run") from None
    if not isinstance(data, dict) or not isinstance(data.get("profile_rows"), dict) or not data["profile_rows"]:
        got = type(data.get("profile_rows")).__name__ if isinstance(data, dict) else type(data).__name__
        raise _fail(p, "profile_rows", got, "must be an object {model: [rows]}",
                    f"add measured rows of the models {sorted(PAPER_MODELS)}")
    out: list[MeasuredRow] = []
    for model, rows in data["profile_rows"].items():
        if model not in PAPER_MODELS:
            raise _fail(p, "profile_rows model", model, f"is not one of {sorted(PAPER_MODELS)}",
                        "calibrate the paper's model shapes")
        layers = data.get("num_layers")
        if isinstance(layers, dict):
            layers = layers.get(model)
        if layers is None:
            layers = _csv_layers(p, (data.get("profile_tables_csv") or {}).get(model), model)
        if not isinstance(layers, int) or layers < 1:
            raise _fail(p, f"num_layers of {model}", layers, "must be a positive int",
                        "add \"num_layers\": 8 (the measured model's layer count) or the profiler's CSV")
        if not isinstance(rows, list) or not rows:
            raise _fail(p, f"profile_rows[{model!r}]", rows, "must be a non-empty list", "add measured rows")
        for i, r in enumerate(rows):
            where = f"profile_rows[{model!r}][{i}]"
            if not isinstance(r, dict):
                raise _fail(p, where, r, "must be an object", "write one object per measured row")
            if r.get("feasible") is False:
                continue
            vals = {}
            for key in ("s", "b", "t_f_ms", "t_b_ms", "T_C_ms", "m_act_mib", "m_inp_mib"):
                v = r.get(key)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise _fail(p, f"{where}.{key}", v, "must be a finite number > 0",
                                "write the measured value (times in ms, memory in MiB)")
                vals[key] = float(v)
            out.append(MeasuredRow(
                model=model, seq_len=int(vals["s"]), micro_batch_size=int(vals["b"]), num_layers=layers,
                t_f_s=vals["t_f_ms"] / 1e3, t_b_s=vals["t_b_ms"] / 1e3, t_const_s=vals["T_C_ms"] / 1e3,
                m_act_bytes=vals["m_act_mib"] * MIB, m_inp_bytes=vals["m_inp_mib"] * MIB,
            ))
    if not out:
        raise _fail(p, "profile_rows", "no feasible rows", "must hold at least one feasible row", "add measured rows")
    return out


def model_row(row: MeasuredRow, hardware: HardwareSpec):
    """The analytic ProfileRow of the measured row's shape (p = 1, bf16)."""
    shape, attention = _shape(row.model)
    shape = dataclasses.replace(shape, num_layers=row.num_layers)
    return analytic_row(shape, 0, row.seq_len, row.micro_batch_size, 1, world_size=1, hardware=hardware,
                        dtype_bytes=BF16_BYTES, attention=attention,
                        frames=T2D_FRAMES if attention == "2d" else None)


@dataclass(kw_only=True, slots=True, frozen=True)
class TermStats:
    n: int
    median_pct: float
    p90_pct: float
    mean_signed_pct: float


def _stats(pairs: Sequence[tuple[float, float]]) -> TermStats:
    errs = [abs(m - t) / t * 100 for m, t in pairs]
    signed = [(m - t) / t * 100 for m, t in pairs]
    return TermStats(n=len(pairs), median_pct=statistics.median(errs), p90_pct=percentile(errs, 90),
                     mean_signed_pct=statistics.fmean(signed))


def compare(rows: Sequence[MeasuredRow], hardware: HardwareSpec,
            models: Sequence[str] | None = None) -> dict[str, TermStats]:
    """Per term: errors of the model against the measured rows (of ``models``, default all)."""
    pairs: dict[str, list[tuple[float, float]]] = {t: [] for t in TERMS}
    for r in rows:
        if models is not None and r.model not in models:
            continue
        a = model_row(r, hardware)
        for t in TERMS:
            pairs[t].append((term_value(t, a.t_f_s, a.t_b_s, a.t_const_s, a.m_act_bytes, a.m_inp_bytes,
                                        r.num_layers), r.value(t)))
    return {t: _stats(v) for t, v in pairs.items() if v}


# --------------------------------------------------------------------------------------------- the fit
FITTED = ("kernel_overhead_s", "linear_efficiency", "backward_factor", "micro_batch_overhead_s", "const_h_tensors")
"""The HardwareSpec fields ``fit`` estimates; everything else is measured, counted or from a datasheet."""


def _lstsq(a: list[list[float]], y: list[float]) -> list[float]:
    import numpy as np

    sol, *_ = np.linalg.lstsq(np.asarray(a, dtype=float), np.asarray(y, dtype=float), rcond=None)
    return [float(x) for x in sol]


def fit(rows: Sequence[MeasuredRow], base: HardwareSpec) -> HardwareSpec:
    """``base`` with FITTED re-estimated by least squares on relative errors of ``rows``.

    Layers: for each backward factor beta on a grid (1.5-3.5), the per-kernel overhead and 1 / linear
    efficiency are the linear least-squares solution of one layer's forward + backward (every row) and its
    forward alone (rows >= FIT_FWD_MIN_TOKENS tokens), each residual divided by the measured value; the beta
    with the smallest sum of squares wins. Then T_C: the fixed per-micro-batch time and the h-wide tensors
    per token outside the layers, by the same kind of least squares with the layers' fit held.
    """
    base = dataclasses.replace(base, kernel_overhead_s=0.0, linear_efficiency=1.0, micro_batch_overhead_s=0.0,
                               const_h_tensors=0.0)
    feats = []
    for r in rows:
        shape, attention = _shape(r.model)
        d, n = BF16_BYTES, r.micro_batch_size * r.seq_len
        lin0 = 2.0 * n * layer_linear_params(shape, attention) / base.matmul_flops_per_s
        elem = (ELEMENTWISE_H * shape.hidden_size + ELEMENTWISE_F * shape.ffn_size) * n * d / base.mem_bandwidth_bytes_per_s
        att_f, att_b = attention_time_s(shape, r.seq_len, r.micro_batch_size, 1, base, attention=attention,
                                        frames=T2D_FRAMES if attention == "2d" else None)
        feats.append((r, lin0, elem, att_f, att_b))
    best = None
    for k in range(0, 201):
        beta = 1.5 + k * 0.01
        a, y = [], []
        for r, lin0, elem, att_f, att_b in feats:
            tot = r.t_f_s + r.t_b_s
            a.append([(1 + beta) * KERNELS_PER_LAYER / tot, (1 + beta) * lin0 / tot])
            y.append((tot - (1 + beta) * elem - att_f - att_b) / tot)
            if r.micro_batch_size * r.seq_len >= FIT_FWD_MIN_TOKENS:
                a.append([KERNELS_PER_LAYER / r.t_f_s, lin0 / r.t_f_s])
                y.append((r.t_f_s - elem - att_f) / r.t_f_s)
        ko, inv_eff = _lstsq(a, y)
        ko, inv_eff = max(ko, 0.0), max(inv_eff, 1.0)
        hw = dataclasses.replace(base, kernel_overhead_s=ko, linear_efficiency=1.0 / inv_eff, backward_factor=beta)
        sse = 0.0
        for r, *_ in feats:
            m = model_row(r, hw)
            sse += ((m.t_f_s + m.t_b_s) / (r.t_f_s + r.t_b_s) - 1) ** 2
            if r.micro_batch_size * r.seq_len >= FIT_FWD_MIN_TOKENS:
                sse += (m.t_f_s / r.t_f_s - 1) ** 2
        if best is None or sse < best[0]:
            best = (sse, hw)
    assert best is not None
    hw = best[1]
    a, y = [], []
    for r, *_ in feats:
        shape, _att = _shape(r.model)
        n = r.micro_batch_size * r.seq_len
        known = model_row(r, hw).t_const_s
        a.append([1.0 / r.t_const_s, n * shape.hidden_size * BF16_BYTES / hw.mem_bandwidth_bytes_per_s / r.t_const_s])
        y.append((r.t_const_s - known) / r.t_const_s)
    ov, ch = _lstsq(a, y)
    return dataclasses.replace(hw, micro_batch_overhead_s=max(ov, 0.0), const_h_tensors=max(ch, 0.0))


def fitted_values(hw: HardwareSpec) -> dict[str, float]:
    return {k: getattr(hw, k) for k in FITTED}


# --------------------------------------------------------------------------------------------- the CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a calibration record (JSON), e.g. "
                        "dcp/sim/data/h100-bf16-2026-11-22.json")
    parser.add_argument("--hardware", default="h100", choices=("h100", "h200"), help="the modelled GPU")
    parser.add_argument("--fit", action="store_true",
                        help="also refit the calibrated constants on FILE and print the leave-one-model-out error")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def _print_stats(title: str, stats: dict[str, TermStats]) -> None:
    print(title)
    print(f"  {'term':<17} {'n':>3} {'median %':>9} {'p90 %':>8} {'signed mean %':>14}")
    for t, s in stats.items():
        print(f"  {t:<17} {s.n:>3} {s.median_pct:>9.1f} {s.p90_pct:>8.1f} {s.mean_signed_pct:>+14.1f}")


def run(args: argparse.Namespace) -> int:
    try:
        rows = load_calibration(args.file)
    except CalibrationError as exc:
        print(f"dcp bench calibration: {exc}", file=sys.stderr)
        return 2
    hw = HARDWARE[args.hardware]
    models = sorted({r.model for r in rows})
    print(f"# {len(rows)} measured rows of {', '.join(models)} from {args.file}; model {hw.name}")
    overall = compare(rows, hw)
    _print_stats("all models", overall)
    for m in models:
        _print_stats(m, compare(rows, hw, [m]))
    if args.fit:
        fitted = fit(rows, hw)
        print("refit on all rows: " + ", ".join(f"{k}={v:.4g}" for k, v in fitted_values(fitted).items()))
        for held in models:
            train = [r for r in rows if r.model != held]
            if not train:
                continue
            hw_train = fit(train, hw)
            s = compare(rows, hw_train, [held])
            print(f"hold-out {held} (fit on the others): micro_batch_time {s['micro_batch_time'].median_pct:.1f}% "
                  f"median ({s['micro_batch_time'].p90_pct:.1f}% p90), t_const {s['t_const'].median_pct:.1f}% median; "
                  + ", ".join(f"{k}={v:.4g}" for k, v in fitted_values(hw_train).items()))
    if args.json:
        print(json.dumps({
            "time_err_median_pct": overall["micro_batch_time"].median_pct,
            "mem_err_median_pct": overall["m_act"].median_pct,
            "tconst_err_median_pct": overall["t_const"].median_pct,
            "rows": len(rows),
            "terms": {t: dataclasses.asdict(s) for t, s in overall.items()},
        }))
    return 0
