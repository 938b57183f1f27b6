"""Figure 9: weak scaling from 8 GPUs to 1024 (samples per GPU fixed), balanced datasets, simulated H200.

Each row carries its tokens per step (min / median / max) and the target; each panel's title states the batch."""

from __future__ import annotations

from pathlib import Path

from dcp.figures import common

HARDWARE = "h200"
DATASET = "balanced"


def make(out_dir: Path, sizes: common.Sizes) -> list[Path]:
    from dcp.data_dists import load_lengths

    rows = []
    for model, prefix in common.MODEL_DATASET_PREFIX.items():
        for w in sizes.fig9_gpus:
            lengths = load_lengths(f"{prefix}-{DATASET}", num_samples=sizes.fig9_samples_per_gpu * w, seed=0)
            runs = common.simulate_runs(lengths.tokens, model, HARDWARE, w, common.METHODS, shapes=lengths.shapes)
            for m, run in runs.items():
                r = run.result
                rows.append({"model": model, "dataset": DATASET, "method": m, "gpus": w, **run.columns(),
                             "tokens_per_s_per_gpu": r.tokens_per_s / w, "control_plane_share": r.control_plane_share})
                # no planning wall time here: the committed CSV must not change from one run to the next
            common.progress(f"fig9: {model} {w} GPUs: " + ", ".join(
                f"{m} {runs[m].result.tokens_per_s / w:,.0f} tok/s/GPU" for m in common.METHODS))
    csv_path = common.write_csv(out_dir / "fig9_scaling.csv", rows)

    plt = common.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6))
    for col, model in enumerate(common.MODEL_DATASET_PREFIX):
        for m in common.METHODS:
            pts = [r for r in rows if r["model"] == model and r["method"] == m]
            gpus = [r["gpus"] for r in pts]
            axes[0][col].plot(gpus, [r["tokens_per_s"] for r in pts], "o-", ms=3, color=common.COLORS[m], label=m)
            axes[1][col].plot(gpus, [100 * r["idle_ratio"] for r in pts], "o-", ms=3, color=common.COLORS[m], label=m)
            if m == "dcp-intra":
                first = pts[0]
                axes[0][col].plot(gpus, [first["tokens_per_s"] * g / first["gpus"] for g in gpus], ":",
                                  color="black", lw=1, label="linear (DCP-intra)")
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xlabel("GPUs")
        axes[0][col].set_yscale("log")
        panel = [r for r in rows if r["model"] == model]
        axes[0][col].set_title(f"{model}, {DATASET} dataset, weak scaling\n{common.batch_title(panel)}", fontsize=10)
        axes[0][col].set_ylabel("tokens/s")
        axes[1][col].set_ylabel("imbalance ratio (%)")
    axes[0][0].legend(fontsize=7)
    return [csv_path, common.save(fig, out_dir / "fig9_scaling.png")]
