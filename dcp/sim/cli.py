"""``dcp simulate``: run the planner over a simulated cluster on your own sequence lengths.

    dcp simulate --lengths my_lengths.csv --model t1d-5b --hardware h200 --gpus 32 --method dcp-intra
    dcp simulate --dataset t2d-short --model t2d-1.2b --hardware h100 --gpus 64 --method all --json
    dcp simulate --dataset t1d-balanced --scale cpu --config run.toml --table .dcp_cache/t.csv --hardware cpu --gpus 2

Prints one row per method (throughput, idle ratios, ideal bound); with --json the last line is a JSON
object ``{"tokens_per_s": .., "idle_ratio": .., "ideal_fraction": .., "control_plane_share": ..}`` (per
method under "methods" for --method all); control_plane_share is the runtime's control plane (host time per
step measured by ``dcp bench scale``, its collectives priced on the simulated fabric: dcp.sim.control) as a
share of the epoch's time, at the config's runtime.log_every.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

from dcp.argtypes import nonneg_int, positive_int, sample_count, world_size
from dcp.config import METHODS, PEER_METHODS
from dcp.named_models import PAPER_MODELS
from dcp.planner.step_tokens import batch_tokens

DEFAULT_NUM_SAMPLES = 20000
SAMPLES_PER_GPU = 625
"""--num-samples default: DEFAULT_NUM_SAMPLES, or this many per simulated GPU when that is more (20k / 32 GPUs,
so 32 GPUs and fewer keep 20k). An epoch must hold many of DCP's steps, whose size grows with the GPUs: at
4096 GPUs 40 per GPU (163,840 samples, t1d-balanced) made 3 steps, one of 985M tokens and two small ones that
left 57% of the GPU time idle (DCP-intra 0.43 of the ideal bound); 625 per GPU (2.56M samples) make 29 steps
at 0.973, simulated in ~17 s on a 2-core host."""
DEFAULT_LOOKAHEAD_PER_RANK = 0
"""0: the planner's own default window (sized by work: enough samples to fill a step that holds the longest
micro-batch). Paper-scale distributions are heavy-tailed, and the window decides how well DCP balances a
step holding a 512k-token sample; docs/simulator.md shows the effect of other values."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--lengths", metavar="FILE", help="CSV with a 'tokens' column (or 'frames' and 'spatial_tokens')")
    src.add_argument("--dataset", metavar="NAME", help="a distribution of datasets/ (e.g. t1d-short, t2d-zipf; default: "
                     "t1d-balanced, or t2d-balanced for a t2d model)")
    parser.add_argument("--scale", default="paper", choices=("paper", "cpu"), help="--dataset length scale")
    parser.add_argument("--num-samples", type=sample_count, default=None,
                        help=f"--dataset samples to draw (default: {DEFAULT_NUM_SAMPLES}, or {SAMPLES_PER_GPU} per GPU when more)")
    parser.add_argument("--seed", type=nonneg_int, default=0, help="--dataset seed and the planner's shuffle seed")
    parser.add_argument("--model", default="t1d-5b", choices=PAPER_MODELS,
                        help="paper model shape (with --config: only its attention layout, 1d or 2d, is used)")
    parser.add_argument("--hardware", default="h200", choices=("h100", "h200", "cpu"), help="simulated device")
    parser.add_argument("--config", metavar="TOML", help="a DCPConfig file: its model and planning sections replace "
                        "the paper model's (method and look-ahead still come from the flags)")
    parser.add_argument("--engine", default=None, choices=("ddp", "deepspeed", "fsdp2", "fsdp2-zero3"),
                        help="engine whose state memory (parameters, gradients, optimizer) the rows count (default: "
                        "--config's runtime.engine, else deepspeed, the paper's ZeRO-1)")
    parser.add_argument("--loss-chunk-tokens", type=nonneg_int, default=0,
                        help="analytic rows: the head holds the logits of this many tokens at once (a chunked loss, "
                        "dcp.models.loss); 0: of the whole micro-batch, as the paper's models")
    parser.add_argument("--gpus", type=world_size, default=32, help="simulated GPUs (world size)")
    parser.add_argument("--method", default="dcp-intra", choices=(*METHODS, *PEER_METHODS, "all"),
                        help="planning method (all: every method but the peers)")
    parser.add_argument("--tokens-per-step", type=nonneg_int, default=0,
                        help="planning.tokens_per_step, the global batch in tokens (0: the config's; the peers then "
                        "take bucket's mean tokens per step)")
    parser.add_argument("--table", metavar="FILE", help="a measured profile table (CSV/parquet) instead of the analytic "
                        "one; a table measured on one GPU (p = 1 rows only) is extended to the SP sizes with the "
                        "network model (dcp.sim.derive)")
    parser.add_argument("--gmin", type=positive_int, default=1, help="planning.gmin")
    parser.add_argument("--gmax", type=positive_int, default=4, help="planning.gmax")
    parser.add_argument("--lookahead-per-rank", type=nonneg_int, default=DEFAULT_LOOKAHEAD_PER_RANK,
                        help="planner look-ahead window in samples per GPU (default 0: the planner's work-sized default)")
    parser.add_argument("--micro-batch-tokens", default="auto", choices=("off", "auto"),
                        help="advanced.micro_batch_tokens: DCP micro-batches of short 1D documents sized by tokens "
                        "where predicted cheaper (auto, the default), or by samples only (off)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def _lengths(args: argparse.Namespace):
    from dcp.data_dists import load_lengths, load_lengths_csv

    if args.lengths:
        return load_lengths_csv(args.lengths)
    dataset = args.dataset
    if args.num_samples is None:
        args.num_samples = max(DEFAULT_NUM_SAMPLES, SAMPLES_PER_GPU * args.gpus)
    if not dataset:  # `dcp simulate --gpus 4096` alone: the paper's balanced mix of the simulated model's kind
        dataset = "t2d-balanced" if args.model.startswith("t2d") else "t1d-balanced"
        print(f"dcp simulate: no --lengths or --dataset given: simulating --dataset {dataset} "
              f"({args.num_samples} samples)", file=sys.stderr)
    return load_lengths(dataset, scale=args.scale, num_samples=args.num_samples, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    from dcp.config import config_from_dict, read_toml
    from dcp.planner.analytic import analytic_table
    from dcp.planner.batch_settings import check_batch_settings
    from dcp.planner.table import ProfileTable
    from dcp.sim.cluster import simulate, stronger_bucket
    from dcp.sim.derive import derive_sp_table, is_single_gpu
    from dcp.sim.scenario import frames_per_group, paper_config, paper_table, scenario

    try:
        if args.gpus < 1:
            raise ValueError(f"--gpus ({args.gpus}) must be >= 1: pass the number of simulated GPUs")
        if args.lookahead_per_rank < 0:
            raise ValueError(f"--lookahead-per-rank ({args.lookahead_per_rank}) must be >= 0: use 0 for the default")
        sc = scenario(args.model, args.hardware)
        methods = list(METHODS) if args.method == "all" else [args.method]
        configs = {}
        custom = None
        if args.config:
            raw = read_toml(args.config)
            if args.engine:  # before the config's own check, which counts that engine's state
                raw.setdefault("runtime", {})["engine"] = args.engine
            custom = config_from_dict(raw)
        for m in methods:
            cfg = custom or paper_config(sc, m, gmin=args.gmin, gmax=args.gmax, seed=args.seed, world_size=args.gpus)
            configs[m] = cfg.replace(planning=dataclasses.replace(
                cfg.planning, method=m, tokens_per_step=args.tokens_per_step or cfg.planning.tokens_per_step),
                runtime=dataclasses.replace(cfg.runtime, engine=args.engine or cfg.runtime.engine),
                advanced=dataclasses.replace(cfg.advanced, lookahead_samples=args.lookahead_per_rank * args.gpus,
                                             micro_batch_tokens=args.micro_batch_tokens))
        if args.print_config:
            print(configs[methods[0]].to_json())
            return 0
        lengths = _lengths(args)
        engine = args.engine or (custom.runtime.engine if custom is not None else "deepspeed")
        # the same target for every method: checked once, on a DCP method's config under --method all (the
        # baselines ignore --micro-batch-tokens there by design)
        shown = configs[args.method if args.method != "all" else "dcp-intra"]
        for line in check_batch_settings(lengths.tokens, shown):
            print(f"dcp simulate: warning: {line}", file=sys.stderr)
        if args.table:
            table = ProfileTable.load(args.table)
            first = configs[methods[0]]
            if is_single_gpu(table) and any(1 < p <= args.gpus for p in first.planning.sp_sizes):
                if table.meta.model != first.model.name:
                    raise ValueError(
                        f"--table model ({table.meta.model!r}) is not the simulated model ({first.model.name!r}): "
                        "pass --model with the table's model, or --config with its shape, to extend it to p > 1")
                if first.model.num_layers != table.num_layers:
                    # The measured model (e.g. the paper's shape at 8 layers): sync and state follow its size.
                    print(f"note: {args.table} has {table.num_layers} layers; simulating that model "
                          f"({first.model.name} with {table.num_layers} layers)", file=sys.stderr)
                    configs = {m: c.replace(model=dataclasses.replace(c.model, num_layers=table.num_layers))
                               for m, c in configs.items()}
                    first = configs[methods[0]]
                frames = None
                if sc.attention == "2d" and lengths.shapes is not None:
                    frames = frames_per_group(table.seq_group_edges, lengths.shapes)
                table = derive_sp_table(table, model=first.model, attention=sc.attention, hardware=sc.hardware,
                                        sp_sizes=first.planning.sp_sizes, world_size=args.gpus,
                                        frames_per_group=frames, engine=engine)
                print(f"note: {args.table} holds p = 1 rows only; p > 1 derived from them with the "
                      f"{sc.hardware.name} network model", file=sys.stderr)
        elif custom is not None:
            first = configs[methods[0]]
            table = analytic_table(first.model, first.profiling.seq_group_edges, sp_sizes=first.planning.sp_sizes,
                                   max_micro_batch_size=first.profiling.max_micro_batch_size, world_size=args.gpus,
                                   hardware=sc.hardware, dtype_bytes=first.model.param_bytes, attention=sc.attention,
                                   mem_capacity_bytes=first.planning.mem_capacity_bytes, engine=engine,
                                   loss_chunk_tokens=args.loss_chunk_tokens)
        else:
            if (lengths.shapes is not None) != (sc.attention == "2d"):
                kind = "2d (frames, spatial_tokens)" if lengths.shapes is not None else "1d (tokens)"
                print(f"note: {kind} lengths on model {args.model}; using total tokens per sample", file=sys.stderr)
            table = paper_table(sc, args.gpus, shapes=lengths.shapes if sc.attention == "2d" else None, engine=engine,
                                loss_chunk_tokens=args.loss_chunk_tokens)
    except (ValueError, OSError) as exc:
        print(f"dcp simulate: error: {exc}", file=sys.stderr)
        return 2
    n = len(lengths.tokens)
    print(f"# {n} samples, {sum(lengths.tokens):,} tokens, max {max(lengths.tokens):,}; model {configs[methods[0]].model.name}, "
          f"{sc.hardware.name}, {args.gpus} GPUs, table {args.table or 'analytic'}")
    w = max(10, *map(len, methods))  # bucket-search is 13 characters
    print(f"{'method':<{w}} {'steps':>6} {'tokens/s':>12} {'tok/s/GPU':>10} {'idle':>6} {'idle_b':>6} "
          f"{'idle_max':>8} {'ideal tok/s':>12} {'ideal_frac':>10} {'sync%':>6} {'ctl%':>5}  tokens/step min / median / max")
    out, per_step = {}, {}
    for m in methods:
        try:
            r, steps = simulate(lengths.tokens, table, configs[m], args.gpus, hardware=sc.hardware,
                                shapes=lengths.shapes, return_steps=True)
        except ValueError as exc:
            print(f"dcp simulate: error: {m}: {exc}", file=sys.stderr)
            return 2
        out[m] = r
        tok = per_step[m] = sorted(s.tokens for s in steps)
        med = statistics.median(tok)
        print(f"{m:<{w}} {r.num_steps:>6} {r.tokens_per_s:>12.0f} {r.tokens_per_s / args.gpus:>10.0f} "
              f"{r.idle_ratio:>6.3f} {r.idle_ratio_batch:>6.3f} {max(r.idle_ratio_per_rank):>8.3f} "
              f"{r.ideal_tokens_per_s:>12.0f} "
              f"{r.ideal_fraction:>10.3f} {100 * r.sync_time_s / r.total_time_s:>6.1f} "
              f"{100 * r.control_plane_share:>5.2f}  "
              f"{tok[0]:,} / {med:,.0f} / {tok[-1]:,}")
    target, line = batch_tokens(configs[methods[0]], lengths.tokens, args.gpus)  # what every method planned at
    print(f"# {line}" + ("; the peers take bucket's mean" if not target and any(m in PEER_METHODS for m in methods)
                         else ""))
    base = stronger_bucket(out)
    if base is not None:  # DCP's speedup over the stronger of the two bucket baselines
        print(f"# speedup over {base}: " + ", ".join(f"{m} {out[m].tokens_per_s / out[base].tokens_per_s:.2f}x"
                                                     for m in out if m.startswith("dcp")))
    if args.json:
        def brief(m):
            r, tok = out[m], per_step[m]
            return {"tokens_per_s": r.tokens_per_s, "idle_ratio": r.idle_ratio, "ideal_fraction": r.ideal_fraction,
                    "idle_ratio_batch": r.idle_ratio_batch, "ideal_tokens_per_s": r.ideal_tokens_per_s,
                    "idle_ratio_max_gpu": max(r.idle_ratio_per_rank), "num_steps": r.num_steps,
                    "tokens_per_step_min": tok[0], "tokens_per_step_median": statistics.median(tok),
                    "tokens_per_step_max": tok[-1], "control_plane_share": r.control_plane_share,
                    **layouts_report(r, configs[m].model)}
        if len(methods) == 1:
            print(json.dumps(brief(methods[0])))
        else:
            print(json.dumps({"methods": {m: brief(m) for m in out}}))
    return 0


def layouts_report(r, model) -> dict:
    """``layouts_used`` ("UxC" -> micro-batches, dcp.planner.layout), the largest SP size used, and the SP
    size of the micro-batch with the longest sample."""
    from dcp.planner.layout import layout_name, sp_layout

    used = {layout_name(*sp_layout(p, model.num_heads, model.kv_heads)): n for p, n in r.micro_batches_by_sp if n}
    return {"layouts_used": used, "max_sp_size": max((p for p, n in r.micro_batches_by_sp if n), default=0),
            "longest_sample_sp_size": r.longest_sample_sp}
