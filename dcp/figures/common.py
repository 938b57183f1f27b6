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

from dcp.experiments.plot import METHOD_COLORS
from dcp.files import write_text, write_with
from dcp.named_models import MODELS, PAPER_MODELS

METHODS = ("bucket", "packed", "dcp-inter", "dcp-intra")
LOOKAHEAD_PER_RANK = 0
"""Planner look-ahead window per GPU for every figure; 0 keeps the planner's default (as ``dcp simulate``)."""
MODEL_DATASET_PREFIX = {name: MODELS[name].family for name in PAPER_MODELS}
"""Which distribution family each paper model trains on."""
COLORS = {**METHOD_COLORS, "megatron-dyncp": "#2ca02c", "flexsp": "#9467bd"}


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
QUICK = Sizes(fig4_samples=600, fig4_datasets=8, fig8_samples=800, fig9_samples_per_gpu=60,
              fig9_gpus=(8, 16, 32), fig10_rounds=2)


def progress(msg: str) -> None:
    """One line of detail above the figures' progress bar (stderr; the bar stays at the bottom)."""
    from tqdm.auto import tqdm

    tqdm.write(f"  {msg}", file=sys.stderr)


@dataclass(kw_only=True, slots=True, frozen=True)
class MethodRun:
    """One method's simulated epoch, the tokens of its optimizer steps and the batch it was asked for."""

    result: Any
    """The epoch's SimResult."""
    step_tokens: tuple[int, ...]
    """Tokens of every optimizer step (the global batch each trained)."""
    target_tokens_per_step: int
    """planning.tokens_per_step of the run (0: unset, the method's own batch)."""

    def columns(self) -> dict[str, Any]:
        """The CSV columns every figure row of a method carries: samples, steps, throughput, idle, the ideal
        fraction and tokens per step (min / median / max, and the target)."""
        from dcp.experiments.results import tokens_per_step_columns

        r = self.result
        return {"samples": r.num_samples, "steps": r.num_steps, "tokens_per_s": r.tokens_per_s,
                "idle_ratio": r.idle_ratio, "ideal_fraction": r.ideal_fraction,
                **tokens_per_step_columns(self.step_tokens, self.target_tokens_per_step)}


def simulate_runs(lengths: Sequence[int], model_name: str, hardware_name: str, world_size: int,
                  methods: Sequence[str] = METHODS, *, table: Any = None,
                  shapes: Sequence[tuple[int, int]] | None = None, gmin: int = 1, gmax: int = 4,
                  lookahead_per_rank: int = LOOKAHEAD_PER_RANK, tokens_per_step: int = 0) -> dict[str, MethodRun]:
    """MethodRun per method for one (lengths, model, hardware, GPUs); one analytic table shared by all;
    ``tokens_per_step`` is every run's planning.tokens_per_step (0: unset, each method its own batch)."""
    from dcp.sim.cluster import simulate, stronger_bucket
    from dcp.sim.scenario import paper_config, paper_table, scenario

    sc = scenario(model_name, hardware_name)
    table = table if table is not None else paper_table(sc, world_size, shapes=shapes)
    out = {}
    # "bucket" is the stronger (higher tokens/s) of Open-Sora's rule and its searched variant (bucket-search)
    for m in (*methods, "bucket-search") if "bucket" in methods else methods:
        cfg = paper_config(sc, m, gmin=gmin, gmax=gmax, world_size=world_size)
        cfg = cfg.replace(planning=dataclasses.replace(cfg.planning, tokens_per_step=tokens_per_step),
                          advanced=dataclasses.replace(cfg.advanced, lookahead_samples=lookahead_per_rank * world_size))
        result, steps = simulate(lengths, table, cfg, world_size, hardware=sc.hardware, shapes=shapes,
                                 return_steps=True)
        out[m] = MethodRun(result=result, step_tokens=tuple(s.tokens for s in steps),
                           target_tokens_per_step=tokens_per_step)
    if "bucket" in methods:
        out["bucket"] = out[stronger_bucket({m: run.result for m, run in out.items()})]
        del out["bucket-search"]
    return out


def simulate_methods(lengths: Sequence[int], model_name: str, hardware_name: str, world_size: int,
                     methods: Sequence[str] = METHODS, **kwargs: Any) -> dict[str, Any]:
    """SimResult per method (simulate_runs without the step tokens)."""
    return {m: run.result for m, run in simulate_runs(lengths, model_name, hardware_name, world_size, methods,
                                                       **kwargs).items()}


def batch_title(rows: Sequence[dict[str, Any]], *, peers: bool = False) -> str:
    """The batch a figure's rows were made at, for its title: 'tokens/step target 3.1M' or 'tokens/step: each
    method its own' (with ``peers``: the peers then hold bucket's mean, ``dcp.planner.peers``)."""
    from dcp.experiments.results import targets_label

    text = targets_label(r["target_tokens_per_step"] for r in rows)
    unset = all(r["target_tokens_per_step"] == 0 for r in rows)
    return text + ("; peers at bucket's mean" if peers and unset else "")


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
