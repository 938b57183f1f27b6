"""Figure 9: weak scaling from 8 GPUs to 4096 (samples per GPU fixed), balanced datasets, simulated H200.

Every step is charged the runtime's control plane (``dcp.sim.control``: the measured host time per step and
the agreement all-gather of a logged step, priced at the default ``runtime.log_every``), as ``dcp simulate``
does; its share of the epoch's time is a column of the CSV (``control_plane_share``) and the bottom row of
the plot. Each row also carries its tokens per step (min / median / max) and the target; the title states
the batch."""

from __future__ import annotations

from pathlib import Path

from dcp.figures import common

HARDWARE = "h200"
DATASET = "balanced"


def make(out_dir: Path, sizes: common.Sizes) -> list[Path]:
    from dcp.config import RuntimeConfig
    from dcp.data_dists import load_lengths

    log_every = RuntimeConfig().log_every  # what simulate charges: the paper configs keep the runtime defaults
    rows = []
    for model, prefix in common.MODEL_DATASET_PREFIX.items():
        for w in sizes.fig9_gpus:
            lengths = load_lengths(f"{prefix}-{DATASET}", num_samples=sizes.fig9_samples_per_gpu * w, seed=0)
            runs = common.simulate_runs(lengths.tokens, model, HARDWARE, w, common.METHODS, shapes=lengths.shapes)
            for m, run in runs.items():
                r = run.result
                rows.append({"model": model, "dataset": DATASET, "method": m, "gpus": w, **run.columns(),
                             "tokens_per_s_per_gpu": r.tokens_per_s / w,
                             "control_plane_share": r.control_plane_share, "log_every": log_every})
                # no planning wall time here: the committed CSV must not change from one run to the next
            common.progress(f"fig9: {model} {w} GPUs: " + ", ".join(
                f"{m} {runs[m].result.tokens_per_s / w:,.0f} tok/s/GPU" for m in common.METHODS))
    csv_path = common.write_csv(out_dir / "fig9_scaling.csv", rows)
    return [csv_path, _plot(rows, sizes, log_every, out_dir / "fig9_scaling.png")]


def _plot(rows: list[dict], sizes: common.Sizes, log_every: int, path: Path) -> Path:
    plt = common.pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.05, not 5 x 10^-2, on the log-scaled share
    fig, axes = plt.subplots(3, 2, figsize=(10, 9), sharex=True)
    gpus_all = sorted({r["gpus"] for r in rows})
    for col, model in enumerate(common.MODEL_DATASET_PREFIX):
        for m in common.METHODS:
            pts = [r for r in rows if r["model"] == model and r["method"] == m]
            gpus = [r["gpus"] for r in pts]
            axes[0][col].plot(gpus, [r["tokens_per_s"] for r in pts], "o-", ms=3, color=common.COLORS[m], label=m)
            axes[1][col].plot(gpus, [100 * r["idle_ratio"] for r in pts], "o-", ms=3, color=common.COLORS[m], label=m)
            axes[2][col].plot(gpus, [100 * r["control_plane_share"] for r in pts], "o-", ms=3, color=common.COLORS[m],
                              label=m)
            if m == "dcp-intra":
                first = pts[0]
                axes[0][col].plot(gpus, [first["tokens_per_s"] * g / first["gpus"] for g in gpus], ":",
                                  color="black", lw=1, label="linear (DCP-intra)")
        for row in (0, 1, 2):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xticks(gpus_all, [str(g) for g in gpus_all], fontsize=7)
            axes[row][col].grid(True, alpha=0.3)
        axes[2][col].set_xlabel("GPUs")
        axes[0][col].set_yscale("log")
        axes[2][col].set_yscale("log")
        axes[2][col].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes[2][col].yaxis.set_major_formatter(plain)
        axes[2][col].yaxis.set_minor_formatter(NullFormatter())
        panel = [r for r in rows if r["model"] == model]
        axes[0][col].set_title(f"{model}, {DATASET} dataset, weak scaling\n{common.batch_title(panel)}", fontsize=10)
        axes[0][col].set_ylabel("tokens/s")
        axes[1][col].set_ylabel("imbalance ratio (%)")
        axes[2][col].set_ylabel("control plane (% of time)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Simulated {HARDWARE.upper()}: {sizes.fig9_samples_per_gpu:,} samples per GPU "
                 f"({sizes.fig9_samples_per_gpu * gpus_all[0]:,} at {gpus_all[0]} GPUs, "
                 f"{sizes.fig9_samples_per_gpu * gpus_all[-1]:,} at {gpus_all[-1]}); control plane charged "
                 f"(runtime.log_every = {log_every})", fontsize=9)
    return common.save(fig, path)
