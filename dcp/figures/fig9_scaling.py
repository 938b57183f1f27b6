"""Figure 9: weak scaling from 8 GPUs to 1024 (samples per GPU fixed), balanced datasets, simulated H200."""

from __future__ import annotations

from pathlib import Path

from dcp.figures.common import (
    COLORS,
    METHODS,
    MODEL_DATASET_PREFIX,
    Sizes,
    progress,
    pyplot,
    save,
    simulate_methods,
    write_csv,
)

HARDWARE = "h200"
DATASET = "balanced"


def make(out_dir: Path, sizes: Sizes) -> list[Path]:
    from dcp.data_dists import load_lengths

    rows = []
    for model, prefix in MODEL_DATASET_PREFIX.items():
        for w in sizes.fig9_gpus:
            lengths = load_lengths(f"{prefix}-{DATASET}", num_samples=sizes.fig9_samples_per_gpu * w, seed=0)
            res = simulate_methods(lengths.tokens, model, HARDWARE, w, METHODS, shapes=lengths.shapes)
            for m, r in res.items():
                rows.append({"model": model, "dataset": DATASET, "method": m, "gpus": w, "samples": r.num_samples,
                             "steps": r.num_steps, "tokens_per_s": r.tokens_per_s, "tokens_per_s_per_gpu":
                             r.tokens_per_s / w, "idle_ratio": r.idle_ratio, "ideal_fraction": r.ideal_fraction,
                             "control_plane_share": r.control_plane_share})
                # no planning wall time here: the committed CSV must not change from one run to the next
            progress(f"fig9: {model} {w} GPUs: " + ", ".join(f"{m} {res[m].tokens_per_s / w:,.0f} tok/s/GPU"
                                                             for m in METHODS))
    csv_path = write_csv(out_dir / "fig9_scaling.csv", rows)

    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6))
    for col, model in enumerate(MODEL_DATASET_PREFIX):
        for m in METHODS:
            pts = [r for r in rows if r["model"] == model and r["method"] == m]
            gpus = [r["gpus"] for r in pts]
            axes[0][col].plot(gpus, [r["tokens_per_s"] for r in pts], "o-", ms=3, color=COLORS[m], label=m)
            axes[1][col].plot(gpus, [100 * r["idle_ratio"] for r in pts], "o-", ms=3, color=COLORS[m], label=m)
            if m == "dcp-intra":
                first = pts[0]
                axes[0][col].plot(gpus, [first["tokens_per_s"] * g / first["gpus"] for g in gpus], ":",
                                  color="black", lw=1, label="linear (DCP-intra)")
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_xlabel("GPUs")
        axes[0][col].set_yscale("log")
        axes[0][col].set_title(f"{model}, {DATASET} dataset, weak scaling")
        axes[0][col].set_ylabel("tokens/s")
        axes[1][col].set_ylabel("imbalance ratio (%)")
    axes[0][0].legend(fontsize=7)
    return [csv_path, save(fig, out_dir / "fig9_scaling.png")]
