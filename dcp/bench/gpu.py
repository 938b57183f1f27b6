"""``dcp bench gpu``: the project's checks for a machine with one GPU, in one command.

In one process on one GPU (and W = 1 with NCCL through the manager):

1. the GPU tests (``pytest tests/gpu``, in a subprocess);
2. the dual-layer profile of the paper's shapes at reduced depth (Transformer-1D 5B and Transformer-2D 1.2B
   with 8 layers, in the run's precision, bf16 on CUDA) against measured whole-model steps: time and memory
   at r = 0 and r = L, predicted by the planner's own Eq. 4-6 from the measured rows; on CUDA profiled with
   the default clock (wall) and again with the pipelined clock (``time_err_median_pct_by_clock``);
3. padded vs unpadded micro-batch efficiency: a Transformer-1D micro-batch of lengths [8192, 6000, 4000,
   2000] (right-padded to 8192) against the same samples run unpadded, one per micro-batch (same real tokens
   and the same attention work): efficiency = unpadded time / padded time (1.0: padding costs nothing); and
   16 documents of 64 tokens as equal rows against packed in one row (attention per document):
   ``many_docs_efficiency``;
4. host-device synchronisations per micro-batch (``torch.cuda.set_sync_debug_mode('warn')``, counted) and the
   GPU busy fraction of a short (1 x 1024 tokens) micro-batch: union of the CUDA kernels' intervals
   (torch.profiler) over the median wall time of the same micro-batch run without the profiler, with the
   host's enqueue time and the GPU's time of that step (``short_host_ms``, ``short_gpu_ms``), and in bf16
   the same on a bf16 module without autocast (``bf16_module``);
5. a short ``dcp sweep`` (bucket, packed, DCP-inter, DCP-intra, tiny models) through the manager at W = 1
   (NCCL) with each engine whose package is installed.

Prints a table; ``--json`` adds a last line ``{"time_err_median_pct", "mem_err_median_pct",
"padded_efficiency", "syncs_per_micro_batch", "gpu_busy_short", "manager_runs_ok", "engines", ...}``.
Without CUDA it says so and prints ``{"cuda": false}`` (exit 0). ``--device cpu --tiny`` (hidden) runs the
same code on CPU with tiny shapes (no sync count, no busy fraction): what the unit tests exercise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dcp.bench.gpu_engines import installed_engines
from dcp.bench.gpu_steps import (
    gpu_busy_fraction,
    host_and_gpu_ms,
    sync_device,
    syncs_per_micro_batch,
    train_step,
)
from dcp.config import COMPILE_MODES

PADDED_LENGTHS = (8192, 6000, 4000, 2000)
MANY_DOCS = (16, 64)
"""(documents, tokens each) of the many-documents check: a 1024-token micro-batch of short samples."""
SHORT_TOKENS = 1024
# (model, [(seq_len, micro_batch_size)]) of the dual-layer check
PAPER_CELLS = (("t1d-5b", ((2048, 2), (8192, 1))), ("t2d-1.2b", ((4096, 1), (16384, 1))))
TINY_CELLS = (("t1d-tiny", ((32, 1),)), ("t2d-tiny", ((32, 1),)))
# (model, [(seq_len, b)]) of ``--only clock``: shapes the calibration file does not hold (3k x 3, 12k, 48k)
CLOCK_CELLS = (("t1d-5b", ((3072, 3), (12288, 1))), ("t2d-1.2b", ((49152, 1),)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    parser.add_argument("--layers", type=int, default=8, help="layers of the paper-shaped models (default 8)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per measurement (median)")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU test suite (pytest tests/gpu)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the short sweep through the manager")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                        help="compute precision (auto: bf16 on CUDA)")
    parser.add_argument("--compile", default="off", choices=COMPILE_MODES,
                        help="runtime.compile of every model the checks build and of the sweep's runs (default off; "
                             "--only checks run eager, and --only short compares eager and compiled itself)")
    parser.add_argument("--only", default="all", choices=("all", "short", "clock", "knobs", "cp", "engines", "sweeps"),
                        help="all: the checks above; short: busy share and tokens/s of 1k-8k-token micro-batches, "
                             "eager vs compiled blocks (dcp.bench.gpu_short); clock: the profiling clocks' "
                             "predictions against measured steps on shapes the calibration file does not hold; "
                             "knobs: step time with advanced.prefetch and advanced.cache_weight_casts each on and off, "
                             "through the manager at W = 1 (dcp.bench.gpu_knobs); cp: context-parallel attention "
                             "kernels against one call (dcp.bench.gpu_cp); engines: each engine's peak memory "
                             "against the memory model at W = 1 (dcp.bench.gpu_engines); sweeps: the manager sweeps alone")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help=argparse.SUPPRESS)
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)


# ----- measurements (each takes its device explicitly) --------------------------------------------------
def _timed_step(model: Any, batch: Any, ctx: Any, r: int, precision: str, device: Any, reps: int) -> float:
    train_step(model, batch, ctx, r, precision, device)  # warm-up
    times = []
    for _ in range(reps):
        sync_device(device)
        t0 = time.perf_counter()
        train_step(model, batch, ctx, r, precision, device)
        sync_device(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _step_peak_bytes(model: Any, batch: Any, ctx: Any, r: int, precision: str, device: Any, state_b: float) -> float:
    """Peak memory of one step: allocator peak above the pre-step level plus the state bytes (CUDA), or the
    saved-tensor peak plus the state bytes (CPU), the quantity Eq. 6 predicts."""
    import torch

    from dcp.profiler.memory import SavedTensorMeter

    if device.type == "cuda":
        sync_device(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        train_step(model, batch, ctx, r, precision, device)
        sync_device(device)
        return float(torch.cuda.max_memory_allocated(device) - base) + state_b
    with SavedTensorMeter(exclude=list(model.parameters())) as meter:
        train_step(model, batch, ctx, r, precision, device, reentrant=True)
    return float(meter.peak_bytes) + state_b


def _build(name: str, layers: int, device: Any, compile_mode: str) -> Any:
    """The named model at ``layers`` layers on ``device``, its blocks compiled with ``compile_mode``
    (runtime.compile; Inductor on CUDA, torch.compile's aot_eager backend on the CPU test path)."""
    from dcp.models import build_model
    from dcp.runtime.compiled import compile_layers

    model = build_model(name, num_layers=layers).to(device)
    compile_layers(model, compile_mode, backend="inductor" if device.type == "cuda" else "aot_eager")
    return model


def dual_layer_rows(name: str, cells: tuple, device: Any, precision: str, layers: int, reps: int,
                    clocks: tuple[str, ...] = ("auto",), compile_mode: str = "off") -> list[dict]:
    """Predicted (dual-layer rows, Eq. 4-6) vs measured whole-model time and memory at r = 0 and r = L.

    Each cell is profiled once per profiling clock in ``clocks`` (dcp.profiler.clock, resolved on ``device``):
    ``pred_time_s`` comes from the first, ``pred_time_s_by_clock`` holds all of them."""
    import dataclasses

    import torch

    from dcp.distributed import autocast
    from dcp.planner.cost import micro_batch_mem_bytes, micro_batch_time_s
    from dcp.profiler.adapters import get_adapter
    from dcp.profiler.clock import resolve_clock
    from dcp.profiler.dual_layer import _row
    from dcp.profiler.measure import MeasureSettings, measure_candidate
    from dcp.runtime.context import SPContext

    model = _build(name, layers, device, compile_mode)
    adapter = get_adapter(model)
    for p in model.parameters():  # a training step has gradient buffers: both sides count them
        p.grad = torch.zeros_like(p)
    state_b = float(sum(p.numel() * p.element_size() * 2 for p in model.parameters()))
    ctx = SPContext.single(attention="auto")
    base = MeasureSettings(warmup_iters=1, measure_iters=reps, state_bytes=state_b,
                           meter="allocator" if device.type == "cuda" else "saved")
    out = []
    for s, b in cells:
        by_clock = {}
        for clock in clocks:
            with autocast(precision, device):  # as the profiler measures (dual_layer.profile_table)
                m = measure_candidate(adapter, ctx, b, s, dataclasses.replace(base, clock=clock))
            if m is None:
                raise RuntimeError(f"{name} s={s} b={b} ran out of memory while profiling: lower the shapes")
            by_clock[resolve_clock(clock, device)] = _row(0, s, b, 1, adapter.num_layers, m)
        row = next(iter(by_clock.values()))
        batch = adapter.synthetic_batch(b, s, generator=torch.Generator().manual_seed(s + b)).to(device)
        for r in (0, adapter.num_layers):
            meas_t = _timed_step(model, batch, ctx, r, precision, device, reps)
            meas_m = _step_peak_bytes(model, batch, ctx, r, precision, device, state_b)
            out.append({"model": name, "seq_len": s, "b": b, "r": r,
                        "pred_time_s": micro_batch_time_s(row, r), "meas_time_s": meas_t,
                        "pred_time_s_by_clock": {c: micro_batch_time_s(x, r) for c, x in by_clock.items()},
                        "pred_mem_bytes": micro_batch_mem_bytes(row, r), "meas_mem_bytes": meas_m})
        for p in model.parameters():
            p.grad.zero_()
    del model
    return out


def padded_efficiency(name: str, lengths: tuple[int, ...], device: Any, precision: str, layers: int,
                      reps: int, compile_mode: str = "off") -> dict:
    """Unpadded time (each sample alone) / padded time (one right-padded micro-batch) for the same samples."""
    import torch

    from dcp.data import collate_tokens
    from dcp.runtime.context import SPContext

    model = _build(name, layers, device, compile_mode)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in lengths]
    ctx = SPContext.single(attention="auto")
    padded = collate_tokens(seqs).to(device)
    singles = [collate_tokens([s]).to(device) for s in seqs]
    t_pad, t_one = [], []
    for _ in range(reps):  # interleaved, so a slow phase hits both sides
        t_pad.append(_timed_step(model, padded, ctx, 0, precision, device, 1))
        t_one.append(sum(_timed_step(model, one, ctx, 0, precision, device, 1) for one in singles))
    model.zero_grad(set_to_none=True)
    tp, tu = statistics.median(t_pad), statistics.median(t_one)
    return {"lengths": list(lengths), "padded_s": tp, "unpadded_s": tu, "efficiency": tu / tp}


def many_docs_efficiency(name: str, docs: int, doc_len: int, device: Any, precision: str, layers: int,
                         reps: int, compile_mode: str = "off") -> dict:
    """Time of ``docs`` equal rows of ``doc_len`` tokens (one attention call for all) / time of the same
    documents packed into one row (the last one token shorter, so the micro-batch has unequal lengths): what
    running attention per document costs a short micro-batch of many samples (1.0: nothing)."""
    import torch

    from dcp.data import collate_tokens
    from dcp.runtime.context import SPContext

    model = _build(name, layers, device, compile_mode)
    gen = torch.Generator().manual_seed(2)
    lens = [doc_len] * docs
    equal = collate_tokens([torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in lens])
    packed = collate_tokens([torch.randint(0, model.config.vocab_size, (n,), generator=gen)
                             for n in lens[:-1] + [doc_len - 1]])
    if model.packs(equal) or not model.packs(packed):
        raise RuntimeError(f"{name}: the many-documents check needs equal rows and one packed row")
    ctx = SPContext.single(attention="auto")
    t_eq, t_pk = [], []
    for _ in range(reps):  # interleaved
        t_eq.append(_timed_step(model, equal.to(device), ctx, 0, precision, device, 1))
        t_pk.append(_timed_step(model, packed.to(device), ctx, 0, precision, device, 1))
    model.zero_grad(set_to_none=True)
    te, tp = statistics.median(t_eq), statistics.median(t_pk)
    return {"docs": docs, "doc_len": doc_len, "equal_rows_s": te, "packed_s": tp, "efficiency": te / tp}


def manager_sweep(engine: str, device: str, out_dir: str, *, models: tuple[str, ...] = ("t1d-tiny", "t2d-tiny"),
                  methods: tuple[str, ...] = (), compile_mode: str = "off") -> dict:
    """A short sweep (all four methods by default, tiny models, W = 1) through the manager; ok when every run
    finished with a measured throughput. ``compile_mode``: the runs' runtime.compile."""
    from dcp.experiments.launch import launch_local
    from dcp.experiments.sweep import METHODS, sweep_from_dict

    cuda = device == "cuda"
    raw = {
        "sweep": {"name": f"bench_gpu_{engine}", "world_sizes": [1], "models": list(models),
                  "datasets": ["short"], "methods": list(methods or METHODS), "steps": 2, "warmup_steps": 1,
                  "num_samples": 192, "scale": "cpu", "device": device, "backend": "nccl" if cuda else "gloo",
                  "executor": "manager", "out_dir": out_dir, "refresh_profile": True},
        "config": {"profiling": {"seq_group_edges": [64, 128, 256, 512, 1024, 2048], "max_micro_batch_size": 4,
                                 "cache_dir": str(Path(out_dir) / "cache")},
                   "advanced": {"warmup_iters": 1, "measure_iters": 1},
                   "planning": {"sp_sizes": [1], "mem_capacity_gib": 4.0 if cuda else 0.5, "ranks_per_node": 1},
                   "runtime": {"engine": engine, "log_every": 1000, "compile": compile_mode}},
    }
    spec = sweep_from_dict(raw)
    expected = len(spec.expand())
    try:
        outcomes = launch_local(spec, quiet=True, timeout_s=1800.0)
    except Exception as exc:  # noqa: BLE001 - a failed run is a result of the check, reported with its cause
        return {"engine": engine, "runs": 0, "expected": expected, "ok": False, "error": str(exc).splitlines()[-1]}
    done = [o["run"] for o in outcomes if float(o["run"].get("tokens_per_s", 0)) > 0]
    return {"engine": engine, "runs": len(done), "expected": expected, "ok": len(done) == expected, "error": ""}


def gpu_tests(repo: Path) -> dict:
    """``pytest tests/gpu`` in a subprocess: pass/fail/skip counts from its summary line."""
    folder = repo / "tests" / "gpu"
    if not folder.is_dir():
        return {"rc": -1, "summary": f"{folder} not found (run from a checkout of the project)"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
                          cwd=repo, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return {"rc": proc.returncode, "summary": lines[-1] if lines else proc.stderr.strip()[-200:]}


# ----- the command ---------------------------------------------------------------------------------------
def _err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0 if meas > 0 else float("nan")


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from dcp.distributed import resolve_precision

    want = args.device
    if want in ("auto", "cuda") and not torch.cuda.is_available():
        print("dcp bench gpu: no CUDA device is visible here (torch.cuda.is_available() is False); "
              "run it on a machine with a GPU")
        print(json.dumps({"cuda": False}))
        return 0
    if args.layers < 2:
        raise ValueError(f"--layers ({args.layers}) must be >= 2: the dual-layer profiler measures layer 1")
    if args.reps < 1:
        raise ValueError(f"--reps ({args.reps}) must be >= 1: the median needs at least one timed repetition")
    device = torch.device("cuda", torch.cuda.current_device()) if want != "cpu" else torch.device("cpu")
    precision = resolve_precision(args.precision, device)
    tiny = args.tiny
    cells = TINY_CELLS if tiny else PAPER_CELLS
    layers = 2 if tiny else args.layers
    t1d = "t1d-tiny" if tiny else "t1d-5b"
    lengths = tuple(n // 256 for n in PADDED_LENGTHS) if tiny else PADDED_LENGTHS
    short = 32 if tiny else SHORT_TOKENS
    if args.only != "all":
        return _run_only(args.only, t1d, device, precision, layers, args.reps, tiny, args.json)
    engines = installed_engines()
    repo = Path(__file__).resolve().parents[2]
    steps = (["tests"] if not args.no_tests else []) + [f"dual-layer {m}" for m, _ in cells] + ["padded", "many docs"]
    steps += ["syncs + busy"] if device.type == "cuda" else []
    steps += [f"sweep {e}" for e in engines] if not args.no_sweep else []
    summary: dict[str, Any] = {"cuda": device.type == "cuda", "device": str(device), "precision": precision,
                               "compile": args.compile}
    rows: list[dict] = []
    sweeps: list[dict] = []
    bar = tqdm(total=len(steps), desc="bench gpu", unit="check")
    try:
        for step in steps:
            bar.set_postfix_str(step)
            if step == "tests":
                summary["gpu_tests"] = gpu_tests(repo)
            elif step.startswith("dual-layer"):
                name = step.split()[1]
                clocks = ("auto", "pipelined") if device.type == "cuda" else ("auto",)
                rows += dual_layer_rows(name, dict(cells)[name], device, precision, layers, args.reps, clocks,
                                        args.compile)
            elif step == "padded":
                summary["padded"] = padded_efficiency(t1d, lengths, device, precision, layers, args.reps, args.compile)
            elif step == "many docs":
                docs, doc_len = (8, 8) if tiny else MANY_DOCS
                summary["many_docs"] = many_docs_efficiency(t1d, docs, doc_len, device, precision, layers, args.reps,
                                                            args.compile)
            elif step == "syncs + busy":
                from dcp.data import collate_tokens

                model = _build(t1d, layers, device, args.compile)
                gen = torch.Generator().manual_seed(1)
                batch = collate_tokens([torch.randint(0, model.config.vocab_size, (short,), generator=gen)]).to(device)
                summary["short_tokens"] = short
                summary["syncs_per_micro_batch"] = syncs_per_micro_batch(model, batch, device, precision)
                summary["gpu_busy_short"] = round(gpu_busy_fraction(model, batch, device, precision), 3)
                host_ms, gpu_ms = host_and_gpu_ms(model, batch, device, precision)
                summary.update(short_host_ms=host_ms and round(host_ms, 3), short_gpu_ms=gpu_ms and round(gpu_ms, 3))
                if precision == "bf16":
                    # the same micro-batch on a bf16 module without autocast, as DeepSpeed's bf16 mode runs it:
                    # no weight casts and no fp32 gradient accumulation in the step
                    model.to(torch.bfloat16)
                    busy = gpu_busy_fraction(model, batch, device, "fp32")
                    host_ms, gpu_ms = host_and_gpu_ms(model, batch, device, "fp32")
                    summary["bf16_module"] = {"gpu_busy_short": round(busy, 3),
                                              "short_host_ms": host_ms and round(host_ms, 3),
                                              "short_gpu_ms": gpu_ms and round(gpu_ms, 3)}
                del model
            elif step.startswith("sweep"):
                with tempfile.TemporaryDirectory(prefix="dcp-bench-gpu-") as tmp:
                    sweeps.append(manager_sweep(step.split()[1], device.type, tmp, compile_mode=args.compile))
            # each check's figures as soon as it ends: a run stopped at a time limit keeps what it measured
            bar.write(f"[{step}] " + json.dumps(_step_figures(step, rows, summary, sweeps), default=str))
            bar.update(1)
    finally:
        bar.close()
    _print_table(rows, summary, sweeps)
    t_errs = [_err(r["pred_time_s"], r["meas_time_s"]) for r in rows]
    m_errs = [_err(r["pred_mem_bytes"], r["meas_mem_bytes"]) for r in rows]
    clocks = rows[0]["pred_time_s_by_clock"] if rows else {}
    by_clock = {c: _median([_err(r["pred_time_s_by_clock"][c], r["meas_time_s"]) for r in rows]) for c in clocks}
    summary.update(
        time_err_median_pct=_median(t_errs), time_err_median_pct_by_clock=by_clock, mem_err_median_pct=_median(m_errs),
        padded_efficiency=round(summary["padded"]["efficiency"], 3),
        many_docs_efficiency=round(summary["many_docs"]["efficiency"], 3),
        syncs_per_micro_batch=summary.get("syncs_per_micro_batch"), gpu_busy_short=summary.get("gpu_busy_short"),
        manager_runs_ok=all(s["ok"] for s in sweeps) if sweeps else None,
        engines=[s["engine"] for s in sweeps] if sweeps else engines, sweeps=sweeps,
    )
    summary.pop("padded")
    summary.pop("many_docs")
    if args.json:
        print(json.dumps(summary))
    return 0


def _step_figures(step: str, rows: list[dict], summary: dict, sweeps: list[dict]) -> Any:
    if step.startswith("dual-layer"):
        name = step.split()[1]
        return [{k: r[k] for k in ("seq_len", "b", "r", "meas_time_s", "pred_time_s_by_clock", "pred_mem_bytes",
                                   "meas_mem_bytes")} for r in rows if r["model"] == name]
    if step.startswith("sweep"):
        return sweeps[-1]
    keys = {"tests": ("gpu_tests",), "padded": ("padded",), "many docs": ("many_docs",),
            "syncs + busy": ("syncs_per_micro_batch", "gpu_busy_short", "short_host_ms", "short_gpu_ms",
                             "bf16_module")}[step]
    return {k: summary.get(k) for k in keys}


def _run_only(only: str, t1d: str, device: Any, precision: str, layers: int, reps: int, tiny: bool,
              as_json: bool) -> int:
    """``--only short``, ``clock``, ``knobs``, ``cp``, ``engines`` or ``sweeps``: one focused check, its table and
    (``--json``) its JSON line."""
    from dcp.bench.gpu_knobs import knob_rows, print_knobs
    from dcp.bench.gpu_short import best_busy, print_short, short_rows

    head = {"cuda": device.type == "cuda", "device": str(device), "precision": precision, "check": only}
    if only == "cp":
        from dcp.bench.gpu_cp import print_cp, run_cp

        rows = run_cp(device, precision, reps, tiny)
        print_cp(rows)
        head.update(rows=rows, cp_equal=all(r["equal"] for r in rows))
    elif only == "engines":
        from dcp.bench.gpu_engines import print_engines, run_engines

        with tempfile.TemporaryDirectory(prefix="dcp-bench-gpu-") as tmp:
            rows = run_engines(device, tiny, tmp)
        print_engines(rows)
        head.update(rows=rows)
    elif only == "sweeps":  # each engine's sweep through the manager, without the rest of the bench
        sweeps = []
        for engine in installed_engines():
            with tempfile.TemporaryDirectory(prefix="dcp-bench-gpu-") as tmp:
                sweeps.append(manager_sweep(engine, device.type, tmp))
            print(f"[sweep {engine}] " + json.dumps(sweeps[-1]), flush=True)
        head.update(sweeps=sweeps, manager_runs_ok=all(s["ok"] for s in sweeps))
    elif only == "knobs":
        rows = knob_rows(cuda=device.type == "cuda", precision=precision, layers=layers, tiny=tiny)
        print_knobs(rows)
        head.update(rows=rows)
    elif only == "short":
        # tiny: lengths / 256 and torch.compile's aot_eager backend (no code generation), as the CPU tests run it
        rows = short_rows(t1d, device, precision, layers, reps, scale=256 if tiny else 1,
                          backend="aot_eager" if tiny else "inductor",
                          progress=lambda r: print(f"  {r['variant']}/{r['weights']} {r['layout']} {r['tokens']}: "
                                                   f"{r['wall_ms']:.2f} ms, busy {r['busy']}, host {r['host_ms']} "
                                                   f"ms, GPU {r['gpu_ms']} ms", flush=True))
        print_short(rows)
        head.update(rows=rows, busy_1024=best_busy(rows, 4 if tiny else SHORT_TOKENS))
    else:
        cells = TINY_CELLS if tiny else CLOCK_CELLS
        clocks = ("auto", "pipelined") if device.type == "cuda" else ("auto",)
        rows = [r for name, c in cells for r in dual_layer_rows(name, c, device, precision, layers, reps, clocks)]
        for r in rows:
            errs = "  ".join(f"{c} {t * 1e3:.2f} ms ({_err(t, r['meas_time_s']):.2f}%)"
                             for c, t in r["pred_time_s_by_clock"].items())
            print(f"{r['model']:<9} s={r['seq_len']:>6} b={r['b']} r={r['r']:>2} measured "
                  f"{r['meas_time_s'] * 1e3:.2f} ms; predicted {errs}")
        by_clock = {c: _median([_err(r["pred_time_s_by_clock"][c], r["meas_time_s"]) for r in rows])
                    for c in rows[0]["pred_time_s_by_clock"]}
        print(f"median time error by clock: {by_clock}")
        head.update(rows=rows, time_err_median_pct_by_clock=by_clock)
    if as_json:
        print(json.dumps(head))
    return 0


def _print_table(rows: list[dict], summary: dict, sweeps: list[dict]) -> None:
    clocks = list(rows[0]["pred_time_s_by_clock"]) if rows else []
    print(f"device {summary['device']}, precision {summary['precision']}, profiled with clock "
          f"{' and '.join(clocks)} (pred_ms: {clocks[0] if clocks else '-'})")
    if "gpu_tests" in summary:
        print(f"tests/gpu: {summary['gpu_tests']['summary']} (exit {summary['gpu_tests']['rc']})")
    print(f"{'model':<9} {'seq':>6} {'b':>2} {'r':>3} {'pred_ms':>9} {'meas_ms':>9} {'t_err%':>7} "
          f"{'pred_MiB':>10} {'meas_MiB':>10} {'m_err%':>7}")
    for r in rows:
        # profiled under further clocks (CUDA: 'pipelined' besides the default 'wall'): their prediction and error
        others = "".join(f"  {c}: {t * 1e3:.2f} ms ({_err(t, r['meas_time_s']):.2f}%)"
                         for c, t in list(r["pred_time_s_by_clock"].items())[1:])
        print(f"{r['model']:<9} {r['seq_len']:>6} {r['b']:>2} {r['r']:>3} {r['pred_time_s'] * 1e3:>9.2f} "
              f"{r['meas_time_s'] * 1e3:>9.2f} {_err(r['pred_time_s'], r['meas_time_s']):>7.2f} "
              f"{r['pred_mem_bytes'] / 2**20:>10.1f} {r['meas_mem_bytes'] / 2**20:>10.1f} "
              f"{_err(r['pred_mem_bytes'], r['meas_mem_bytes']):>7.2f}{others}")
    pad = summary["padded"]
    print(f"padded micro-batch {pad['lengths']}: {pad['padded_s'] * 1e3:.1f} ms vs unpadded {pad['unpadded_s'] * 1e3:.1f}"
          f" ms -> efficiency {pad['efficiency']:.3f}")
    many = summary["many_docs"]
    print(f"{many['docs']} documents of {many['doc_len']} tokens: {many['equal_rows_s'] * 1e3:.1f} ms as equal rows, "
          f"{many['packed_s'] * 1e3:.1f} ms packed in one row (attention per document) -> efficiency "
          f"{many['efficiency']:.3f}")
    if "syncs_per_micro_batch" in summary:
        print(f"host-device syncs per micro-batch: {summary['syncs_per_micro_batch']}; "
              f"GPU busy share of a {summary['short_tokens']}-token micro-batch: {summary['gpu_busy_short']:.3f}")
        if summary["short_host_ms"] is None:
            print("  host vs GPU time of that micro-batch: not measured (the host blocked inside the step)")
        else:
            print(f"  the host enqueues it in {summary['short_host_ms']:.2f} ms, the GPU runs it in "
                  f"{summary['short_gpu_ms']:.2f} ms")
        if "bf16_module" in summary:
            bf = summary["bf16_module"]
            print(f"  on a bf16 module without autocast (DeepSpeed's bf16 mode): busy {bf['gpu_busy_short']:.3f}, "
                  f"host {bf['short_host_ms']} ms, GPU {bf['short_gpu_ms']} ms")
    else:
        print("syncs per micro-batch and GPU busy share: not measured (no CUDA)")
    for s in sweeps:
        status = "ok" if s["ok"] else f"FAILED {s['error']}"
        print(f"sweep through the manager, engine {s['engine']}: {s['runs']}/{s['expected']} runs {status}")
