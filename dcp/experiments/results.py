"""Result files of real runs: tidy CSV rows plus the resolved configuration saved beside them.

An output folder holds three files, written by ``write_results`` (appending when they exist):

- ``runs.csv``  one row per run (RUN_COLUMNS): identity, measured and predicted figures.
- ``steps.csv`` one row per (run, measured step, SP group) (STEP_COLUMNS): the predicted and measured
  step time and every group's predicted time and measured busy time; ``dcp bench simulator`` reads it.
- ``config.json`` the sweep definition and, per run id, the resolved run configuration and its hash.

Each run id is written once: ``write_results`` holds an exclusive lock on the folder's RESULTS_LOCK file while
it reads and rewrites the three files, and drops rows whose run id runs.csv already holds. Rank processes of a
killed sweep that outlive their parent may finish a run that the re-run of the same launch runs again: the
second copy is dropped with a logged line, and no append is lost to a concurrent rewrite.

The aggregation helpers are pure (no torch) so they are unit-tested directly.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import logging
import statistics
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dcp.files import append_csv, holds_only, read_csv_text, read_json, write_text

RUN_COLUMNS = (
    "run_id", "git_sha", "config_hash", "sweep", "method", "model", "dataset", "world_size", "device",
    "steps", "samples", "tokens", "tokens_per_s", "tokens_per_s_median", "ideal_fraction", "step_time_s",
    "step_time_std_s", "predicted_step_time_s", "idle_ratio", "predicted_idle_ratio", "peak_mem_gib", "mem_meter", "predicted_peak_mem_gib",
    "profile_source", "executor", "wall_s", "load_avg_1m", "timestamp",
    "tokens_per_step_min", "tokens_per_step_median", "tokens_per_step_max", "target_tokens_per_step",
)
"""runs.csv columns. step_time_s is the measured mean wall time of an optimizer step (rank 0, from one
step's start to the next's; every step ends in the all-rank gradient sync and the optimizer); tokens_per_s_median is the median over steps of a step's tokens / its
time, robust to a step slowed by other processes; ideal_fraction is the measured steps' time at the ideal bound
(every sample at its seq_group's best tokens per GPU-second in the run's profile table, no idle, no sync;
dcp.sim.cluster.ideal_tokens_per_s) over their measured time: unlike tokens/s it does not depend on which
samples a run's few steps happened to hold (the per-step update stays in the measured time, as in tokens/s:
fewer, larger steps pay it less often); idle_ratio is the measured GPU-weighted idle fraction of the
compute part (see idle_ratio_from_busy); the predicted_* columns come from the plans. load_avg_1m is the
host's 1-minute load average when the run ended: above the core count, other processes shared the cores
and the timings are inflated. tokens_per_step_min / _median / _max are the tokens of the measured steps (the
global batch each trained) and target_tokens_per_step the run's planning.tokens_per_step (0: unset, each method
its own batch); a runs.csv of an older dcp, without these four, reads them as NaN (LEGACY_RUN_COLUMNS)."""
LEGACY_RUN_COLUMNS = RUN_COLUMNS[:-4]
"""runs.csv columns before tokens per step was recorded: still read, and upgraded on append."""

STEP_COLUMNS = (
    "run_id", "method", "model", "dataset", "world_size", "step", "predicted_step_time_s",
    "measured_step_time_s", "measured_compute_time_s", "predicted_idle_ratio", "measured_idle_ratio",
    "tokens", "samples", "ideal_time_s", "group", "first_rank", "sp_size", "ga_steps", "recompute_layers",
    "group_tokens", "predicted_group_time_s", "measured_group_busy_s", "profiled_update_time_s",
)
"""steps.csv columns: one row per SP group of a measured step; step-level columns repeat per group.
predicted_step_time_s is the planner's compute part (slowest SP group); profiled_update_time_s is the
once-per-step gradient all-reduce + optimizer update the profiler measured on the same ranks (blank for a
table without it), which ``dcp bench simulator`` adds to predict the whole step."""

RUNS_CSV, STEPS_CSV, CONFIG_JSON = "runs.csv", "steps.csv", "config.json"
RESULTS_LOCK = ".results.lock"
"""Empty file whose exclusive flock serialises the writers of one results folder (all on one host: a sweep's
rank 0 processes, current and orphaned)."""
log = logging.getLogger("dcp")


class ResultsError(ValueError):
    """A results folder or row is malformed; the message names the file, the problem and a fix."""


# ----- aggregation (pure) ---------------------------------------------------------------------------
def idle_ratio_from_busy(busy_s: Sequence[float]) -> float:
    """GPU-weighted idle fraction of one step from every rank's busy (compute) time.

    The step's compute phase ends when the busiest rank finishes, ``T* = max_r busy_r``; every other
    rank waits ``T* - busy_r`` at the gradient sync. Idle ratio = ``sum_r (T* - busy_r) / (W * T*)``,
    the measured counterpart of ``StepPlan.idle_ratio_gpu`` (a rank with no work counts as fully idle).
    """
    if not busy_s:
        raise ResultsError("busy_s ([]) is empty: pass one busy time per rank")
    if any(b < 0 for b in busy_s):
        raise ResultsError(f"busy_s ({list(busy_s)}) has a negative time: busy times are durations >= 0")
    top = max(busy_s)
    if top <= 0:
        return 0.0
    return sum(top - b for b in busy_s) / (len(busy_s) * top)


def group_busy_s(busy_s: Sequence[float], groups: Sequence[tuple[int, int]]) -> list[float]:
    """Busy time of each SP group (first_rank, sp_size): the slowest of its ranks (they run in lockstep)."""
    out = []
    for first, size in groups:
        if first < 0 or size < 1 or first + size > len(busy_s):
            raise ResultsError(
                f"group (first_rank={first}, sp_size={size}) is outside the {len(busy_s)} ranks: "
                "pass groups of the step's plan"
            )
        out.append(max(busy_s[first:first + size]))
    return out


def tokens_per_step_columns(step_tokens: Sequence[int], target_tokens_per_step: int = 0) -> dict[str, Any]:
    """tokens_per_step_min / _median / _max of the steps' tokens and target_tokens_per_step (0: unset): the
    global batch a result row was made at, for runs.csv and the figures' CSVs."""
    if not len(step_tokens):
        raise ResultsError("step_tokens ([]) is empty: pass the tokens of at least one step")
    return {"tokens_per_step_min": int(min(step_tokens)), "tokens_per_step_median": statistics.median(step_tokens),
            "tokens_per_step_max": int(max(step_tokens)), "target_tokens_per_step": int(target_tokens_per_step)}


def batch_label(target_tokens_per_step: float) -> str:
    """The batch results were made at, for a figure's title: 'tokens/step target 3.1M', or 'tokens/step: each
    method its own' (0: planning.tokens_per_step unset), or 'tokens/step not recorded' (NaN: an older runs.csv)."""
    if target_tokens_per_step != target_tokens_per_step:
        return "tokens/step not recorded"
    if not target_tokens_per_step:
        return "tokens/step: each method its own"
    return f"tokens/step target {compact(target_tokens_per_step)}"


def targets_label(targets: Iterable[float]) -> str:
    """The batch of a set of result rows from their target_tokens_per_step: batch_label of the one target, or
    the targets there are ('own' for unset) when they differ; NaN (not recorded) counts only when alone."""
    known = {t for t in targets if t == t}
    if len(known) > 1:
        return "tokens/step targets: " + ", ".join(compact(t) if t else "own" for t in sorted(known))
    return batch_label(known.pop() if known else float("nan"))


def compact(n: float) -> str:
    """A token count in 3 significant figures with a k / M / G suffix: 950, 12.3k, 3.1M."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def summarize_run(step_records: Sequence[dict[str, Any]], target_tokens_per_step: int = 0) -> dict[str, float]:
    """Run-level figures from measured step records (keys as in steps.csv, one record per step); the tokens per
    step columns (tokens_per_step_columns) with the run's planning.tokens_per_step as the target.

    tokens_per_s is total tokens over total measured step time (not a mean of ratios), so long steps
    weigh in proportion to their duration.
    """
    if not step_records:
        raise ResultsError("step_records ([]) is empty: run at least one measured step")
    times = [float(r["measured_step_time_s"]) for r in step_records]
    total_t = sum(times)
    tokens = sum(int(r["tokens"]) for r in step_records)
    ideal_t = sum(float(r.get("ideal_time_s", "nan")) for r in step_records)
    return {
        "steps": len(step_records),
        "samples": sum(int(r["samples"]) for r in step_records),
        "tokens": tokens,
        "tokens_per_s": tokens / total_t if total_t > 0 else 0.0,
        "tokens_per_s_median": statistics.median(
            int(r["tokens"]) / float(r["measured_step_time_s"]) if float(r["measured_step_time_s"]) > 0 else 0.0
            for r in step_records
        ),
        "ideal_fraction": ideal_t / total_t if total_t > 0 else float("nan"),
        **tokens_per_step_columns([int(r["tokens"]) for r in step_records], target_tokens_per_step),
        "step_time_s": statistics.fmean(times),
        "step_time_std_s": statistics.pstdev(times) if len(times) > 1 else 0.0,
        "predicted_step_time_s": statistics.fmean(float(r["predicted_step_time_s"]) for r in step_records),
        # time-weighted means: a long imbalanced step wastes more than a short one
        "idle_ratio": _weighted(step_records, "measured_idle_ratio", "measured_compute_time_s"),
        "predicted_idle_ratio": _weighted(step_records, "predicted_idle_ratio", "predicted_step_time_s"),
    }


def _weighted(records: Sequence[dict[str, Any]], key: str, weight: str) -> float:
    w = [float(r[weight]) for r in records]
    if sum(w) <= 0:
        return statistics.fmean(float(r[key]) for r in records)
    return sum(float(r[key]) * wi for r, wi in zip(records, w, strict=True)) / sum(w)


# ----- identity -------------------------------------------------------------------------------------
def git_sha(cwd: str | Path | None = None) -> str:
    """Commit of the code (12 hex digits, '+dirty' when dcp/ or a sweep file differs from it), or 'unknown'."""
    if cwd is None:  # the checkout dcp runs from, whatever the current folder
        cwd = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        # modified or not-yet-committed source counts: the commit alone would not reproduce the run
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "dcp", "pyproject.toml", "experiments/*.toml"], cwd=cwd,
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("+dirty" if dirty else "")) if sha else "unknown"


def launch_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


# ----- files ----------------------------------------------------------------------------------------
def _append_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    # the whole file is written again atomically: a killed or full-disk write leaves the old rows whole
    append_csv(path, columns, rows, fmt=_fmt, error=ResultsError)


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def _upgrade_legacy_runs(path: Path) -> None:
    """A runs.csv of an older dcp (LEGACY_RUN_COLUMNS) gets the tokens-per-step columns, blank in its rows
    (not recorded), so that new rows can be appended to it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    text = read_csv_text(path, what="results file", error=ResultsError,
                         fix="delete its last, cut line (or the file) and run again")
    lines = text.splitlines()
    if tuple(next(csv.reader(lines[:1]), ())) != LEGACY_RUN_COLUMNS:
        return
    blank = "," * (len(RUN_COLUMNS) - len(LEGACY_RUN_COLUMNS))
    write_text(path, "\n".join([",".join(RUN_COLUMNS), *(line + blank for line in lines[1:])]) + "\n")


def write_results(
    out_dir: str | Path,
    run_rows: Sequence[dict[str, Any]],
    step_rows: Sequence[dict[str, Any]],
    *,
    sweep: dict[str, Any],
    run_configs: dict[str, dict[str, Any]],
) -> Path:
    """Append rows to runs.csv / steps.csv in ``out_dir`` and merge the resolved configs into config.json; rows
    of a run id that runs.csv already holds are dropped (logged), all under the folder's lock."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        _upgrade_legacy_runs(out / RUNS_CSV)
        written = _run_ids(out / RUNS_CSV)
        repeated = sorted({str(r["run_id"]) for r in run_rows} & written)
        if repeated:
            log.warning("%s already holds run(s) %s (finished by another process of the same sweep launch, e.g. "
                        "a rank left running by a killed sweep): their new rows are dropped, the first kept",
                        out / RUNS_CSV, ", ".join(repeated))
            run_rows = [r for r in run_rows if str(r["run_id"]) not in written]
            step_rows = [r for r in step_rows if str(r["run_id"]) not in written]
            run_configs = {k: v for k, v in run_configs.items() if k not in written}
        _append_csv(out / RUNS_CSV, RUN_COLUMNS, run_rows)
        _append_csv(out / STEPS_CSV, STEP_COLUMNS, step_rows)
        cfg_path = out / CONFIG_JSON
        doc: dict[str, Any] = {"sweep": sweep, "runs": {}}
        if cfg_path.exists():
            doc = read_config(out)
            doc["sweep"] = sweep
        doc["runs"].update(run_configs)
        write_text(cfg_path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return out


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold the exclusive lock of results folder ``out`` (released by the kernel if the holder dies)."""
    with open(out / RESULTS_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_ids(path: Path) -> set[str]:
    """The run ids runs.csv holds (empty for a missing file; a damaged one is refused by the append)."""
    if not path.exists() or path.stat().st_size == 0:
        return set()
    text = read_csv_text(path, what="results file", error=ResultsError,
                         fix="delete its last, cut line (or the file) and run again")
    return {row.get("run_id", "") for row in csv.DictReader(text.splitlines())}


def read_config(results_dir: str | Path) -> dict[str, Any]:
    """``results_dir/config.json`` as written by :func:`write_results`; an empty, truncated or foreign file
    raises ResultsError naming it and the fix."""
    path = Path(results_dir) / CONFIG_JSON
    fix = "restore it from a backup, or move the folder aside and re-run the sweep (its runs.csv rows need it)"
    doc = read_json(path, what="results config", fix=fix, error=ResultsError)
    if not isinstance(doc, dict) or not isinstance(doc.get("runs", {}), dict):
        raise ResultsError(f"results config ({str(path)!r}) is not a dcp results config (a JSON object with "
                           f"'sweep' and 'runs'): {fix}")
    doc.setdefault("runs", {})
    return doc


def is_results_folder(folder: Path) -> bool:
    """True when ``folder`` holds only a sweep's result files, in their shape (runs.csv with RUN_COLUMNS,
    config.json with 'runs'): a results folder of a dcp that did not mark its folders, safe to append to."""
    return any(holds_only(folder, {RUNS_CSV, STEPS_CSV, CONFIG_JSON, RESULTS_LOCK, "summary.png"},
                          {RUNS_CSV: runs, STEPS_CSV: STEP_COLUMNS}, CONFIG_JSON,
                          lambda doc: isinstance(doc, dict) and isinstance(doc.get("runs"), dict))
               for runs in (RUN_COLUMNS, LEGACY_RUN_COLUMNS))


def read_runs(results_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of ``results_dir/runs.csv`` with numeric columns converted; checks config.json is beside it."""
    path = Path(results_dir) / RUNS_CSV
    if not path.exists():
        raise ResultsError(f"{path} does not exist: pass a folder written by `dcp sweep` or `dcp demo`")
    if not (Path(results_dir) / CONFIG_JSON).exists():
        raise ResultsError(f"{Path(results_dir) / CONFIG_JSON} is missing beside {path.name}: results without "
                           "their resolved config cannot be trusted; re-run the sweep")
    import io

    from dcp.config import read_text_file

    read_config(results_dir)  # an empty or truncated config.json is named here, not by a JSON parser later
    text = read_text_file(path, what="results file", error=ResultsError)
    if not text or not text.endswith("\n"):
        read_csv_text(path, what="results file", error=ResultsError,
                      fix="delete its last, cut line (or re-run the sweep into a new --out folder)")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if tuple(reader.fieldnames or ()) not in (RUN_COLUMNS, LEGACY_RUN_COLUMNS):
        raise ResultsError(f"{path} has columns {reader.fieldnames}, not {list(RUN_COLUMNS)}: re-run the sweep")
    # an older dcp's rows did not record tokens per step: NaN, not a made-up figure
    rows = [{c: "" for c in RUN_COLUMNS} | dict(r) for r in reader]
    for line, r in enumerate(rows, start=2):
        for k, v in r.items():
            try:
                if k in _INT_COLUMNS:
                    r[k] = int(v)
                elif k not in _TEXT_COLUMNS:
                    r[k] = float(v) if v not in ("", "nan") else float("nan")
            except (TypeError, ValueError):
                raise ResultsError(f"{path}:{line}: column {k} ({v!r}) is not a number: the file was edited or cut; "
                                   "re-run the sweep") from None
    return rows


_INT_COLUMNS = frozenset({"world_size", "steps", "samples", "tokens"})
_TEXT_COLUMNS = frozenset({"run_id", "git_sha", "config_hash", "sweep", "method", "model", "dataset", "device",
                           "mem_meter", "profile_source", "executor", "timestamp"})
