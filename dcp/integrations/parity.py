"""``dcp parity``: does DCP train to the same loss as the bucket baseline? Loss against tokens, both methods.

The same small Hugging Face Llama (byte-level, built from a config) trains on the same real,
length-diverse corpus (the Python standard library's own source, :class:`~dcp.integrations.corpus.ByteCorpus`)
at W = 2 gloo processes, once per (method, seed): ``bucket`` and ``dcp-intra``, with the same optimizer,
learning rate and samples (every sample exactly once per epoch, so the same tokens). The seed sets the
model's initial weights and the planner's data order; comparing the methods' gap with the spread between
seeds of one method tells whether any difference is more than run-to-run noise. Each run also reports the
loss on held-out samples (the next pieces of the same shuffled corpus) after training.

Writes to ``--out`` (default ``runs/parity``): ``steps.csv`` (one row per optimizer step: method, seed,
step, cumulative tokens, step loss, SP sizes), ``summary.csv`` (one row per run), ``loss_vs_tokens.png``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from dcp.argtypes import positive_float, positive_int, process_count, sample_count
from dcp.files import claim_dir, write_with

METHODS = ("bucket", "dcp-intra")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/parity", help="output folder (default: %(default)s)")
    parser.add_argument("--samples", type=sample_count, default=480, help="training samples (default: %(default)s)")
    parser.add_argument("--held-out", type=sample_count, default=64, help="held-out samples (default: %(default)s)")
    parser.add_argument("--max-len-tokens", type=positive_int, default=512, help="longest sample (default: %(default)s)")
    parser.add_argument("--epochs", type=positive_int, default=1, help="epochs per run (default: %(default)s)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds per method (default: %(default)s)")
    parser.add_argument("--methods", default=",".join(METHODS), help="methods (default: %(default)s)")
    parser.add_argument("--lr", type=positive_float, default=2e-3, help="AdamW learning rate (default: %(default)s)")
    parser.add_argument("--mem-capacity-gib", type=positive_float, default=0.005,
                        help="emulated per-rank memory, so that DCP mixes SP sizes (default: %(default)s)")
    parser.add_argument("--world-size", type=process_count, default=2, help="gloo processes (default: %(default)s)")
    parser.add_argument("--plot-only", action="store_true",
                        help="rebuild curves.csv, the verdict and the PNG from steps.csv and summary.csv in --out")
    parser.add_argument("--gmax", type=positive_int, default=1,
                        help="planning.gmax: 1 keeps DCP's steps about as large as bucket's (ga_steps 1), so both "
                             "take optimizer steps of similar token counts (default: %(default)s)")


class ParityError(ValueError):
    """A parity argument is unusable; the message names it and the fix."""


def _check(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    try:
        seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    except ValueError:
        raise ParityError(f"--seeds ({args.seeds!r}) must be comma-separated integers: e.g. --seeds 0,1") from None
    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    bad = [m for m in methods if m not in ("bucket", "packed", "dcp-inter", "dcp-intra")]
    if bad or not methods:
        raise ParityError(f"--methods ({args.methods!r}) must name bucket, packed, dcp-inter or dcp-intra: "
                          "e.g. --methods bucket,dcp-intra")
    if not seeds:
        raise ParityError(f"--seeds ({args.seeds!r}) is empty: give at least one seed, e.g. --seeds 0,1")
    for name in ("samples", "held_out", "epochs", "world_size", "gmax"):
        if getattr(args, name) < 1:
            raise ParityError(f"--{name.replace('_', '-')} ({getattr(args, name)}) must be >= 1: pass a positive count")
    return seeds, methods


def tiny_llama(seed: int) -> Any:
    """The byte-level Llama every run trains (4 layers, width 64, 4 heads, 0.2 M parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096))


def train_one(rank: int, world_size: int, method: str, seed: int, opts: dict[str, Any]) -> dict[str, Any]:
    """One run on one rank (spawned by :func:`run`); rank 0 returns the steps and the held-out loss."""
    import torch

    import dcp
    from dcp.config import AdvancedConfig, PlanningConfig, ProfilingConfig, RuntimeConfig
    from dcp.integrations import hf
    from dcp.integrations.corpus import ByteCorpus
    from dcp.runtime.context import SPContext

    every = ByteCorpus(num_samples=opts["samples"] + opts["held_out"], max_len_tokens=opts["max_len_tokens"])
    train = ByteCorpus(num_samples=opts["samples"], max_len_tokens=opts["max_len_tokens"])  # the first pieces
    model = tiny_llama(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts["lr"])
    config = dcp.DCPConfig(
        profiling=ProfilingConfig(seq_group_edges=(128, 256, 512), max_micro_batch_size=4, cache_dir=opts["cache_dir"]),
        planning=PlanningConfig(method=method, sp_sizes=(1, 2), mem_capacity_gib=opts["mem_capacity_gib"], seed=seed,
                                gmax=opts["gmax"]),
        runtime=RuntimeConfig(log_every=10**9), advanced=AdvancedConfig(stats_every=1),
    )
    mgr = dcp.set_manager(model, train, config, optimizer=optimizer)
    engine = mgr.engine
    t0 = time.perf_counter()
    for _ in range(opts["epochs"]):
        if mgr.need_profile():
            mgr.init_profiler()
        for batch in mgr.get_data_iter():
            mgr.optimize_dynamics(batch, engine)
            with mgr.profile(batch, engine):
                loss = engine(batch)
                engine.backward(loss)
                engine.step()
    wall_s = time.perf_counter() - t0
    if rank != 0:
        return {}
    forward = hf.HFCausalLM(model).forward
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(opts["samples"], len(every)):
            loss_sum, n = forward(model, every.collate([every[i]]), SPContext.single())
            total, count = total + float(loss_sum), count + int(n)
    steps = [{"epoch": s.epoch, "step": s.global_step, "tokens": s.tokens, "count": s.count, "loss": s.loss,
              "summary": s.summary} for s in mgr.step_stats]
    return {"steps": steps, "held_out_loss": total / count, "wall_s": wall_s}


def run(args: argparse.Namespace) -> int:
    try:
        import pandas as pd
    except ImportError:
        raise ValueError("dcp parity needs pandas (not installed) for its loss curves: "
                         "pip install 'dcp[hf,parity]'") from None
    from tqdm.auto import tqdm

    from dcp.distributed.launch import run_distributed

    seeds, methods = _check(args)
    out = Path(args.out)
    if args.plot_only:
        missing = [n for n in ("steps.csv", "summary.csv") if not (out / n).exists()]
        if missing:
            raise ParityError(f"--out ({str(out)!r}) lacks {missing}: run `dcp parity --out {out}` first")
        return _report(pd.read_csv(out / "steps.csv"), pd.read_csv(out / "summary.csv"), out, args)
    # before any run: a folder of the user's own files, or one that cannot be written, is refused in one line
    claim_dir(out, flag="--out", command="dcp parity", adopt=_only_parity_files)
    opts = {"samples": args.samples, "held_out": args.held_out, "max_len_tokens": args.max_len_tokens,
            "epochs": args.epochs, "lr": args.lr, "gmax": args.gmax, "mem_capacity_gib": args.mem_capacity_gib,
            "cache_dir": str(out / "profile_cache")}
    rows, summary = [], []
    runs = [(m, s) for s in seeds for m in methods]  # interleaved: A B A B
    for method, seed in tqdm(runs, desc="parity runs", unit="run"):
        res = run_distributed(train_one, args.world_size, method, seed, opts, timeout_s=3600)[0]
        tokens = 0
        for s in res["steps"]:
            tokens += s["tokens"]
            rows.append({"method": method, "seed": seed, **s, "tokens_cum": tokens})
        summary.append({"method": method, "seed": seed, "steps": len(res["steps"]), "tokens": tokens,
                        "final_train_loss": _tail_mean(res["steps"]), "held_out_loss": res["held_out_loss"],
                        "train_wall_s": round(res["wall_s"], 2)})
    steps = pd.DataFrame(rows)
    table = pd.DataFrame(summary)
    write_with(out / "steps.csv", lambda tmp: steps.to_csv(tmp, index=False))  # atomic
    write_with(out / "summary.csv", lambda tmp: table.to_csv(tmp, index=False))
    return _report(steps, table, out, args)


_OWN_FILES = frozenset({"steps.csv", "summary.csv", "curves.csv", "loss_vs_tokens.png", "profile_cache"})


def _only_parity_files(folder: Path) -> bool:
    """True when ``folder`` holds only a parity run's files (an unmarked folder of an older dcp): its names,
    and steps.csv / summary.csv starting with parity's method and seed columns."""
    if not {e.name for e in folder.iterdir()} <= _OWN_FILES:
        return False
    for name in ("steps.csv", "summary.csv"):
        path = folder / name
        if path.exists():
            with path.open(errors="replace") as f:
                if not f.readline().startswith("method,seed,"):
                    return False
    return True


def _report(steps: Any, table: Any, out: Path, args: argparse.Namespace) -> int:
    curves = binned_curves(steps)
    write_with(out / "curves.csv", lambda tmp: curves.to_csv(tmp, index=False))
    verdict = compare(table, curves)
    plot(steps, curves, out / "loss_vs_tokens.png", args, verdict)
    print(table.to_string(index=False))
    for line in verdict["lines"]:
        print(line)
    print(f"wrote {out / 'steps.csv'}, {out / 'summary.csv'}, {out / 'curves.csv'}, {out / 'loss_vs_tokens.png'}")
    return 0


def _tail_mean(steps: list[dict[str, Any]], frac: float = 0.2) -> float:
    """Token-weighted mean loss of the last ``frac`` of the run's tokens (less noisy than the last step)."""
    total = sum(s["tokens"] for s in steps)
    seen, num, den = 0, 0.0, 0
    for s in steps:
        seen += s["tokens"]
        if seen > (1 - frac) * total:
            num, den = num + s["loss"] * s["count"], den + s["count"]
    return num / den


def binned_curves(steps: Any, bins: int = 12) -> Any:
    """Token-weighted mean step loss per run in equal token bins (the same bin edges for every run)."""
    import numpy as np
    import pandas as pd

    edges = np.linspace(0, steps["tokens_cum"].max(), bins + 1)
    out = []
    for (method, seed), run in steps.groupby(["method", "seed"], sort=False):
        index = np.clip(np.searchsorted(edges, run["tokens_cum"], side="left") - 1, 0, bins - 1)
        for b in range(bins):
            part = run[index == b]
            if len(part):
                out.append({"method": method, "seed": seed, "bin": b, "tokens_mid": (edges[b] + edges[b + 1]) / 2,
                            "loss": float((part["loss"] * part["count"]).sum() / part["count"].sum())})
    return pd.DataFrame(out)


def compare(table: Any, curves: Any) -> dict[str, Any]:
    """Per token bin: the gap between the methods' mean curves vs the spread between seeds (the larger of
    the two methods' max - min); and the same for the held-out loss."""
    import numpy as np

    lines: list[str] = []
    methods = list(dict.fromkeys(table["method"]))
    result: dict[str, Any] = {"lines": lines}
    if len(methods) < 2:
        return result
    a, b = methods[0], methods[1]
    wide = curves.pivot_table(index="bin", columns=["method", "seed"], values="loss")
    gap = (wide[b].mean(axis=1) - wide[a].mean(axis=1)).abs()
    result.update(mean_gap=float(gap.mean()), max_gap=float(gap.max()))
    lines.append(f"training loss, {b} vs {a}: |gap of the seed means| per token bin: mean {gap.mean():.4f}, "
                 f"max {gap.max():.4f} nats")
    held = table.groupby("method")["held_out_loss"].mean()
    lines.append("held-out loss: " + ", ".join(
        f"{m} {held[m]:.4f} (seeds {', '.join(f'{v:.4f}' for v in table[table.method == m].held_out_loss)})"
        for m in methods))
    if min(wide[m].shape[1] for m in (a, b)) < 2:
        lines.append("one seed per method: no run-to-run spread to compare with (use --seeds 0,1)")
        return result
    spread = np.maximum(wide[a].max(axis=1) - wide[a].min(axis=1), wide[b].max(axis=1) - wide[b].min(axis=1))
    over = [int(k) for k in gap.index[gap > spread]]
    held_gap = abs(held[b] - held[a])
    held_spread = max(float(np.ptp(table[table.method == m].held_out_loss)) for m in (a, b))
    result.update(mean_seed_spread=float(spread.mean()), bins_over=over, bins=len(gap), held_gap=float(held_gap),
                  held_seed_spread=held_spread)
    lines.append(f"seed-to-seed spread per bin: mean {spread.mean():.4f} nats; the method gap exceeds it in "
                 f"{len(over)} of {len(gap)} bins {over if over else ''}".rstrip())
    lines.append(f"held-out: method gap {held_gap:.4f} vs seed spread {held_spread:.4f} nats")
    ok = gap.mean() <= spread.mean() and held_gap <= held_spread
    result["within_noise"] = bool(ok)
    lines.append("verdict: " + ("the methods agree within run-to-run noise (mean gap <= mean seed spread, held-out "
                                "gap <= held-out seed spread)" if ok else
                                "the gap exceeds the seed-to-seed spread (see the figure and curves.csv)"))
    return result


def plot(steps: Any, curves: Any, path: Path, args: argparse.Namespace, verdict: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bucket": "tab:blue", "dcp-intra": "tab:orange", "dcp-inter": "tab:green", "packed": "tab:red"}
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for (method, seed), run in steps.groupby(["method", "seed"], sort=False):
        color = colors.get(method, "gray")
        ax.plot(run["tokens_cum"] / 1e3, run["loss"], color=color, alpha=0.18, linewidth=0.8)
        c = curves[(curves.method == method) & (curves.seed == seed)]
        seeds = list(dict.fromkeys(steps[steps.method == method]["seed"]))
        ax.plot(c["tokens_mid"] / 1e3, c["loss"], color=color, linestyle=styles[seeds.index(seed) % 4], linewidth=2,
                marker="o", markersize=3, label=f"{method}, seed {seed}")
    ax.set_xlabel("training tokens seen (thousands of bytes)")
    ax.set_ylabel("training loss (cross-entropy, nats per byte)")
    title = (f"HF Llama (0.2 M params) on Python stdlib source, W = {args.world_size}, "
             f"{args.samples} samples x {args.epochs} epoch(s)")
    if "mean_seed_spread" in verdict:
        title += (f"\ntoken bins (markers): method gap mean {verdict['mean_gap']:.3f} vs seed spread mean "
                  f"{verdict['mean_seed_spread']:.3f} nats\nheld-out loss: method gap {verdict['held_gap']:.3f} vs "
                  f"seed spread {verdict['held_seed_spread']:.3f} nats; faint lines: every step")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
