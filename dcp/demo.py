"""``dcp demo``: the main job. A small real DCP-vs-baseline comparison on CPU processes.

Two gloo processes (W = 2) train the tiny Transformer-1D on the balanced length distribution with
bucket parallel, DCP-inter and DCP-intra for a few optimizer steps each, through dcp's manager. The
profile table is measured first by the dual-layer profiler (cached in .dcp_cache). The demo prints a
table (method, tokens/s, step time, idle ratio, speedup vs bucket), writes runs.csv, steps.csv,
config.json and summary.png to the output folder (default runs/demo/), and says where they went.

    dcp demo                      # about a minute on 2 cores
    dcp demo --plot               # rebuild the plot and table from runs/demo/runs.csv only
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

DEFAULT_OUT = "runs/demo"

# The demo's sweep, in the same format as experiments/*.toml (kept here so an installed dcp runs it).
DEMO_SWEEP: dict[str, Any] = {
    "sweep": {
        "name": "demo",
        "world_sizes": [2],
        "models": ["t1d-tiny"],
        "datasets": ["balanced"],
        "methods": ["bucket", "dcp-inter", "dcp-intra"],
        "steps": 6,
        "warmup_steps": 1,
        "num_samples": 256,
        "scale": "cpu",
        "seed": 0,
        "device": "cpu",
        "backend": "gloo",
        "launcher": "local",
        "threads_per_rank": 1,
    },
    "config": {
        "profiling": {"seq_group_edges": [128, 256, 512, 1024, 2048], "max_micro_batch_size": 8,
                      "warmup_iters": 1, "measure_iters": 3, "cache_dir": ".dcp_cache"},
        # emulated per-rank memory: 2048-token samples need SP = 2 even with full recompute
        "planning": {"mem_capacity_gib": 0.016, "gmin": 1, "gmax": 4, "ranks_per_node": 8, "sp_sizes": [1, 2, 4]},
        "runtime": {"engine": "ddp", "attention": "sdpa", "log_every": 1000, "stats_every": 1},
    },
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--steps", type=int, default=None, help="measured optimizer steps per method (default 6)")
    parser.add_argument("--world-size", type=int, default=None, help="CPU processes (default 2)")
    parser.add_argument("--dataset", default=None, choices=("short", "balanced", "long"),
                        help="length distribution (default balanced)")
    parser.add_argument("--model", default=None, choices=("t1d-tiny", "t2d-tiny"), help="model (default t1d-tiny)")
    parser.add_argument("--plot", action="store_true", help="only rebuild the plot and table from OUT/runs.csv")


def demo_spec(args: argparse.Namespace) -> Any:
    """The demo's SweepSpec with command-line overrides applied."""
    from dcp.experiments.sweep import sweep_from_dict

    over: dict[str, Any] = {"out_dir": args.out}
    if args.steps is not None:
        over["steps"] = args.steps
    if args.world_size is not None:
        over["world_sizes"] = [args.world_size]
    if args.dataset:
        over["datasets"] = [args.dataset]
    if args.model:
        over["models"] = [args.model]
    return sweep_from_dict(DEMO_SWEEP, overrides=over)


def run(args: argparse.Namespace) -> int:
    from dcp.experiments.plot import format_table, plot_results
    from dcp.experiments.results import read_runs

    out = Path(args.out)
    if args.plot:
        try:
            png = plot_results(out)
        except ValueError as exc:
            print(f"dcp demo --plot: {exc}")
            return 2
        print(format_table(read_runs(out)))
        print(f"plot: {png}")
        return 0
    from dcp.experiments.launch import launch_local

    try:
        spec = demo_spec(args)
    except ValueError as exc:
        print(f"dcp demo: {exc}")
        return 2
    for name in ("runs.csv", "steps.csv", "config.json"):  # a demo folder holds one demo: start afresh
        (out / name).unlink(missing_ok=True)
    t0 = time.perf_counter()
    print(f"dcp demo: {', '.join(spec.methods)} on {spec.models[0]} / {spec.datasets[0]}, "
          f"W={spec.world_sizes[0]} CPU processes (gloo), {spec.steps} measured steps each", flush=True)
    from dcp.testing import DistributedFailure

    try:
        launch_local(spec, quiet=False)
    except DistributedFailure as exc:
        print(f"dcp demo: a run failed:\n{exc}")
        return 1
    png = plot_results(out)
    wall = time.perf_counter() - t0
    print()
    print(format_table(read_runs(out)))
    print()
    print("tokens/s: tokens of the measured steps / their wall time; step_s measured (pred_s: planner's "
          "prediction); idle: GPU-weighted idle fraction measured from per-rank busy times (p_idle: predicted)")
    print(f"files: {out / 'runs.csv'}, {out / 'steps.csv'}, {out / 'config.json'}, {png}")
    print(f"rebuild the plot from the CSV: dcp demo --plot --out {out}")
    print(f"demo wall time: {wall:.0f}s")
    return 0
