"""Figure 8: throughput and imbalance, 2 models x 3 datasets x 6 methods at 32 H200 GPUs (simulated).

Beside the paper's four methods, the two peers (``dcp.planner.peers``: Megatron-style dynamic CP and FlexSP).
Every method runs at the same global batch, as ``dcp bench peers`` does: planning.tokens_per_step = bucket's own
mean tokens per step on the same data (a throughput comparison at different batch sizes is not like for like).
Each panel's title states the batch; every CSV row carries its tokens per step (min / median / max, target)."""

from __future__ import annotations

from pathlib import Path

from dcp.config import PEER_METHODS
from dcp.figures import common

WORLD_SIZE = 32
HARDWARE = "h200"
DATASETS = ("short", "balanced", "long")
FIG8_METHODS = (*common.METHODS, *PEER_METHODS)


def make(out_dir: Path, sizes: common.Sizes) -> list[Path]:
    from dcp.data_dists import load_lengths
    from dcp.planner.peers import bucket_tokens_per_step
    from dcp.sim.scenario import paper_config, paper_table, scenario

    rows = []
    for model, prefix in common.MODEL_DATASET_PREFIX.items():
        for ds in DATASETS:
            lengths = load_lengths(f"{prefix}-{ds}", num_samples=sizes.fig8_samples, seed=0)
            sc = scenario(model, HARDWARE)
            table = paper_table(sc, WORLD_SIZE, shapes=lengths.shapes)
            target = round(bucket_tokens_per_step(lengths.tokens, table, paper_config(sc, "bucket"), WORLD_SIZE,
                                                  shapes=lengths.shapes))
            runs = common.simulate_runs(lengths.tokens, model, HARDWARE, WORLD_SIZE, FIG8_METHODS, table=table,
                                        shapes=lengths.shapes, tokens_per_step=target)
            base = runs["bucket"].result.tokens_per_s
            for m, run in runs.items():
                r = run.result
                rows.append({"model": model, "dataset": ds, "method": m, "gpus": WORLD_SIZE, "hardware": HARDWARE,
                             **run.columns(), "speedup_vs_bucket": r.tokens_per_s / base,
                             "idle_ratio_batch": r.idle_ratio_batch, "sync_share": r.sync_time_s / r.total_time_s,
                             "tokens_per_step_mean": r.tokens / r.num_steps})
            common.progress(f"fig8: {model} {ds}: " + ", ".join(f"{m} x{runs[m].result.tokens_per_s / base:.2f}"
                                                                for m in FIG8_METHODS))
    csv_path = common.write_csv(out_dir / "fig8_throughput.csv", rows)

    plt = common.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(13, 6.8))
    width = 0.8 / len(FIG8_METHODS)
    for col, model in enumerate(common.MODEL_DATASET_PREFIX):
        for k, m in enumerate(FIG8_METHODS):
            pts = [next(r for r in rows if r["model"] == model and r["dataset"] == d and r["method"] == m)
                   for d in DATASETS]
            xs = [i + (k - (len(FIG8_METHODS) - 1) / 2) * width for i in range(len(DATASETS))]
            axes[0][col].bar(xs, [r["speedup_vs_bucket"] for r in pts], width, color=common.COLORS[m], label=m)
            axes[1][col].bar(xs, [100 * r["idle_ratio"] for r in pts], width, color=common.COLORS[m], label=m)
            for x, r in zip(xs, pts, strict=True):
                axes[0][col].annotate(f"{r['speedup_vs_bucket']:.2f}x", (x, r["speedup_vs_bucket"]), xytext=(0, 2),
                                      textcoords="offset points", ha="center", va="bottom", fontsize=7, rotation=90)
        for row in (0, 1):
            axes[row][col].set_xticks(range(len(DATASETS)), DATASETS)
        axes[1][col].set_xlabel("dataset (length distribution)")
        axes[0][col].set_ylim(0, 1.3 * axes[0][col].get_ylim()[1])  # room for the speedup labels
        panel = [r for r in rows if r["model"] == model]
        axes[0][col].set_title(f"{model}, {WORLD_SIZE} x {HARDWARE.upper()} (simulated)\n"
                               f"{common.batch_title(panel, peers=True)}", fontsize=9)
        axes[0][col].set_ylabel("throughput vs bucket (x)")
        axes[1][col].set_ylabel("imbalance ratio (% GPU time idle)")
    axes[0][0].legend(fontsize=7)
    return [csv_path, common.save(fig, out_dir / "fig8_throughput.png")]
