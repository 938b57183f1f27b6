"""Shared pieces of the paper figures: sizes, simulation helper, CSV writing, matplotlib setup."""

from __future__ import annotations

import csv
import dataclasses
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp.files import write_text, write_with
from dcp.named_models import MODELS, PAPER_MODELS

METHODS = ("bucket", "packed", "dcp-inter", "dcp-intra")
LOOKAHEAD_PER_RANK = 0
"""Planner look-ahead window per GPU for every figure; 0 keeps the planner's default (as ``dcp simulate``)."""
MODEL_DATASET_PREFIX = {name: MODELS[name].family for name in PAPER_MODELS}
"""Which distribution family each paper model trains on."""
COLORS = {"bucket": "#7f7f7f", "packed": "#bcbd22", "dcp-inter": "#1f77b4", "dcp-intra": "#d62728",
          "megatron-dyncp": "#2ca02c", "flexsp": "#9467bd"}


@dataclass(kw_only=True, slots=True, frozen=True)
class Sizes:
    """Sample counts of the figure runs (full: the documented figures; quick: tests and smoke runs)."""

    fig4_samples: int
    """Samples per sweep dataset (Figure 4)."""
    fig4_datasets: int
    """Sweep datasets used (140 = all)."""
    fig8_samples: int
    """Samples per (model, dataset) at 32 GPUs (Figure 8)."""
    fig9_samples_per_gpu: int
    """Weak scaling: samples per GPU (Figure 9)."""
    fig9_gpus: tuple[int, ...]
    """Weak-scaling cluster sizes."""
    fig10_rounds: int
    """Single-length datasets of Figure 10 hold rounds x GPUs x the larger planner b of micro-batch samples,
    so every GPU runs several micro-batches under both planners."""


FULL = Sizes(fig4_samples=8000, fig4_datasets=140, fig8_samples=30000, fig9_samples_per_gpu=1000,
             fig9_gpus=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), fig10_rounds=8)
QUICK = Sizes(fig4_samples=600, fig4_datasets=8, fig8_samples=1500, fig9_samples_per_gpu=100,
              fig9_gpus=(8, 16, 32), fig10_rounds=2)


def progress(msg: str) -> None:
    """One line of detail above the figures' progress bar (stderr; the bar stays at the bottom)."""
    from tqdm.auto import tqdm

    tqdm.write(f"  {msg}", file=sys.stderr)


def simulate_methods(lengths: Sequence[int], model_name: str, hardware_name: str, world_size: int,
                     methods: Sequence[str] = METHODS, *, table: Any = None,
                     shapes: Sequence[tuple[int, int]] | None = None, gmin: int = 1, gmax: int = 4,
                     lookahead_per_rank: int = LOOKAHEAD_PER_RANK) -> dict[str, Any]:
    """SimResult per method for one (lengths, model, hardware, GPUs); one analytic table shared by all."""
    from dcp.sim.cluster import simulate, stronger_bucket
    from dcp.sim.scenario import paper_config, paper_table, scenario

    sc = scenario(model_name, hardware_name)
    table = table if table is not None else paper_table(sc, world_size, shapes=shapes)
    out = {}
    # "bucket" is the stronger (higher tokens/s) of Open-Sora's rule and its searched variant (bucket-search)
    for m in (*methods, "bucket-search") if "bucket" in methods else methods:
        cfg = paper_config(sc, m, gmin=gmin, gmax=gmax)
        cfg = cfg.replace(planning=dataclasses.replace(cfg.planning,
                                                       lookahead_samples=lookahead_per_rank * world_size))
        out[m] = simulate(lengths, table, cfg, world_size, hardware=sc.hardware, shapes=shapes)
    if "bucket" in methods:
        out["bucket"] = out[stronger_bucket(out)]
        del out["bucket-search"]
    return out


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return write_text(path, buf.getvalue())  # atomic


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120))  # atomic
    pyplot().close(fig)
    return path
