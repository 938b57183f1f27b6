"""``dcp demo``: the main job. DCP against bucket parallel on real CPU processes, repeated and interleaved.

Two gloo processes (W = 2) train the tiny Transformer-1D on a long-tailed length mix (64 samples of the
short distribution: median 176 tokens, the longest 1200) under an emulated per-rank memory limit that
forces the longest sample onto SP = 2. Bucket parallel therefore runs *every* sample with SP = 2 and full
recompute; DCP-inter runs short samples at SP = 1 on each rank (keeping full recompute) and DCP-intra
also drops the recompute that memory does not need. That advantage is
structural, not a matter of timing luck, and the demo measures it so that the result holds on a busy
machine:

- every method trains the *same* epoch (the same samples, so the same tokens); the figure is the time
  of that epoch, summed from the manager's per-step times;
- every method trains it at the *same global batch*: ``planning.tokens_per_step`` from ``batch_tokens`` (the
  epoch's tokens in whole steps of about 2048: 2195, 6 steps), so all pay the same number of gradient syncs
  and optimizer updates; the table prints tokens per step (min/median/max) per method;
- the methods run interleaved, in alternating order (A B C, C B A, A B C ...), ``--reps`` times, inside
  the same two processes, after one untimed warm-up epoch of each method; a slow spell of the machine
  then hits all methods alike;
- the table reports the median over repetitions, the min-max spread, each repetition's speedup over
  bucket (same repetition), and the planner's predicted epoch time beside the measured one.

The profile table is measured first by the dual-layer profiler and cached in OUT/cache (the demo's own
cache: it never touches the ``.dcp_cache`` that ``dcp profile`` uses). The profile times the process's CPU
time (``advanced.clock = "cpu"``), not elapsed time: on a 2-core machine shared with other jobs, elapsed
time of a millisecond-scale candidate doubles whenever another process takes half of its core, so a
wall-clock profile moved single rows by 2-5x from one run to the next and with them the plans of every
method (bucket's micro-batch sizes too). Every method plans from the same table; the epochs are timed
in wall time. Output files in OUT (default
runs/demo/): reps.csv (one row per method and repetition), steps.csv (one row per measured step),
summary.csv (the printed table), config.json (the resolved run) and demo.png.

    dcp demo                      # about a minute on 2 cores, profiling included
    dcp demo --plot               # rebuild the table and the plot from runs/demo/reps.csv only
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcp.argtypes import positive_int, sample_count
from dcp.files import OutputError, claim_dir, holds_only, read_csv_text, read_json, write_text
from dcp.memory import ENGINE_NAMES

DEFAULT_OUT = "runs/demo"
METHODS = ("bucket", "dcp-inter", "dcp-intra")
REPS_CSV, STEPS_CSV, SUMMARY_CSV, CONFIG_JSON, PLOT_PNG = "reps.csv", "steps.csv", "summary.csv", "config.json", "demo.png"
TOKENS_PER_STEP_COLUMNS = ("tokens_per_step_min", "tokens_per_step_median", "tokens_per_step_max")
REP_COLUMNS = ("method", "rep", "order", "steps", "samples", "tokens", *TOKENS_PER_STEP_COLUMNS, "epoch_time_s",
               "predicted_epoch_time_s", "idle_ratio", "predicted_idle_ratio", "speedup_vs_bucket")
STEP_COLUMNS = ("method", "rep", "step", "tokens", "samples", "step_time_s", "predicted_step_time_s",
                "measured_idle_ratio", "predicted_idle_ratio", "plan")
SUMMARY_COLUMNS = ("method", "steps", "tokens", *TOKENS_PER_STEP_COLUMNS, "epoch_s_median", "epoch_s_min", "epoch_s_max", "predicted_epoch_s",
                   "speedup_median", "speedup_min", "speedup_max", "predicted_speedup", "idle_ratio",
                   "predicted_idle_ratio")
LEGEND = (
    "tok/step: tokens per optimizer step, min/median/max (every method plans at the demo's planning.tokens_per_step) | "
    "epoch s: measured wall time of the epoch (the same samples for every method), median [min-max] over the "
    "repetitions | pred s: the planner's prediction from the profile (compute + profiled gradient sync and "
    "optimizer update per step) | speedup: bucket's epoch time / the method's, paired per repetition, median "
    "[min-max] | pred x: predicted speedup | idle: GPU-weighted idle fraction of the compute, measured "
    "(pred: planned)"
)

# The demo's configuration, in the same sections as a sweep file (kept here so an installed dcp runs it).
DEMO_SETTINGS: dict[str, Any] = {
    "model": "t1d-tiny",
    # long-tailed (datasets/t1d-short.toml): with seed 0 the 64 samples have a median of 176 tokens, and the
    # longest (1200) is the one sample that needs SP = 2
    "distribution": "t1d-short",
    "num_samples": 64,
    "world_size": 2,
    "reps": 5,
    # the global batch every method trains at, about this many tokens per optimizer step (see batch_tokens)
    "tokens_per_step_nominal": 2048,
    "seed": 0,
    "config": {
        # CPU-time profile: stable under other jobs' load (see the module docstring); all methods share it
        "profiling": {"seq_group_edges": [128, 256, 512, 1024, 2048], "max_micro_batch_size": 8},
        # emulated per-rank memory: the last seq_group (1025-2048 tokens) needs SP = 2 even with full recompute,
        # while samples up to 512 tokens run on one rank without recompute
        # planning.tokens_per_step is set from batch_tokens (below): the same for every method; the committed
        # figures were measured at step_tokens_bounds [0.5, 2.0] (the default is now +-10%)
        "planning": {"mem_capacity_gib": 0.018, "gmin": 1, "gmax": 4, "ranks_per_node": 8, "sp_sizes": [1, 2, 4],
                     "step_tokens_bounds": [0.5, 2.0]},
        "runtime": {"engine": "ddp", "attention": "sdpa", "log_every": 1_000_000},
        "advanced": {"warmup_iters": 1, "measure_iters": 3, "clock": "cpu", "stats_every": 1},
    },
}


class DemoError(ValueError):
    """A demo option or result folder is unusable; the message names it, the rule and a fix."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (its cache/ subfolder holds the demo's profile)")
    parser.add_argument("--reps", type=positive_int, default=DEMO_SETTINGS["reps"],
                        help="timed repetitions of every method (interleaved; medians and min-max are reported)")
    parser.add_argument("--samples", type=sample_count, default=DEMO_SETTINGS["num_samples"],
                        help="samples in the epoch every method trains")
    parser.add_argument("--engine", default=DEMO_SETTINGS["config"]["runtime"]["engine"], choices=ENGINE_NAMES,
                        help="runtime.engine of every method (fsdp2 / fsdp2-zero3: sharded; default: %(default)s)")
    parser.add_argument("--refresh-profile", action="store_true", help="profile again instead of using OUT/cache")
    parser.add_argument("--plot", action="store_true", help="only rebuild the table and the plot from OUT/reps.csv")


# ----- the work, on every rank ----------------------------------------------------------------------
def _config(settings: dict[str, Any], cache_dir: str) -> Any:
    from dcp.config import config_from_dict
    from dcp.experiments.sweep import _shape_dict

    raw = json.loads(json.dumps(settings["config"]))
    raw["profiling"]["cache_dir"] = cache_dir
    raw["planning"]["seed"] = settings["seed"]
    raw["planning"]["tokens_per_step"] = batch_tokens(_lengths(settings), settings["tokens_per_step_nominal"])
    raw["model"] = _shape_dict(settings["model"], "cpu")
    return config_from_dict(raw)


def batch_tokens(lengths: Sequence[int], nominal: int) -> int:
    """The demo's planning.tokens_per_step: the epoch's tokens split into whole steps of about ``nominal`` tokens.

    A recipe setting, as a user fixes a global batch: it depends on the data only, never on the profile or the
    method, so every method trains the same batch and the step count no longer moves with profile noise (bucket's
    own steps did: one micro-batch per step, 12-28 of them as noisy profile rows changed its batch sizes). Whole
    steps let every method's epoch mean equal the target (2048 nominal on 13,168 tokens: 6 steps of 2195)."""
    total = sum(lengths)
    return max(1, round(total / max(1, round(total / nominal))))


def method_config(cfg: Any, method: str) -> Any:
    """The demo's config for one method: only planning.method differs (tokens_per_step, memory, profile are shared)."""
    return cfg.replace(planning=dataclasses.replace(cfg.planning, method=method))


def _lengths(settings: dict[str, Any]) -> list[int]:
    from dcp.data_dists import load_lengths

    got = load_lengths(settings["distribution"], scale="cpu", num_samples=settings["num_samples"],
                       seed=settings["seed"])
    return [int(n) for n in got.tokens]


def schedule(reps: int, methods: Sequence[str] = METHODS) -> list[tuple[int, str]]:
    """(repetition, method) in run order: methods interleaved, order reversed every other repetition."""
    out = []
    for rep in range(reps):
        order = list(methods) if rep % 2 == 0 else list(reversed(methods))
        out += [(rep, m) for m in order]
    return out


def _epoch(method: str, cfg: Any, lengths: list[int], table: Any, rank: int, device: Any, model_name: str,
           max_steps: int | None) -> list[tuple[Any, Any]]:
    """Train one epoch (or ``max_steps`` steps) through dcp's manager; returns (StepStats, StepPlan) per step."""
    import torch

    from dcp.api import set_manager
    from dcp.experiments.execute import build_model
    from dcp.experiments.sweep import model_config
    from dcp.planner import EpochPlanner
    from dcp.runtime.data import SyntheticTokenDataset

    cfg = method_config(cfg, method)
    torch.manual_seed(cfg.planning.seed)
    model = build_model(model_name, device)
    dataset = SyntheticTokenDataset(lengths, vocab_size=model_config(model_name).vocab_size, seed=cfg.planning.seed)
    world_size = torch.distributed.get_world_size()
    plans = list(EpochPlanner(dataset.lengths(), table, cfg, world_size, 0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mgr = set_manager(model, dataset, cfg, optimizer=optimizer, engine=cfg.runtime.engine, table=table)
    engine = mgr.engine
    for batch in mgr.get_data_iter(max_steps=max_steps):
        mgr.optimize_dynamics(batch, engine)
        with mgr.profile(batch, engine, mgr.gas):
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
    stats = mgr.step_stats
    if max_steps is None and len(stats) != len(plans):
        raise RuntimeError(f"{method}: the manager ran {len(stats)} steps, the epoch has {len(plans)}: report this as a bug")
    for st, plan in zip(stats, plans, strict=False):
        if st.step != plan.step:
            raise RuntimeError(f"{method}: manager step {st.step} is not planned step {plan.step}: plans diverged")
    return list(zip(stats, plans[:len(stats)], strict=True))


def demo_worker(rank: int, world_size: int, settings: dict[str, Any], cache_dir: str, refresh: bool,
                reps: int) -> dict[str, Any] | None:
    """One rank of the demo: profile (or load) the table, warm up, then the interleaved timed epochs."""
    import torch
    import torch.distributed as dist

    from dcp.experiments.execute import build_model
    from dcp.experiments.runner import _table, profiled_update_s
    from dcp.runtime.registry import SPGroupRegistry

    torch.set_num_threads(1)
    device = torch.device("cpu")
    cfg = _config(settings, cache_dir)
    lengths = _lengths(settings)
    sizes = tuple(p for p in cfg.planning.sp_sizes if p <= world_size)
    registry = SPGroupRegistry.for_config(cfg, world_size, sizes)
    table = _table(build_model(settings["model"], device), cfg, rank, world_size, registry, {}, refresh)
    update_s = profiled_update_s(table) or 0.0
    order = schedule(reps)
    bar = None
    if rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(METHODS) + len(order), desc="demo epochs", unit="epoch", dynamic_ncols=True)
    for m in METHODS:  # untimed warm-up epoch (every shape once): first-touch costs, allocator, thread pools
        if bar is not None:
            bar.set_postfix_str(f"warm-up {m}")
        _epoch(m, cfg, lengths, table, rank, device, settings["model"], max_steps=None)
        dist.barrier()
        if bar is not None:
            bar.update()
    reps_rows, step_rows = [], []
    for k, (rep, m) in enumerate(order):
        if bar is not None:
            bar.set_postfix_str(f"rep {rep + 1}/{reps} {m}")
        steps = _epoch(m, cfg, lengths, table, rank, device, settings["model"], max_steps=None)
        dist.barrier()
        if bar is not None:
            bar.update()
        if rank != 0:
            continue
        for st, plan in steps:
            step_rows.append({
                "method": m, "rep": rep, "step": st.step, "tokens": st.tokens, "samples": len(plan.sample_ids),
                "step_time_s": st.step_time_s, "predicted_step_time_s": plan.step_time_s + update_s,
                "measured_idle_ratio": st.measured_idle, "predicted_idle_ratio": plan.idle_ratio_gpu,
                "plan": plan.summary(),
            })
        compute = [max(st.busy_s) for st, _ in steps]
        reps_rows.append({
            "method": m, "rep": rep, "order": k, "steps": len(steps),
            "samples": sum(len(p.sample_ids) for _, p in steps), "tokens": sum(st.tokens for st, _ in steps),
            **tokens_per_step([p.tokens for _, p in steps]),
            "epoch_time_s": sum(st.step_time_s for st, _ in steps),
            "predicted_epoch_time_s": sum(p.step_time_s + update_s for _, p in steps),
            "idle_ratio": _weighted([st.measured_idle for st, _ in steps], compute),
            "predicted_idle_ratio": _weighted([p.idle_ratio_gpu for _, p in steps], [p.step_time_s for _, p in steps]),
        })
    if bar is not None:
        bar.close()
    if rank != 0:
        return None
    return {"reps": reps_rows, "steps": step_rows, "table_rows": len(table), "update_s": update_s}


def tokens_per_step(step_tokens: Sequence[int]) -> dict[str, int]:
    """min / median / max tokens of the steps (the TOKENS_PER_STEP_COLUMNS)."""
    vals = [int(min(step_tokens)), int(round(statistics.median(step_tokens))), int(max(step_tokens))]
    return dict(zip(TOKENS_PER_STEP_COLUMNS, vals, strict=True))


def _weighted(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    if total <= 0:
        return statistics.fmean(values) if values else 0.0
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total


# ----- aggregation (pure) ---------------------------------------------------------------------------
def add_speedups(rows: list[dict[str, Any]], baseline: str = "bucket") -> list[dict[str, Any]]:
    """Set speedup_vs_bucket on every row: the baseline's epoch time of the same repetition / the row's."""
    base = {r["rep"]: float(r["epoch_time_s"]) for r in rows if r["method"] == baseline}
    for r in rows:
        b, t = base.get(r["rep"]), float(r["epoch_time_s"])
        r["speedup_vs_bucket"] = b / t if b and t > 0 else math.nan
    return rows


def summarize(rows: Sequence[dict[str, Any]], baseline: str = "bucket") -> list[dict[str, Any]]:
    """One summary row per method (medians and min-max over repetitions), in METHODS order."""
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    methods += sorted({r["method"] for r in rows} - set(methods))
    base_pred = [float(r["predicted_epoch_time_s"]) for r in rows if r["method"] == baseline]
    out = []
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        t = [float(r["epoch_time_s"]) for r in mine]
        s = [float(r["speedup_vs_bucket"]) for r in mine if not math.isnan(float(r["speedup_vs_bucket"]))]
        pred = statistics.median(float(r["predicted_epoch_time_s"]) for r in mine)
        out.append({
            "method": m, "steps": int(mine[0]["steps"]), "tokens": int(mine[0]["tokens"]),
            **{c: int(mine[0][c]) for c in TOKENS_PER_STEP_COLUMNS},
            "epoch_s_median": statistics.median(t), "epoch_s_min": min(t), "epoch_s_max": max(t),
            "predicted_epoch_s": pred,
            "speedup_median": statistics.median(s) if s else math.nan,
            "speedup_min": min(s) if s else math.nan, "speedup_max": max(s) if s else math.nan,
            "predicted_speedup": statistics.median(base_pred) / pred if base_pred and pred > 0 else math.nan,
            "idle_ratio": statistics.median(float(r["idle_ratio"]) for r in mine),
            "predicted_idle_ratio": statistics.median(float(r["predicted_idle_ratio"]) for r in mine),
        })
    return out


def format_table(summary: Sequence[dict[str, Any]], reps: int) -> str:
    """The printed table: one row per method; the legend line below explains every column."""
    head = (f"{'method':<10} {'steps':>5} {'tok/step min/med/max':>20} {'epoch s (median [min-max])':>27} {'pred s':>7} "
            f"{'speedup vs bucket':>22} {'pred x':>6} {'idle':>5} {'pred':>5}")
    lines = [head, "-" * len(head)]
    for r in summary:
        spd = ("-" if math.isnan(r["speedup_median"]) else
               f"{r['speedup_median']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}]")
        epoch = f"{r['epoch_s_median']:.2f} [{r['epoch_s_min']:.2f}-{r['epoch_s_max']:.2f}]"
        tok = "/".join(str(r[c]) for c in TOKENS_PER_STEP_COLUMNS)
        lines.append(f"{r['method']:<10} {r['steps']:>5} {tok:>20} {epoch:>27} {r['predicted_epoch_s']:>7.2f} {spd:>22} "
                     f"{r['predicted_speedup']:>5.2f}x {r['idle_ratio']:>5.2f} {r['predicted_idle_ratio']:>5.2f}")
    lines.append(f"({reps} repetitions; every method trains the same {summary[0]['tokens']} tokens per epoch)")
    return "\n".join(lines)


def format_reps(rows: Sequence[dict[str, Any]]) -> str:
    """Each repetition's speedups in one line: the raw figures behind the medians."""
    out = []
    for rep in sorted({int(r["rep"]) for r in rows}):
        mine = [r for r in rows if int(r["rep"]) == rep]
        parts = [f"{r['method']} {float(r['epoch_time_s']):.2f}s ({float(r['speedup_vs_bucket']):.2f}x)" for r in
                 sorted(mine, key=lambda r: METHODS.index(r["method"]) if r["method"] in METHODS else 9)]
        out.append(f"rep {rep + 1}: " + ", ".join(parts))
    return "\n".join(out)


# ----- files ----------------------------------------------------------------------------------------
def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: (f"{r[c]:.6g}" if isinstance(r[c], float) else r[c]) for c in columns})
    return write_text(path, buf.getvalue())  # atomic: never a half-written CSV


_OWN_FILES = frozenset({REPS_CSV, STEPS_CSV, SUMMARY_CSV, CONFIG_JSON, PLOT_PNG, "cache"})


def is_demo_folder(folder: Path) -> bool:
    """True when ``folder`` holds only a demo's files, in their shape (a demo folder of a dcp that did not mark
    its folders): reps.csv with REP_COLUMNS, config.json with the demo's settings."""
    return holds_only(folder, _OWN_FILES, {REPS_CSV: REP_COLUMNS}, CONFIG_JSON,
                      lambda doc: isinstance(doc, dict) and "settings" in doc)


def read_reps(out: Path) -> list[dict[str, Any]]:
    path = out / REPS_CSV
    if not path.exists():
        raise DemoError(f"{path} does not exist: run `dcp demo --out {out}` first")
    text = read_csv_text(path, what="demo results", error=DemoError, fix=f"run `dcp demo --out {out}` again")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if tuple(reader.fieldnames or ()) != REP_COLUMNS:
        raise DemoError(f"{path} has columns {reader.fieldnames}, not {list(REP_COLUMNS)}: run `dcp demo` again")
    rows = [dict(r) for r in reader]
    if not rows:
        raise DemoError(f"{path} has no rows: run `dcp demo --out {out}` again")
    for r in rows:
        for k in ("rep", "order", "steps", "samples", "tokens", *TOKENS_PER_STEP_COLUMNS):
            r[k] = int(r[k])
        for k in ("epoch_time_s", "predicted_epoch_time_s", "idle_ratio", "predicted_idle_ratio", "speedup_vs_bucket"):
            r[k] = float(r[k]) if r[k] not in ("", "nan") else math.nan
    return rows


def plot(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """The demo's figure (``dcp.figures.demo_plot``), written atomically to ``path``."""
    from dcp.figures.demo_plot import plot as draw

    return draw(rows, summary, path, title)


def _report(out: Path, rows: list[dict[str, Any]], title: str) -> tuple[str, Path]:
    summary = summarize(rows)
    _write_csv(out / SUMMARY_CSV, SUMMARY_COLUMNS, summary)
    png = plot(rows, summary, out / PLOT_PNG, title)
    reps = len({r["rep"] for r in rows})
    text = "\n".join([format_table(summary, reps), "", LEGEND, "", format_reps(rows)])
    return text, png


# ----- command ----------------------------------------------------------------------------------------
def check_args(args: argparse.Namespace) -> None:
    if args.reps < 1:
        raise DemoError(f"--reps ({args.reps}) must be >= 1: e.g. --reps 3")
    if args.samples < 8:
        raise DemoError(f"--samples ({args.samples}) must be >= 8: every method needs several steps")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DemoError(f"--out ({str(out)!r}) is a file: pass a folder")


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
    except DemoError as exc:
        print(f"dcp demo: {exc}")
        return 2
    out = Path(args.out)
    if args.plot:
        try:
            rows = add_speedups(read_reps(out))
            meta = (read_json(out / CONFIG_JSON, what="demo config", error=DemoError,
                              fix=f"run `dcp demo --out {out}` again") if (out / CONFIG_JSON).exists() else {})
        except DemoError as exc:
            print(f"dcp demo --plot: {exc}")
            return 2
        text, png = _report(out, rows, meta.get("title", "dcp demo"))
        print(text)
        print(f"plot: {png}")
        return 0

    from dcp.distributed.launch import DistributedFailure, run_distributed
    from dcp.experiments.results import git_sha

    settings = {**DEMO_SETTINGS, "num_samples": args.samples, "reps": args.reps}
    engine = args.engine
    settings["config"] = {**settings["config"], "runtime": {**settings["config"]["runtime"], "engine": engine}}
    lengths = _lengths(settings)
    try:  # before any work: a folder of the user's own files, or one that cannot be written, is refused
        claim_dir(out, flag="--out", command="dcp demo", adopt=is_demo_folder)
    except OutputError as exc:
        print(f"dcp demo: {exc}")
        return 2
    for name in (REPS_CSV, STEPS_CSV, SUMMARY_CSV, CONFIG_JSON, PLOT_PNG):  # a demo folder holds one demo
        (out / name).unlink(missing_ok=True)
    # the demo's own cache (never .dcp_cache/); the cache key names advanced.clock, so a wall-clock table
    # of another run is never taken for the demo's CPU-clock one
    cache_dir = str(out / "cache")
    w = settings["world_size"]
    srt = sorted(lengths)
    edges = settings["config"]["profiling"]["seq_group_edges"]
    tail = ("the longest sample needs SP=2" if srt[-1] > edges[-2] else
            f"no sample is over {edges[-2]} tokens: nothing needs SP=2, raise --samples for the long tail")
    print(f"dcp demo: bucket vs DCP-inter vs DCP-intra, {settings['model']} on W={w} CPU processes (gloo, runtime.engine {engine})\n"
          f"  workload: {len(lengths)} samples of {settings['distribution']} ({srt[0]}-{srt[-1]} tokens, median "
          f"{srt[len(srt) // 2]}, {sum(lengths)} tokens), memory limit {settings['config']['planning']['mem_capacity_gib']}"
          f" GiB per rank ({tail})\n"
          f"  {args.reps} repetitions of each method's epoch, interleaved; profile cache: {cache_dir}", flush=True)
    t0 = time.perf_counter()
    try:
        res = run_distributed(demo_worker, w, settings, cache_dir, args.refresh_profile, args.reps,
                              timeout_s=1800.0, pg_timeout_s=900.0,
                              env={"DCP_TEST_THREADS": "1", "OMP_NUM_THREADS": "1"})[0]
    except DistributedFailure as exc:
        detail = str(exc) if os.environ.get("DCP_TRACEBACK") else \
            f"{exc.summary()} (set DCP_TRACEBACK=1 for the ranks' tracebacks)"
        print(f"dcp demo: a rank failed: {detail}")
        return 1
    wall = time.perf_counter() - t0
    rows = add_speedups(res["reps"])
    _write_csv(out / REPS_CSV, REP_COLUMNS, rows)
    _write_csv(out / STEPS_CSV, STEP_COLUMNS, res["steps"])
    sha = git_sha()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    batch = batch_tokens(lengths, settings["tokens_per_step_nominal"])
    title = (f"dcp demo: {settings['model']}, {len(lengths)} samples of {settings['distribution']}, W={w} CPU processes"
             f"{'' if engine == 'ddp' else f' ({engine})'}, "
             f"{args.reps} repetitions (git {sha})\nbatch: {batch} tokens per step for every method "
             f"(planning.tokens_per_step)")
    write_text(out / CONFIG_JSON, json.dumps({
        "settings": settings, "lengths": lengths, "git_sha": sha, "host_cpus": os.cpu_count(), "load_avg_1m": load,
        "profile_rows": res["table_rows"], "profiled_update_s": res["update_s"], "wall_s": wall, "title": title,
    }, indent=2, sort_keys=True) + "\n")
    text, png = _report(out, rows, title)
    print()
    print(text)
    print()
    print(f"files: {out / REPS_CSV}, {out / STEPS_CSV}, {out / SUMMARY_CSV}, {out / CONFIG_JSON}, {png}")
    print(f"rebuild the table and plot from the CSV: dcp demo --plot --out {out}")
    print(f"demo wall time: {wall:.0f}s (host load average {load:.1f} on {os.cpu_count()} cores)")
    return 0
