"""Plots rebuilt from a results folder's runs.csv alone (``dcp sweep --plot DIR``).

The figure mirrors the paper's Figure 8: one column per (model, world size); the top row is throughput
(tokens/s) per dataset with one bar per method and the speedup over bucket parallel written above each
bar; the bottom row is the measured idle ratio, with the planner's predicted idle ratio as a tick mark.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcp.config import METHODS
from dcp.experiments.results import ResultsError, compact, read_runs, targets_label

METHOD_COLORS = {"bucket": "#7f7f7f", "packed": "#bcbd22", "dcp-inter": "#1f77b4", "dcp-intra": "#d62728"}
"""Each method's colour in every plot (the sweeps', the demo's and the paper figures', which add the peers')."""
PLOT_NAME = "summary.png"
TABLE_LEGEND = (
    "tok/s: tokens of the measured steps / their total wall time | step-med: median over steps of one step's "
    "tokens / its time (differs from tok/s when steps differ in size) | step_s: mean measured step time, pred_s: "
    "the planner's (compute only) | idle, p_idle: GPU-weighted idle fraction, measured and planned | speedup: tok/s "
    "over bucket's on the same model, dataset and W (runs may hold different samples: see dcp demo for a paired, "
    "repeated comparison) | ideal: the measured steps' time at the ideal bound / their measured time (no idle, "
    "no sync, every sample at its best setting in the profile table) | adj: ideal over bucket's, a speedup that "
    "does not depend on which samples each run's steps held (the per-step update still counts, as in tok/s) | "
    "tok/step min/med/max: tokens of the measured steps (the global batch; target: planning.tokens_per_step)"
)
"""One line under the table that explains every column."""


def latest_runs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the last row of every (model, dataset, method, world_size): re-runs appended later win."""
    keep: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        keep[(r["model"], r["dataset"], r["method"], r["world_size"])] = r
    return list(keep.values())


def speedups(rows: Sequence[dict[str, Any]], baseline: str = "bucket", column: str = "tokens_per_s") -> dict[tuple, float]:
    """``column`` (tokens/s, or ideal_fraction) of every row divided by the baseline's on the same (model,
    dataset, world_size); NaN without one."""
    base = {(r["model"], r["dataset"], r["world_size"]): r[column] for r in rows if r["method"] == baseline}
    out = {}
    for r in rows:
        b = base.get((r["model"], r["dataset"], r["world_size"]))
        out[(r["model"], r["dataset"], r["method"], r["world_size"])] = (
            r[column] / b if b and b > 0 else math.nan
        )
    return out


def plot_results(results_dir: str | Path, out_path: str | Path | None = None) -> Path:
    """Draw the summary figure from ``results_dir/runs.csv``; returns the PNG path (default: beside the CSV)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = latest_runs(read_runs(results_dir))
    if not rows:
        raise ResultsError(f"{Path(results_dir) / 'runs.csv'} has no rows: run the sweep first")
    panels = sorted({(r["model"], r["world_size"]) for r in rows})
    datasets = [d for d in ("short", "balanced", "long") if any(r["dataset"] == d for r in rows)]
    datasets += sorted({r["dataset"] for r in rows} - set(datasets))
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    spd = speedups(rows)
    adj = speedups(rows, column="ideal_fraction")
    by_key = {(r["model"], r["dataset"], r["method"], r["world_size"]): r for r in rows}

    fig, axes = plt.subplots(2, len(panels), figsize=(max(6.5, 4.4 * len(panels)), 7.0), squeeze=False)
    width = 0.8 / max(1, len(methods))
    for col, (model, w) in enumerate(panels):
        ax_t, ax_i = axes[0][col], axes[1][col]
        for mi, method in enumerate(methods):
            xs, tput, idle, pidle, labels = [], [], [], [], []
            for di, ds in enumerate(datasets):
                r = by_key.get((model, ds, method, w))
                if r is None:
                    continue
                xs.append(di + (mi - (len(methods) - 1) / 2) * width)
                tput.append(r["tokens_per_s"])
                idle.append(r["idle_ratio"])
                pidle.append(r["predicted_idle_ratio"])
                labels.append((spd[(model, ds, method, w)], adj[(model, ds, method, w)]))
            color = METHOD_COLORS.get(method, None)
            bars = ax_t.bar(xs, tput, width, label=method, color=color)
            for bar, (s, a) in zip(bars, labels, strict=True):
                if not math.isnan(s):
                    text = f"{s:.2f}x" if math.isnan(a) else f"{s:.2f}x | {a:.2f}x"
                    ax_t.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                  xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                                  fontsize=8, rotation=90)
            ax_i.bar(xs, idle, width, color=color)
            ax_i.scatter(xs, pidle, marker="_", s=120, color="black", zorder=3,
                         label="predicted" if mi == 0 else None)
        for ax in (ax_t, ax_i):
            ax.set_xticks(range(len(datasets)), datasets)
        ax_i.set_xlabel("dataset")
        ax_t.set_ylim(0, 1.4 * ax_t.get_ylim()[1])  # room for the speedup labels
        ax_t.set_title(f"{model}, W={w}")
        ax_t.set_ylabel("throughput (tokens/s)\nlabel: speedup vs bucket, tok/s | adj" if col == 0 else "")
        ax_i.set_ylabel(f"idle fraction of {'GPU' if rows[0]['device'] == 'cuda' else 'rank'} time\n"
                        "(bar measured, tick predicted)" if col == 0 else "")
        top = max([r["idle_ratio"] for r in rows] + [r["predicted_idle_ratio"] for r in rows] + [0.1])
        ax_i.set_ylim(0, min(1.0, 1.15 * top))
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7, loc="upper right")
    meta = rows[0]
    # wrapped to the figure's width (~12 characters of 10-point text an inch): one panel is 6.5 inches wide
    chars = int(12 * fig.get_figwidth())
    title = [f"DCP vs baselines: real runs on {meta['device']} processes, speedup vs bucket (adj: of the ideal "
             "fraction, free of which samples each run's steps held)",
             f"(git {meta['git_sha']}, {meta['sweep']}; {rows_batch_label(rows)})"]
    fig.suptitle("\n".join(line for part in title for line in textwrap.wrap(part, chars)), fontsize=10)
    fig.tight_layout()
    out = Path(out_path) if out_path else Path(results_dir) / PLOT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def rows_batch_label(rows: Sequence[dict[str, Any]]) -> str:
    """The batch the rows were made at (results.targets_label), or that their targets differ."""
    return targets_label(r["target_tokens_per_step"] for r in rows)


def _tokens_text(r: dict[str, Any]) -> str:
    values = (r["tokens_per_step_min"], r["tokens_per_step_median"], r["tokens_per_step_max"])
    return "-" if any(v != v for v in values) else "/".join(compact(v) for v in values)


def format_table(rows: Sequence[dict[str, Any]], baseline: str = "bucket") -> str:
    """A plain-text table of the latest rows: method, tokens/s (total and median step), step time (measured,
    predicted), idle ratio (measured, predicted), speedup in tokens/s vs the baseline (TABLE_LEGEND explains)."""
    rows = latest_runs(rows)
    spd = speedups(rows, baseline)
    adj = speedups(rows, baseline, "ideal_fraction")
    head = (f"{'model':<10} {'dataset':<9} {'W':>2} {'method':<10} {'tok/s':>9} {'step-med':>9} {'step_s':>7} "
            f"{'pred_s':>8} {'idle':>6} {'p_idle':>6} {'speedup':>8} {'ideal':>6} {'adj':>6} "
            f"{'tok/step min/med/max':>20}")
    lines = [head, "-" * len(head)]
    order = {m: i for i, m in enumerate(METHODS)}
    for r in sorted(rows, key=lambda r: (r["model"], r["dataset"], r["world_size"], order.get(r["method"], 9))):
        key = (r["model"], r["dataset"], r["method"], r["world_size"])
        s, a = spd[key], adj[key]
        s_txt = "-" if math.isnan(s) else f"{s:.2f}x"
        a_txt = "-" if math.isnan(a) else f"{a:.2f}x"
        lines.append(
            f"{r['model']:<10} {r['dataset']:<9} {r['world_size']:>2} {r['method']:<10} {r['tokens_per_s']:>9.0f} "
            f"{r['tokens_per_s_median']:>9.0f} {r['step_time_s']:>7.3f} {r['predicted_step_time_s']:>8.3f} {r['idle_ratio']:>6.2f} "
            f"{r['predicted_idle_ratio']:>6.2f} {s_txt:>8} {r['ideal_fraction']:>6.2f} {a_txt:>6} "
            f"{_tokens_text(r):>20}"
        )
    return "\n".join([*lines, f"# {rows_batch_label(rows)}"])
