"""``dcp bench planner``: planning time per step for several world sizes.

For each W: an analytic table for the default model on W ranks, a long seeded synthetic stream, and
``time.perf_counter`` around every ``next()`` of the EpochPlanner (the per-epoch preparation, done once,
is reported separately as setup_ms). Then the same steps again through ``PlanAhead`` (``dcp.planner.ahead``)
with a consumer that spends ``--step-ms`` per step (sleeping, as a rank waiting on GPU kernels does): the
time ``next()`` still blocks is the exposed cost (exposed_median_ms, exposed_p99_ms); beside them the timed
steps' median predicted idle (idle_median), what the planning time buys. With ``--busy`` the consumer
computes in Python instead of sleeping: a host-bound loop holds the GIL the planning thread needs, so the
plan may not be ready in time (the exposed cost then grows), and the loop's own work slows by about the
planner's CPU time (cpu_median_ms). ``--ahead process`` plans in a child process instead
(``planning.plan_ahead``). One row per W; with --json a last line {"rows": [...]}.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from dcp.config import METHODS, PLAN_AHEAD, DCPConfig, PlanningConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-sizes", default="8,32,256,1024,4096", help="comma-separated W values")
    parser.add_argument("--steps", type=int, default=50, help="steps timed per world size")
    parser.add_argument("--method", choices=METHODS, default="dcp-intra", help="planning method")
    parser.add_argument("--step-ms", type=float, default=200.0,
                        help="simulated compute per step while plans are made ahead (exposed cost)")
    parser.add_argument("--busy", action="store_true",
                        help="the consumer computes --step-ms in Python (holding the GIL) instead of sleeping, as "
                             "a host-bound training loop does: the planning thread then gets the GIL in turns")
    parser.add_argument("--ahead", choices=PLAN_AHEAD, default="thread",
                        help="where the plans are computed ahead (planning.plan_ahead)")
    parser.add_argument("--json", action="store_true", help='print a last line {"rows": [...]}')


def _python_work(step_ms: float) -> Callable[[], None]:
    """A pure-Python loop calibrated (alone) to take ``step_ms``: a training loop's host work, which needs
    the GIL that the planning thread also takes."""
    n = 10_000
    while True:
        t0 = time.perf_counter()
        _spin(n)
        dt = time.perf_counter() - t0
        if dt >= 0.02 or n > 10**9:
            break
        n *= 4
    iters = max(1, int(n * step_ms / 1e3 / dt))
    return lambda: _spin(iters)


def _spin(n: int) -> int:
    acc = 0
    for i in range(n):
        acc += i
    return acc


def bench_world_size(world_size: int, steps: int, method: str = "dcp-intra", step_ms: float = 200.0,
                     busy: bool = False, ahead: str = "thread") -> dict:
    from dcp.planner.analytic import CPU_SMALL, analytic_table_for
    from dcp.planner.assemble import EpochPlanner
    from dcp.planner.lengths import synthetic_lengths

    config = DCPConfig(planning=PlanningConfig(method=method))
    table = analytic_table_for(config, world_size, mem_capacity_bytes=CPU_SMALL.mem_capacity_bytes)
    # Enough samples for `steps` full steps plus the look-ahead window: a balanced step of this workload
    # takes ~30-50 samples per rank and the default window holds ~90 per rank.
    n = (64 * (steps + 1) + 128) * world_size
    lengths = synthetic_lengths(n, table.max_len, seed=1)
    t0 = time.perf_counter()
    planner = EpochPlanner(lengths, table, config, world_size)
    setup = time.perf_counter() - t0
    times, cpu, mbs, idle, samples, done = [], [], [], [], 0, 0
    # The first next() also runs the per-epoch preparation of a generator; time it apart.
    t0 = time.perf_counter()
    first = next(planner)
    setup += time.perf_counter() - t0
    samples += first.samples
    while done < steps:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            plan = next(planner)
        except StopIteration:
            break
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        mbs.append(int(plan.ga_steps.sum()))
        idle.append(plan.idle_ratio_gpu)
        samples += plan.samples
        done += 1
    arr = np.asarray(times) * 1e3
    # Planned ahead: what a rank still waits for next() when each step computes for step_ms.
    from dcp.planner.ahead import planned_ahead

    if busy:
        work = _python_work(step_ms)
    else:
        def work() -> None:
            time.sleep(step_ms / 1e3)
    exposed = []
    kwargs = dict(lengths=lengths, table=table, config=config, world_size=world_size)
    with planned_ahead(kwargs, ahead) as plans:
        next(plans)  # the epoch's first plan (preparation included) is computed before training starts
        work()
        for _ in range(len(times)):
            t0 = time.perf_counter()
            try:
                next(plans)
            except StopIteration:
                break
            exposed.append(time.perf_counter() - t0)
            work()
    ex = np.asarray(exposed) * 1e3
    return {
        "world_size": world_size,
        "method": method,
        "steps": len(times),
        "samples": samples,
        "setup_ms": round(setup * 1e3, 2),
        "median_ms": round(float(np.median(arr)), 3) if len(arr) else float("nan"),
        "p99_ms": round(float(np.percentile(arr, 99)), 3) if len(arr) else float("nan"),
        # Process CPU time: robust when other jobs share the cores (wall time then includes waiting).
        "cpu_median_ms": round(float(np.median(cpu)) * 1e3, 3) if cpu else float("nan"),
        "exposed_median_ms": round(float(np.median(ex)), 3) if len(ex) else float("nan"),
        "exposed_p99_ms": round(float(np.percentile(ex, 99)), 3) if len(ex) else float("nan"),
        "micro_batches_per_step": int(np.median(mbs)) if mbs else 0,
        "us_per_micro_batch": round(float(np.median(arr)) * 1e3 / max(1.0, float(np.median(mbs or [1]))), 2),
        # what the time buys: the planned steps' predicted GPU-weighted idle
        "idle_median": round(float(np.median(idle)), 4) if idle else float("nan"),
        "consumer": "busy" if busy else "sleep",
        "ahead": ahead,
    }


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [int(x) for x in args.world_sizes.split(",") if x.strip()]
    except ValueError:
        print(
            f"dcp bench planner: error: --world-sizes ({args.world_sizes!r}) must be comma-separated integers, "
            "e.g. 8,32,256"
        )
        return 2
    if not sizes or min(sizes) < 1:
        print(f"dcp bench planner: error: --world-sizes ({args.world_sizes!r}) must be integers >= 1, e.g. 8,32,256")
        return 2
    if args.step_ms < 0:
        print(f"dcp bench planner: error: --step-ms ({args.step_ms}) must be >= 0: the simulated compute per step")
        return 2
    if args.steps < 1:
        print(f"dcp bench planner: error: --steps ({args.steps}) must be >= 1: time at least one step")
        return 2
    rows = []
    cols = (
        "world_size",
        "steps",
        "samples",
        "setup_ms",
        "median_ms",
        "p99_ms",
        "cpu_median_ms",
        "exposed_median_ms",
        "micro_batches_per_step",
        "us_per_micro_batch",
        "idle_median",
    )
    print(" ".join(f"{c:>{max(9, len(c))}}" for c in cols))
    from tqdm.auto import tqdm

    for w in (bar := tqdm(sizes, desc="bench planner", unit="W", dynamic_ncols=True)):
        bar.set_postfix_str(f"W={w}")
        r = bench_world_size(w, args.steps, args.method, args.step_ms, args.busy, args.ahead)
        rows.append(r)
        bar.write(" ".join(f"{r[c]!s:>{max(9, len(c))}}" for c in cols))
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0
