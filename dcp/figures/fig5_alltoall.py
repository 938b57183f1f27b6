"""Figure 5: Ulysses all-to-all overhead vs SP size and sequence length (Transformer-1D, analytic H200 model).

The overhead is the share of a micro-batch's time (b = 1, full recompute) spent in all-to-alls: the time of the
analytic row minus the time of the same row on a copy of the hardware with free communication (infinite
bandwidth, zero latency), over the former; the formulas stay in ``dcp.planner.analytic``. SP sizes above 8
leave the node and cross InfiniBand. The figure is analytic only: no command measures the all-to-all share on
CPU (docs/results.md, "Not reproduced").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dcp.figures.common import Sizes, progress, pyplot, save, write_csv

SP_SIZES = (2, 4, 8, 16)
LENGTHS = tuple(2**k for k in range(10, 20))


def overhead_rows(model_name: str = "t1d-5b", hardware_name: str = "h200") -> list[dict]:
    from dcp.planner.analytic import analytic_row
    from dcp.planner.cost import micro_batch_time_s
    from dcp.sim.scenario import BF16_BYTES, scenario

    sc = scenario(model_name, hardware_name)
    free = dataclasses.replace(sc.hardware, intra_node_bw_bytes_per_s=1e30, inter_node_bw_bytes_per_s=1e30,
                               collective_latency_s=0.0)
    rows = []
    for s in LENGTHS:
        for p in SP_SIZES:
            kw = dict(world_size=32, dtype_bytes=BF16_BYTES, attention=sc.attention)
            real = analytic_row(sc.model, 0, s, 1, p, hardware=sc.hardware, **kw)
            ideal = analytic_row(sc.model, 0, s, 1, p, hardware=free, **kw)
            L = real.num_layers
            t, t0 = micro_batch_time_s(real, L), micro_batch_time_s(ideal, L)
            rows.append({"model": model_name, "hardware": hardware_name, "seq_len": s, "sp_size": p,
                         "step_time_s": t, "comm_time_s": t - t0, "comm_fraction": (t - t0) / t,
                         "inter_node": p > sc.hardware.ranks_per_node})
    return rows


def make(out_dir: Path, sizes: Sizes) -> list[Path]:
    rows = overhead_rows()
    csv_path = write_csv(out_dir / "fig5_alltoall.csv", rows)
    progress(f"fig5: {len(rows)} analytic points")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for p in SP_SIZES:
        pts = [r for r in rows if r["sp_size"] == p]
        ax.plot([r["seq_len"] / 1024 for r in pts], [100 * r["comm_fraction"] for r in pts], "o-", ms=3,
                label=f"SP={p}" + (" (inter-node)" if pts[0]["inter_node"] else ""))
    ax.set_xscale("log", base=2)
    lengths_k = sorted({r["seq_len"] // 1024 for r in rows})[::2]  # every other length: 1k, 4k, 16k, ...
    ax.set_xticks(lengths_k, [f"{k}k" for k in lengths_k])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("all-to-all share of step time (%)")
    ax.set_title("Transformer-1D (5B), H200: Ulysses all-to-all overhead")
    ax.legend(fontsize=7)
    return [csv_path, save(fig, out_dir / "fig5_alltoall.png")]
