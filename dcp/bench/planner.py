"""``dcp bench planner``: planning time per step for several world sizes, and its share of the step.

For each W: an analytic table (the default model ``t1d-tiny`` on ``cpu-small``, or ``--model t1d-5b --hardware
h200`` for a paper scenario) on W ranks, a long seeded synthetic stream, and ``time.perf_counter`` around
every ``next()`` of the EpochPlanner (the per-epoch preparation, done once, is reported separately as
setup_ms). Each planned step is priced by the simulator (``dcp.sim.cluster.step_cost`` on the same table and
hardware, with the gradient sync, optimizer update and control plane ``dcp simulate`` adds): step_time_s is
the timed steps' median, planning_share = cpu_median_ms / step_time_s, the share of a step's time the
planner's CPU takes. The steps are priced afterwards, from the same plans planned again:
pricing between the timed calls (Python, ~3x a plan's CPU) left each next() ~9 ms (~30%) slower at 4096
ranks, a cost of the bench that no run pays. Then the same steps again through ``PlanAhead`` (``dcp.planner.ahead``) with a consumer
that spends each step's simulated time (capped at ``--pace-cap-ms``; or a fixed ``--step-ms``) sleeping, as
a rank waiting on GPU kernels does: the time ``next()`` still blocks is the exposed cost (plan_exposed_ms =
exposed_median_ms, exposed_p99_ms). A pace shorter than the step (the cap) leaves the planner less time, so
the exposed cost it measures is an upper bound of the real one. Beside them the timed steps' median predicted
idle (idle_median), what the planning time buys. With ``--busy`` the consumer computes in Python instead of
sleeping: a host-bound loop holds the GIL the planning thread needs, so the plan may not be ready in time
(the exposed cost then grows), and the loop's own work slows by about the planner's CPU time
(cpu_median_ms). One row per W; with --json a last line {"rows": [...]}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable

import numpy as np

from dcp.argtypes import MAX_WORLD_SIZE
from dcp.config import METHODS, AdvancedConfig, DCPConfig, PlanningConfig

DEFAULT_MODEL = "t1d-tiny"
"""The default model shape (ModelShapeConfig), planned on the ``cpu-small`` table unless --hardware says."""
PACE_CAP_MS = 500.0
"""Longest a consumer at the simulated pace sleeps per step: simulated steps last seconds, the bench not."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dcp.named_models import PAPER_MODELS
    from dcp.sim.hardware import HARDWARE

    parser.add_argument("--world-sizes", default="8,32,256,1024,4096", help="comma-separated W values")
    parser.add_argument("--steps", type=int, default=50, help="steps timed per world size")
    parser.add_argument("--method", choices=METHODS, default="dcp-intra", help="planning method")
    parser.add_argument("--model", choices=(DEFAULT_MODEL, *PAPER_MODELS), default=DEFAULT_MODEL,
                        help="model shape: the default config's, or a paper model (its scenario table, bf16, 80 GB)")
    parser.add_argument("--hardware", choices=tuple(HARDWARE), default="cpu",
                        help="simulated device of the table and of step_time_s (cpu = cpu-small)")
    parser.add_argument("--dataset", default="synthetic",
                        help="lengths: 'synthetic' (log-uniform up to the table's longest) or a distribution of "
                             "dcp.data_dists, e.g. text or t1d-short (paper scale for a paper model, else cpu scale)")
    parser.add_argument("--samples-per-rank", type=int, default=0,
                        help="length of the stream per rank (default 0: 64 (steps + 1) + 128, enough for the synthetic "
                             "stream; a dataset of short documents puts more samples in a step and needs more)")
    parser.add_argument("--step-ms", type=float, default=None,
                        help="fixed compute per step of the consumer while plans are made ahead (default: each "
                             "step's simulated time, capped at --pace-cap-ms)")
    parser.add_argument("--pace-cap-ms", type=float, default=PACE_CAP_MS,
                        help="longest simulated step the consumer spends (without --step-ms)")
    parser.add_argument("--busy", action="store_true",
                        help="the consumer computes in Python (holding the GIL) instead of sleeping, as "
                             "a host-bound training loop does: the planning thread then gets the GIL in turns")
    parser.add_argument("--json", action="store_true", help='print a last line {"rows": [...]}')


def _python_work() -> Callable[[float], None]:
    """A pure-Python loop calibrated (alone) to take the given milliseconds: a training loop's host work,
    which needs the GIL that the planning thread also takes."""
    n = 10_000
    while True:
        t0 = time.perf_counter()
        _spin(n)
        dt = time.perf_counter() - t0
        if dt >= 0.02 or n > 10**9:
            break
        n *= 4
    per_ms = n / (dt * 1e3)
    return lambda ms: _spin(max(1, int(per_ms * ms)))


def _sleep(ms: float) -> None:
    time.sleep(ms / 1e3)


def _spin(n: int) -> int:
    acc = 0
    for i in range(n):
        acc += i
    return acc


def _setup(world_size: int, method: str, model: str, hardware: str):
    """The planning table, config and HardwareSpec of one W."""
    from dcp.planner.analytic import analytic_table_for
    from dcp.sim.hardware import HARDWARE
    from dcp.sim.scenario import told_grad_sync_s

    if model == DEFAULT_MODEL:
        hw = HARDWARE[hardware]
        # told the gradient sync step_pricer charges, as paper_config does (dcp.planner.syncend)
        model = DCPConfig().model
        config = DCPConfig(planning=PlanningConfig(method=method),
                           advanced=AdvancedConfig(grad_sync_s=told_grad_sync_s(method, model, hw, world_size)))
        table = analytic_table_for(config, world_size, hardware=hw, mem_capacity_bytes=hw.mem_capacity_bytes)
        return table, config, hw
    from dcp.sim.scenario import paper_config, paper_table, scenario

    sc = scenario(model, hardware)
    return paper_table(sc, world_size), paper_config(sc, method, world_size=world_size), sc.hardware


def step_pricer(table, config: DCPConfig, hardware, world_size: int) -> Callable:
    """StepPlan -> simulated StepResult, as ``dcp.sim.cluster.simulate`` prices a step on ``table``:
    the slowest group's micro-batches, the gradient sync (overlapped for the ddp engine), the optimizer
    update with the hardware's per-step overhead, and the control plane where that overhead is 0."""
    from dcp.planner.analytic import grad_sync_time_s, optimizer_step_time_s
    from dcp.sim.cluster import row_lookup, step_cost
    from dcp.sim.control import control_plane_s

    model, rt = config.model, config.runtime
    sync = grad_sync_time_s(model, hardware, world_size)
    opt = optimizer_step_time_s(model, hardware, world_size) + hardware.step_overhead_s
    control = (control_plane_s(world_size, hardware, log_every=rt.log_every,
                                 stats_every=config.advanced.stats_every)
               if hardware.step_overhead_s == 0 else 0.0)
    overlap = model.num_params * model.param_bytes if rt.engine == "ddp" else 0.0
    rows = row_lookup(table)
    return lambda plan: step_cost(plan, None, rows, sync_s=sync, optimizer_s=opt, edges=table.seq_group_edges,
                                  overlap_grad_bytes=overlap, control_s=control)


def _lengths(dataset: str, n: int, table, model: str):
    """(lengths, shapes) of the stream: ``n`` seeded samples of the dataset (shapes None for 1D data)."""
    from dcp.planner.lengths import synthetic_lengths

    if dataset == "synthetic":
        return synthetic_lengths(n, table.max_len, seed=1), None
    from dcp.data_dists import load_lengths

    data = load_lengths(dataset, scale="cpu" if model == DEFAULT_MODEL else "paper", num_samples=n, seed=1)
    return data.tokens, data.shapes


def _median(values, scale: float = 1.0, digits: int = 3) -> float:
    return round(float(np.median(values)) * scale, digits) if len(values) else float("nan")


def bench_world_size(world_size: int, steps: int, method: str = "dcp-intra", step_ms: float | None = None,
                     busy: bool = False, *, model: str = DEFAULT_MODEL,
                     hardware: str = "cpu", pace_cap_ms: float = PACE_CAP_MS, dataset: str = "synthetic",
                     samples_per_rank: int = 0) -> dict:
    from dcp.planner.assemble import EpochPlanner

    table, config, hw = _setup(world_size, method, model, hardware)
    # Enough samples for `steps` full steps plus the look-ahead window: a balanced step of the synthetic
    # workload takes ~30-50 samples per rank and the default window holds ~90 per rank (short documents put
    # more in a step: --samples-per-rank).
    n = (samples_per_rank or 64 * (steps + 1) + 128) * world_size
    lengths, shapes = _lengths(dataset, n, table, model)
    price = step_pricer(table, config, hw, world_size)
    t0 = time.perf_counter()
    planner = EpochPlanner(lengths, table, config, world_size, shapes=shapes)
    setup = time.perf_counter() - t0
    times, cpu, mbs, idle, step_s = [], [], [], [], []
    # The first next() also runs the per-epoch preparation of a generator; time it apart.
    t0 = time.perf_counter()
    first = next(planner)
    setup += time.perf_counter() - t0
    samples = first.samples
    while len(times) < steps:
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
    # Priced apart, from the same plans planned again: pricing in the timed loop (~3x a plan's CPU, on this
    # thread) left next() ~9 ms slower at 4096 ranks, a cost no training run pays.
    first_s, *step_s = (price(p).step_time_s for p in itertools.islice(
        EpochPlanner(lengths, table, config, world_size, shapes=shapes), len(times) + 1))
    # Planned ahead: what a rank still waits for next() when each step computes for its pace.
    paces = [step_ms] * (len(times) + 1) if step_ms is not None else [
        min(pace_cap_ms, 1e3 * s) for s in (first_s, *step_s)]
    ex = _exposed(dict(lengths=lengths, table=table, config=config, world_size=world_size, shapes=shapes),
                  _python_work() if busy else _sleep, paces) * 1e3
    arr = np.asarray(times) * 1e3
    cpu_ms = _median(cpu, 1e3)
    step_time = _median(step_s, 1.0, 4)
    return {
        "world_size": world_size,
        "method": method,
        "model": model,
        "hardware": hw.name,
        "dataset": dataset,
        "steps": len(times),
        "samples": samples,
        "setup_ms": round(setup * 1e3, 2),
        "median_ms": _median(arr),
        "p99_ms": round(float(np.percentile(arr, 99)), 3) if len(arr) else float("nan"),
        # Process CPU time: robust when other jobs share the cores (wall time then includes waiting).
        "cpu_median_ms": cpu_ms,
        "exposed_median_ms": _median(ex),
        "exposed_p99_ms": round(float(np.percentile(ex, 99)), 3) if len(ex) else float("nan"),
        "plan_exposed_ms": _median(ex),
        # the simulated time of the timed steps (median) and the share of it the planner's CPU takes
        "step_time_s": step_time,
        "planning_share": round(cpu_ms / (1e3 * step_time), 7) if step_time > 0 else float("nan"),
        "pace_ms": _median(paces[1:]),
        "micro_batches_per_step": int(np.median(mbs)) if mbs else 0,
        "us_per_micro_batch": round(float(np.median(arr)) * 1e3 / max(1.0, float(np.median(mbs or [1]))), 2),
        # what the time buys: the planned steps' predicted GPU-weighted idle
        "idle_median": round(float(np.median(idle)), 4) if idle else float("nan"),
        "consumer": "busy" if busy else "sleep",
    }


def _exposed(planner_kwargs: dict, work: Callable[[float], None], paces: list[float]) -> np.ndarray:
    """Seconds each ``next()`` of the plans made ahead blocks a consumer that spends ``paces[i]`` ms on step i."""
    from dcp.planner.ahead import planned_ahead

    exposed = []
    with planned_ahead(planner_kwargs) as plans:
        next(plans)  # the epoch's first plan (preparation included) is computed before training starts
        work(paces[0])
        for i, pace in enumerate(paces[1:], 2):
            t0 = time.perf_counter()
            try:
                next(plans)
            except StopIteration:
                break
            exposed.append(time.perf_counter() - t0)
            if i < len(paces):  # nothing waits on the last step's compute
                work(pace)
    return np.asarray(exposed)


def _check(args: argparse.Namespace) -> list[int]:
    """The world sizes to time; a bad flag raises one ValueError line naming it, its value, the rule and a fix
    (``dcp`` prints it on stderr as ``dcp bench planner: error: ...`` and exits 2)."""
    try:
        sizes = [int(x) for x in args.world_sizes.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--world-sizes ({args.world_sizes!r}) must be comma-separated integers, e.g. 8,32,256") from None
    if not sizes or min(sizes) < 1 or max(sizes) > MAX_WORLD_SIZE:
        raise ValueError(f"--world-sizes ({args.world_sizes!r}) must be integers in [1, {MAX_WORLD_SIZE:,}], "
                         "e.g. 8,32,256")
    if args.step_ms is not None and args.step_ms < 0:
        raise ValueError(f"--step-ms ({args.step_ms}) must be >= 0: the simulated compute per step")
    if args.pace_cap_ms < 0:
        raise ValueError(f"--pace-cap-ms ({args.pace_cap_ms}) must be >= 0: the longest simulated step the "
                         "consumer spends, e.g. 500")
    if args.steps < 1:
        raise ValueError(f"--steps ({args.steps}) must be >= 1: time at least one step")
    if args.samples_per_rank < 0:
        raise ValueError(f"--samples-per-rank ({args.samples_per_rank}) must be >= 0: 0 sizes the stream for "
                         "--steps, e.g. 2000 for short documents")
    from dcp.data_dists import distribution_names

    if args.dataset != "synthetic" and args.dataset not in distribution_names():
        raise ValueError(f"--dataset ({args.dataset!r}) is not 'synthetic' or one of {distribution_names()}: "
                         "pick one of those")
    return sizes


def run(args: argparse.Namespace) -> int:
    sizes = _check(args)
    rows = []
    cols = (
        "world_size",
        "steps",
        "samples",
        "setup_ms",
        "median_ms",
        "p99_ms",
        "cpu_median_ms",
        "step_time_s",
        "planning_share",
        "pace_ms",
        "plan_exposed_ms",
        "micro_batches_per_step",
        "us_per_micro_batch",
        "idle_median",
    )
    print(" ".join(f"{c:>{max(9, len(c))}}" for c in cols))
    from tqdm.auto import tqdm

    for w in (bar := tqdm(sizes, desc="bench planner", unit="W", dynamic_ncols=True)):
        bar.set_postfix_str(f"W={w}")
        r = bench_world_size(w, args.steps, args.method, args.step_ms, args.busy, model=args.model,
                             hardware=args.hardware, pace_cap_ms=args.pace_cap_ms, dataset=args.dataset,
                             samples_per_rank=args.samples_per_rank)
        rows.append(r)
        bar.write(" ".join(f"{r[c]!s:>{max(9, len(c))}}" for c in cols))
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0
