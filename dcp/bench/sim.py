"""``dcp bench simulator``: the simulator's step-time prediction against measured real runs.

Real runs (``dcp sweep experiments/cpu_small.toml``) write ``steps.csv`` rows with, per measured step, the
planner's predicted compute time (from the run's own profile table: the slowest SP group's micro-batches,
Eq. 4) and the measured step wall time, plus ``config.json`` with each run's resolved configuration. The
simulator predicts a step as that compute time plus the once-per-step gradient all-reduce and optimizer
update: the figure the profiler measured on the same ranks (``profiled_update_time_s``,
``dcp.profiler.update``), or for older results without it the analytic model of the run's hardware
(``cpu-small`` for CPU runs), as ``dcp.sim.cluster.step_cost`` adds. This bench compares the two and prints one row per run and the median
and 90th-percentile absolute error over all steps; with --json the last line is
``{"step_time_err_median_pct": .., "step_time_err_p90_pct": .., ...}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dcp.planner.analytic import CPU_SMALL
from dcp.sim.calibration import percentile

DEFAULT_GLOB = "experiments/results/**/steps.csv"


class BenchError(ValueError):
    """A results file is malformed; the message names the file, row and fix."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ErrorStats:
    """Absolute relative errors |predicted - measured| / measured, in percent."""

    n: int
    """Compared steps."""
    median_pct: float
    """Median error."""
    p90_pct: float
    """90th-percentile error (nearest-rank)."""
    mean_signed_pct: float
    """Mean of (predicted - measured) / measured: > 0 when the simulator over-predicts."""


def compare_step_times(pairs: Sequence[tuple[float, float]]) -> ErrorStats:
    """Errors of (predicted_s, measured_s) pairs; measured times must be > 0."""
    if not pairs:
        raise BenchError("pairs ([]) is empty: pass at least one (predicted, measured) step time")
    errs, signed = [], []
    for i, (pred, meas) in enumerate(pairs):
        if not meas > 0 or pred < 0:
            raise BenchError(f"pair {i} ({pred!r}, {meas!r}) needs predicted >= 0 and measured > 0: drop the row")
        signed.append(100.0 * (pred - meas) / meas)
        errs.append(abs(signed[-1]))
    med = sorted(errs)[len(errs) // 2] if len(errs) % 2 else sum(sorted(errs)[len(errs) // 2 - 1:len(errs) // 2 + 1]) / 2
    return ErrorStats(n=len(errs), median_pct=med, p90_pct=percentile(errs, 90), mean_signed_pct=sum(signed) / len(signed))


def _sync_s(run_cfg: dict | None, world_size: int, device: str) -> float:
    """Gradient sync + optimizer time the simulator adds for one step of this run (0 without a model section)."""
    from dcp.config import ModelShapeConfig
    from dcp.planner.analytic import CPU_SMALL, grad_sync_time_s, optimizer_step_time_s

    run_cfg = run_cfg or {}
    device = str(run_cfg.get("device") or device)
    model_raw = (run_cfg.get("config") or {}).get("model")
    if not isinstance(model_raw, dict) or not device.startswith("cpu"):
        return 0.0
    names = set(ModelShapeConfig.__dataclass_fields__)
    model = ModelShapeConfig(**{k: v for k, v in model_raw.items() if k in names})
    return grad_sync_time_s(model, CPU_SMALL, world_size) + optimizer_step_time_s(model, CPU_SMALL, world_size)


def _run_configs(steps_csv: Path) -> dict[str, dict]:
    cfg = steps_csv.parent / "config.json"
    if not cfg.exists():
        return {}
    runs = json.loads(cfg.read_text()).get("runs", {})
    # config.json (dcp.experiments.results): runs[run_id] = {"device": .., "config": DCPConfig.to_dict(), ..}
    return {run_id: entry for run_id, entry in runs.items() if isinstance(entry, dict)}


def read_step_pairs(steps_csv: Path, *, skip_first: int = 0) -> dict[str, list[tuple[float, float]]]:
    """Per run id, (simulated step time, measured step time) of every measured step in a steps.csv."""
    configs = _run_configs(steps_csv)
    seen: set[tuple[str, str]] = set()
    out: dict[str, list[tuple[float, float]]] = {}
    first_step: dict[str, int] = {}
    with open(steps_csv, newline="") as fh:
        reader = csv.DictReader(fh)
        need = {"run_id", "step", "predicted_step_time_s", "measured_step_time_s"}
        missing = sorted(need - set(reader.fieldnames or []))
        if missing:
            raise BenchError(f"{steps_csv}: columns {missing} are missing: regenerate it with `dcp sweep`")
        rows = list(reader)
    for line, row in enumerate(rows, start=2):
        key = (row["run_id"], row["step"])
        if key in seen:  # steps.csv repeats step columns once per SP group
            continue
        seen.add(key)
        try:
            step = int(row["step"])
            pred, meas = float(row["predicted_step_time_s"]), float(row["measured_step_time_s"])
            world = int(row.get("world_size") or 1)
            profiled = (row.get("profiled_update_time_s") or "").strip()
            update = float(profiled) if profiled else None
        except ValueError:
            raise BenchError(f"{steps_csv}:{line}: a step, time or world_size value is not a number: "
                             "fix or regenerate the file") from None
        first_step[row["run_id"]] = min(first_step.get(row["run_id"], step), step)
        if step < first_step[row["run_id"]] + skip_first:
            continue
        device = str((configs.get(row["run_id"]) or {}).get("device") or row.get("device") or "cpu")
        if update is not None:
            pred += update  # measured with the run's profile, on the same ranks
        else:  # results written before the profiler measured it: the analytic CPU model
            pred += _sync_s(configs.get(row["run_id"]), world, device)
        if device.startswith("cpu"):
            pred += CPU_SMALL.step_overhead_s  # the framework's per-step time (docs/simulator.md)
        out.setdefault(row["run_id"], []).append((pred, meas))
    return out


def oversubscribed(run_cfg: dict | None) -> bool | None:
    """True when the run's ranks x threads exceeded the host's cores (ranks time-shared them); None if unknown."""
    run_cfg = run_cfg or {}
    cpus, world = run_cfg.get("host_cpus"), run_cfg.get("world_size")
    if not isinstance(cpus, int) or not isinstance(world, int) or str(run_cfg.get("device", "cpu")) != "cpu":
        return None
    return world * int(run_cfg.get("threads_per_rank") or 1) > cpus


def load_averages(run_cfg: dict | None) -> tuple[float | None, float | None]:
    """(host 1-minute load average when the run ended, when its profile was taken); None where unrecorded.

    On a shared CPU host the profiled rows and the measured steps both scale with the load: a table taken
    under a heavier (lighter) load than the run over- (under-) predicts it, whatever the model.
    """
    run_cfg = run_cfg or {}
    out = []
    for name in ("load_avg_1m", "profile_load_avg_1m"):
        v = run_cfg.get(name)
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None)
    return out[0], out[1]


def _fmt_load(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def run_world_sizes(steps_csv: Path) -> dict[str, int]:
    """world_size of every run id in a steps.csv (0 where the column is missing or not a number)."""
    out: dict[str, int] = {}
    with open(steps_csv, newline="") as fh:
        for row in csv.DictReader(fh):
            w = (row.get("world_size") or "").strip()
            out.setdefault(row.get("run_id", ""), int(w) if w.isdigit() else 0)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", nargs="*", metavar="STEPS_CSV",
                        help=f"steps.csv files of real runs (default: {DEFAULT_GLOB})")
    parser.add_argument("--skip-first", type=int, default=0,
                        help="measured steps to ignore at the start of every run (warm-up)")
    parser.add_argument("--measure", metavar="OUT_DIR",
                        help="first run a small real CPU sweep (dcp sweep experiments/cpu_small.toml: t1d-tiny, "
                             "W=2, balanced, bucket and dcp-inter) into OUT_DIR, then compare its steps")
    parser.add_argument("--target-pct", type=float, default=10.0, help="median error the bench aims for")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")


MEASURE_ARGS = ("experiments/cpu_small.toml", "--world-sizes", "2", "--models", "t1d-tiny", "--datasets", "balanced",
                "--methods", "bucket,dcp-inter", "--steps", "4")
"""The small real sweep ``--measure`` runs (about a minute on 2 idle cores)."""


def measure(out_dir: Path) -> Path:
    """Run the small real CPU sweep through ``dcp sweep`` (the experiment runner) and return its steps.csv."""
    import subprocess

    if (out_dir / "steps.csv").exists():
        raise BenchError(f"--measure ({str(out_dir)!r}) already holds a steps.csv: pass a new folder")
    cmd = [sys.executable, "-m", "dcp.cli", "sweep", *MEASURE_ARGS, "--out", str(out_dir)]
    print("measuring:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0 or not (out_dir / "steps.csv").exists():
        raise BenchError(f"the measurement sweep failed (exit {done.returncode}): run the command above to see why")
    return out_dir / "steps.csv"


def run(args: argparse.Namespace) -> int:
    files = [Path(p) for p in args.results] if args.results else sorted(Path().glob(DEFAULT_GLOB))
    if args.measure:
        try:
            files = [measure(Path(args.measure))]
        except BenchError as exc:
            print(f"dcp bench simulator: {exc}", file=sys.stderr)
            return 2
    all_pairs: list[tuple[float, float]] = []
    by_world: dict[int, list[tuple[float, float]]] = {}
    shared: dict[int, set] = {}  # world size -> {oversubscribed flags of its runs}
    loads: dict[int, list[tuple[float | None, float | None]]] = {}  # world size -> (run, profile) load averages
    print(f"{'run_id':<40} {'steps':>5} {'pred_s':>9} {'meas_s':>9} {'median%':>8} {'p90%':>7} {'load':>5} {'p_load':>6}")
    try:
        for f in files:
            worlds, configs = run_world_sizes(f), _run_configs(f)
            for run_id, pairs in read_step_pairs(f, skip_first=args.skip_first).items():
                if not pairs:
                    continue
                st = compare_step_times(pairs)
                mp = sum(p for p, _ in pairs) / len(pairs)
                mm = sum(m for _, m in pairs) / len(pairs)
                load, p_load = load_averages(configs.get(run_id))
                loads.setdefault(worlds.get(run_id, 0), []).append((load, p_load))
                print(f"{run_id[:40]:<40} {st.n:>5} {mp:>9.4f} {mm:>9.4f} {st.median_pct:>8.1f} {st.p90_pct:>7.1f} "
                      f"{_fmt_load(load):>5} {_fmt_load(p_load):>6}")
                all_pairs.extend(pairs)
                by_world.setdefault(worlds.get(run_id, 0), []).extend(pairs)
                shared.setdefault(worlds.get(run_id, 0), set()).add(oversubscribed(configs.get(run_id)))
    except (BenchError, OSError) as exc:
        print(f"dcp bench simulator: {exc}", file=sys.stderr)
        return 2
    if not all_pairs:
        print(f"dcp bench simulator: nothing to compare: no measured steps in {[str(f) for f in files] or DEFAULT_GLOB}; "
              "run `dcp sweep experiments/cpu_small.toml` first (it writes steps.csv with measured step times)")
        if args.json:
            print(json.dumps({"step_time_err_median_pct": None, "step_time_err_p90_pct": None, "steps": 0}))
        return 1
    per_world = {w: compare_step_times(p) for w, p in sorted(by_world.items())}
    for w, sw in per_world.items():
        note = " (ranks time-shared the host's cores: W x threads > cores)" if True in shared.get(w, ()) else ""
        print(f"W={w}: {sw.n} steps, median error {sw.median_pct:.1f}%, p90 {sw.p90_pct:.1f}%, "
              f"mean signed {sw.mean_signed_pct:+.1f}%{note}")
        run_l = [a for a, _ in loads.get(w, []) if a is not None]
        prof_l = [b for _, b in loads.get(w, []) if b is not None]
        if run_l and prof_l:
            print(f"  host load average (1 min): runs {min(run_l):.1f}-{max(run_l):.1f}, their profiles "
                  f"{min(prof_l):.1f}-{max(prof_l):.1f} (a profile taken under more load over-predicts)")
    st = compare_step_times(all_pairs)
    verdict = "within" if st.median_pct <= args.target_pct else "outside"
    print(f"all: {st.n} steps, median error {st.median_pct:.1f}%, p90 {st.p90_pct:.1f}%, mean signed "
          f"{st.mean_signed_pct:+.1f}% ({verdict} the {args.target_pct:.0f}% target)")
    if args.json:
        print(json.dumps({"step_time_err_median_pct": st.median_pct, "step_time_err_p90_pct": st.p90_pct,
                          "step_time_err_mean_signed_pct": st.mean_signed_pct, "steps": st.n,
                          "by_world_size": {str(w): {"step_time_err_median_pct": sw.median_pct,
                                                     "step_time_err_p90_pct": sw.p90_pct, "steps": sw.n,
                                                     "oversubscribed": True in shared.get(w, ())}
                                            for w, sw in per_world.items()}}))
    return 0
