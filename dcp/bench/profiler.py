"""``dcp bench profiler``: how well two profiled layers predict a whole training step.

For the tiny Transformer-1D and Transformer-2D (widened so that layer time dominates Python overhead)
on W = 2 gloo processes (one thread each), over a grid of sequence lengths, micro-batch sizes and SP
sizes, it compares

- the dual-layer prediction with full recompute: time ``L * (2 t_f + t_b) + T_C``, memory
  ``L * m_inp + M_C`` (Eq. 6 at r = L), from :func:`~dcp.profiler.measure.measure_candidate`;
- a measured full step: the model's own ``forward`` (every layer checkpointed) + backward, timed the
  same way; its memory is the peak of live saved-tensor bytes plus parameters, gradients and optimizer
  state, with layers checkpointed reentrantly so the meter sees their recomputation (non-reentrant
  checkpoint hides it, see dcp.profiler.memory).

Profiling and the measured step alternate repetition by repetition and the medians are compared, so a
slow phase of a shared machine hits both sides alike. It then profiles a whole table (the grid's lengths
as seq_groups) and compares that wall time with one epoch of a small demo workload: the sum of the
predicted step times of ``plan_epoch`` over a synthetic dataset, planned from the measured table.

One row per measurement; with ``--json`` the last line is
``{"time_err_median_pct", "time_err_p90_pct", "mem_err_median_pct", "mem_err_p90_pct", "profile_wall_s", ...}``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dcp.argtypes import int_list, positive_int, process_count
from dcp.bench import common

MODELS = ("t1d-tiny", "t2d-tiny")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_json(parser)
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of t1d-tiny, t2d-tiny")
    parser.add_argument("--lengths", default="256,512,1024,2048", help="sequence lengths (tokens)")
    parser.add_argument("--batch-sizes", default="1,2", help="micro-batch sizes")
    parser.add_argument("--sp-sizes", default="1,2", help="SP sizes (each <= --nproc)")
    common.add_model_size(parser, of=" of the benchmarked models")
    parser.add_argument("--reps", type=positive_int, default=5, help="alternating repetitions (medians are compared)")
    parser.add_argument("--nproc", type=process_count, default=2, help="gloo processes (W)")
    parser.add_argument("--epoch-samples", type=int, default=256, help="samples of the demo epoch")
    parser.add_argument("--timing", default="checkpoint", choices=("checkpoint", "plain"),
                        help="checkpoint: t_f, t_b exact at r = 0 and r = L; plain: the paper's raw t_f, t_b")
    common.add_clock(parser, "wall")


def _percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _full_step(model: Any, batch: Any, ctx: Any, reentrant: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    if reentrant:
        def recompute(layer: Any, hidden: Any, c: Any, aux: Any) -> Any:
            return checkpoint(layer, hidden, c, aux, use_reentrant=True)

        loss, _ = model(batch, ctx, recompute=recompute)
    else:
        loss, _ = model(batch, ctx.replace(recompute_layers=model.config.num_layers))
    loss.backward()


def _cell(model: Any, ctx: Any, s: int, b: int, reps: int, state_b: float, clock: str, timing: str) -> dict[str, float]:
    import statistics

    import torch

    from dcp.profiler.adapters import get_adapter
    from dcp.profiler.measure import MeasureSettings, _timed, group_max, measure_candidate
    from dcp.profiler.memory import SavedTensorMeter

    adapter = get_adapter(model)
    L = adapter.num_layers
    settings = MeasureSettings(warmup_iters=0, measure_iters=1, state_bytes=state_b, clock=clock, timing=timing)
    batch = adapter.synthetic_batch(b, s, generator=torch.Generator().manual_seed(s * 7 + b))
    params = list(model.parameters())
    with SavedTensorMeter(exclude=params) as meter:
        _full_step(model, batch, ctx, reentrant=True)
    model.zero_grad(set_to_none=False)
    measure_candidate(adapter, ctx, b, s, settings)  # warm-up of both sides
    _timed(lambda: _full_step(model, batch, ctx, reentrant=False), torch.device("cpu"), ctx, clock)
    pred_t, meas_t, pred_m = [], [], 0.0
    for _ in range(reps):
        m = measure_candidate(adapter, ctx, b, s, settings)
        pred_t.append(L * (2 * m.t_f_s + m.t_b_s) + m.t_const_s)
        pred_m = L * m.m_inp_bytes + m.m_const_bytes
        t, _ = _timed(lambda: _full_step(model, batch, ctx, reentrant=False), torch.device("cpu"), ctx, clock)
        meas_t.append(t)
    model.zero_grad(set_to_none=True)
    pt, mt, mm = group_max([statistics.median(pred_t), statistics.median(meas_t), meter.peak_bytes + state_b], ctx)
    return {"pred_time_s": pt, "meas_time_s": mt, "pred_mem_bytes": pred_m, "meas_mem_bytes": mm}


def _worker(rank: int, world_size: int, spec: dict[str, Any]) -> dict[str, Any] | None:
    import random
    import time

    import torch

    from dcp.config import DCPConfig, PlanningConfig, ProfilingConfig
    from dcp.models import build_model
    from dcp.planner import plan_epoch
    from dcp.profiler.dual_layer import profile_table
    from dcp.profiler.memory import state_bytes
    from dcp.runtime.context import SPContext
    from dcp.runtime.registry import SPGroupRegistry

    torch.set_num_threads(1)
    sp_sizes = sorted(set(spec["sp_sizes"]) | {1})
    registry = SPGroupRegistry(world_size, world_size, sp_sizes)
    cells, profiles = [], []
    from tqdm.auto import tqdm

    # one step per measured cell (model, p, seq_len, b) plus one per model's whole-table profile
    per_model = len(spec["sp_sizes"]) * len(spec["lengths"]) * len(spec["batch_sizes"]) + 1
    bar = tqdm(total=len(spec["models"]) * per_model, desc="bench profiler", unit="cell", disable=rank != 0,
               dynamic_ncols=True)
    for name in spec["models"]:
        model = build_model(name, hidden_size=spec["hidden_size"], num_layers=spec["num_layers"])
        state_b = float(state_bytes(model).total_bytes)
        for p in spec["sp_sizes"]:
            # p = 1: every rank runs the same candidate on its own (like data-parallel replicas)
            ctx = SPContext.single() if p == 1 else SPContext(group=registry.get(0, p), sp_size=p, sp_rank=rank)
            if rank >= p and p > 1:
                continue
            for s in spec["lengths"]:
                for b in spec["batch_sizes"]:
                    bar.set_postfix_str(f"{name} s={s} b={b} p={p}")
                    res = _cell(model, ctx, s, b, spec["reps"], state_b, spec["clock"], spec["timing"])
                    cells.append({"model": name, "seq_len": s, "b": b, "p": p, **res})
                    bar.update()
        torch.distributed.barrier()
        # Whole-table profiling wall time vs one demo epoch planned from that table.
        config = DCPConfig(
            model=model.config.shape(),
            profiling=ProfilingConfig(seq_group_edges=tuple(spec["lengths"]), max_micro_batch_size=4),
            planning=PlanningConfig(mem_capacity_gib=spec["mem_capacity_gib"], sp_sizes=tuple(sp_sizes),
                                    ranks_per_node=world_size),
        )
        bar.set_postfix_str(f"{name} whole-table profile")
        t0, c0 = time.perf_counter(), time.process_time()
        table = profile_table(model, config, world_size, registry, rank=rank, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rng = random.Random(0)
        lengths = [rng.randint(64, max(spec["lengths"])) for _ in range(spec["epoch_samples"])]
        plans = plan_epoch(lengths, table, config, world_size)
        epoch_s = sum(pl.step_time_s for pl in plans)
        profiles.append({"model": name, "profile_wall_s": wall, "profile_cpu_s": cpu, "epoch_pred_s": epoch_s,
                         "steps": len(plans),
                         "rows": len(table)})
        bar.update()
    bar.close()
    return {"cells": cells, "profiles": profiles} if rank == 0 else None


def _err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


def run(args: argparse.Namespace) -> int:
    from dcp.distributed.launch import run_distributed

    spec = {
        "models": [m for m in args.models.split(",") if m],
        "lengths": int_list(args.lengths, "--lengths"),
        "batch_sizes": int_list(args.batch_sizes, "--batch-sizes"),
        "sp_sizes": int_list(args.sp_sizes, "--sp-sizes"),
        "hidden_size": args.hidden_size,
        "num_layers": args.num_layers,
        "reps": args.reps,
        "epoch_samples": args.epoch_samples,
        "mem_capacity_gib": 8.0,
        "clock": args.clock,
        "timing": args.timing,
    }
    bad = [m for m in spec["models"] if m not in MODELS]
    if bad:
        raise ValueError(f"--models ({args.models!r}) contains {bad}: use {list(MODELS)}")
    if max(spec["sp_sizes"]) > args.nproc:
        raise ValueError(f"--sp-sizes ({args.sp_sizes}) exceed --nproc ({args.nproc}): use sizes <= nproc")
    out = run_distributed(_worker, args.nproc, spec, timeout_s=3600.0, pg_timeout_s=900.0)[0]
    t_errs, m_errs = [], []
    print(f"{'model':<9} {'seq':>5} {'b':>2} {'p':>2} {'pred_ms':>9} {'meas_ms':>9} {'t_err%':>7} "
          f"{'pred_MiB':>9} {'meas_MiB':>9} {'m_err%':>7}")
    for c in out["cells"]:
        te, me = _err(c["pred_time_s"], c["meas_time_s"]), _err(c["pred_mem_bytes"], c["meas_mem_bytes"])
        t_errs.append(te)
        m_errs.append(me)
        print(f"{c['model']:<9} {c['seq_len']:>5} {c['b']:>2} {c['p']:>2} {c['pred_time_s'] * 1e3:>9.1f} "
              f"{c['meas_time_s'] * 1e3:>9.1f} {te:>7.2f} {c['pred_mem_bytes'] / 2**20:>9.2f} "
              f"{c['meas_mem_bytes'] / 2**20:>9.2f} {me:>7.2f}")
    for pr in out["profiles"]:
        print(f"profile {pr['model']}: {pr['rows']} rows in {pr['profile_wall_s']:.1f} s wall "
              f"({pr['profile_cpu_s']:.1f} s CPU on rank 0); one demo epoch "
              f"({args.epoch_samples} samples, {pr['steps']} steps) is predicted at {pr['epoch_pred_s']:.1f} s "
              f"(profiling = {pr['profile_wall_s'] / max(pr['epoch_pred_s'], 1e-9):.2f} epochs)")
    summary = {
        "time_err_median_pct": round(_percentile(t_errs, 50), 3),
        "time_err_p90_pct": round(_percentile(t_errs, 90), 3),
        "mem_err_median_pct": round(_percentile(m_errs, 50), 3),
        "mem_err_p90_pct": round(_percentile(m_errs, 90), 3),
        "profile_wall_s": round(sum(p["profile_wall_s"] for p in out["profiles"]), 3),
        "profile_cpu_s": round(sum(p["profile_cpu_s"] for p in out["profiles"]), 3),
        "epoch_pred_s": round(sum(p["epoch_pred_s"] for p in out["profiles"]), 3),
        "cells": len(out["cells"]),
        "clock": args.clock,
        "timing": args.timing,
    }
    print(f"time error median {summary['time_err_median_pct']}% p90 {summary['time_err_p90_pct']}%; "
          f"memory error median {summary['mem_err_median_pct']}% p90 {summary['mem_err_p90_pct']}%")
    if args.json:
        print(json.dumps(summary))
    return 0
