"""Figure 4: imbalance ratio of bucket parallel across many datasets (the paper analyses 140).

Every member of the sweep (``datasets/sweep.toml``: log-normal token lengths, Zipf over video buckets,
random compute shares over length tiers) is simulated at 32 H200 GPUs with bucket parallel, and with
DCP-intra for contrast; t1d grids run on t1d-5b, t2d grids on t2d-1.2b. The imbalance ratio is the
GPU-weighted idle fraction of the compute phases (DESIGN.md section 3). Each row carries both methods' tokens
per step (min / median / max) and the target; the title states the batch.
"""

from __future__ import annotations

from pathlib import Path

from dcp.figures import common

WORLD_SIZE = 32
HARDWARE = "h200"
GRID_MODEL = {family: name for name, family in common.MODEL_DATASET_PREFIX.items()}
"""The paper model each distribution grid (family) runs on."""


def make(out_dir: Path, sizes: common.Sizes) -> list[Path]:
    from dcp.data_dists import load_lengths
    from dcp.data_dists.sweep import sweep_specs
    from dcp.sim.scenario import paper_table, scenario

    specs = sweep_specs()[: sizes.fig4_datasets]
    tables = {m: paper_table(scenario(m, HARDWARE), WORLD_SIZE) for m in GRID_MODEL.values()}
    rows = []
    for i, spec in enumerate(specs):
        model = GRID_MODEL[spec.grid]
        lengths = load_lengths(spec.name, num_samples=sizes.fig4_samples, seed=i)
        runs = common.simulate_runs(lengths.tokens, model, HARDWARE, WORLD_SIZE, ("bucket", "dcp-intra"),
                                    table=tables[model])
        b, d = runs["bucket"].result, runs["dcp-intra"].result
        tokens = {f"{prefix}_{k}": v for m, prefix in (("bucket", "bucket"), ("dcp-intra", "dcp_intra"))
                  for k, v in runs[m].columns().items() if k.startswith("tokens_per_step")}
        rows.append({"dataset": spec.name, "model": model, "sampler": spec.sampler,
                     "mean_tokens": sum(lengths.tokens) / len(lengths.tokens), "max_tokens": max(lengths.tokens),
                     "bucket_idle_ratio": b.idle_ratio, "bucket_idle_ratio_batch": b.idle_ratio_batch,
                     "dcp_intra_idle_ratio": d.idle_ratio, "dcp_intra_speedup": d.tokens_per_s / b.tokens_per_s,
                     **tokens, "target_tokens_per_step": runs["bucket"].target_tokens_per_step})
        if (i + 1) % 20 == 0 or i + 1 == len(specs):
            common.progress(f"fig4: {i + 1}/{len(specs)} datasets")
    csv_path = common.write_csv(out_dir / "fig4_imbalance.csv", rows)

    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    order = sorted(range(len(rows)), key=lambda k: rows[k]["bucket_idle_ratio"])
    ax1.bar(range(len(rows)), [100 * rows[k]["bucket_idle_ratio"] for k in order], color=common.COLORS["bucket"],
            width=1.0, label="bucket parallel")
    ax1.plot(range(len(rows)), [100 * rows[k]["dcp_intra_idle_ratio"] for k in order], ".",
             color=common.COLORS["dcp-intra"], ms=3, label="DCP-intra")
    ax1.set_xlabel(f"dataset (sorted by bucket imbalance), {len(rows)} datasets")
    ax1.set_ylabel("imbalance ratio (% GPU time idle)")
    ax1.set_title(f"Imbalance across datasets, {WORLD_SIZE} GPUs\n{common.batch_title(rows)}", fontsize=10)
    ax1.legend(fontsize=8)
    # the same bins for both methods, so their bar heights compare
    top = max(100 * max(r["bucket_idle_ratio"], r["dcp_intra_idle_ratio"]) for r in rows)
    bins = [top * i / 40 for i in range(41)]
    ax2.hist([100 * r["bucket_idle_ratio"] for r in rows], bins=bins, color=common.COLORS["bucket"], alpha=0.8,
             label="bucket")
    ax2.hist([100 * r["dcp_intra_idle_ratio"] for r in rows], bins=bins, color=common.COLORS["dcp-intra"], alpha=0.6,
             label="DCP-intra")
    ax2.set_xlabel("imbalance ratio (%)")
    ax2.set_ylabel("datasets")
    ax2.legend(fontsize=8)
    return [csv_path, common.save(fig, out_dir / "fig4_imbalance.png")]
