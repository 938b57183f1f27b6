"""``dcp plan``: plan an epoch for a list of sample lengths and print the steps and an epoch summary."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from dcp.argtypes import nonneg_int, sample_count, world_size
from dcp.config import METHODS, PEER_METHODS, DCPConfig, ModelShapeConfig, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="TOML run config (dcp.config.load_config); default: built-in defaults"
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--lengths", help="CSV with a 'tokens' column, or one integer per line (sample id = row)"
    )
    src.add_argument("--synthetic", type=sample_count, metavar="N", help="N seeded synthetic lengths (default 2000)")
    parser.add_argument("--world-size", type=world_size, default=None,
                        help="ranks W (default: the table's, else 8)")
    parser.add_argument(
        "--table", help="profile table (.csv or .parquet); default: analytic table for the model"
    )
    parser.add_argument("--method", choices=METHODS + PEER_METHODS, help="override planning.method")
    parser.add_argument("--epoch", type=nonneg_int, default=0, help="epoch index (changes the shuffle)")
    parser.add_argument("--steps", type=int, default=10, help="print the first K steps (0: none, -1: all)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object last")


LEGEND = ("sp, layout, ga, recompute: one value per SP group in rank order (SP size, its ulysses x context layout, "
          "micro-batches = ga_steps, layers recomputed), run-length encoded: '27,26x2' = 27, 26, 26; '0x29' = 0 "
          "for 29 groups; layouts as 'UxC', repeated as 'UxC*n'")
"""The one-line key printed under the step table."""


def _build_table(config: DCPConfig, world_size: int):
    from dcp.planner.analytic import analytic_table_for

    return analytic_table_for(config, world_size)


def rle(values: Sequence[object], sep: str = "x") -> str:
    """Run-length form of a rank-ordered list: [8, 4, 4, 1] -> '8,4x2,1'."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}" + (f"{sep}{j - i}" if j - i > 1 else ""))
        i = j
    return ",".join(out)


def step_row(plan, model: ModelShapeConfig | None = None) -> dict:
    """One step's row; ``model`` (its heads) names each group's layout (dcp.planner.layout)."""
    from dcp.planner.layout import layout_name, sp_layout

    model = model or ModelShapeConfig()
    return {
        "step": plan.step,
        "sp": rle([g.sp_size for g in plan.groups]),
        "layout": rle([layout_name(*sp_layout(g.sp_size, model.num_heads, model.kv_heads)) for g in plan.groups],
                      sep="*"),
        "ga": rle([g.ga_steps for g in plan.groups]),
        "recompute": rle([g.recompute_layers for g in plan.groups]),
        "step_time_s": round(plan.step_time_s, 6),
        "idle_batch": round(plan.idle_ratio_batch, 4),
        "idle_gpu": round(plan.idle_ratio_gpu, 4),
        "tokens": plan.tokens,
        "samples": plan.samples,
    }


def summarize(plans: list, world_size: int) -> dict:
    total_t = sum(p.step_time_s for p in plans)
    tokens = sum(p.tokens for p in plans)
    weighted_idle = sum(p.idle_ratio_gpu * p.step_time_s for p in plans) / total_t if total_t else 0.0
    return {
        "steps": len(plans),
        "samples": sum(p.samples for p in plans),
        "tokens": tokens,
        "predicted_epoch_time_s": round(total_t, 6),
        "tokens_per_s": round(tokens / total_t, 3) if total_t else 0.0,
        "tokens_per_gpu_s": round(tokens / total_t / world_size, 3) if total_t else 0.0,
        "idle_gpu_time_weighted": round(weighted_idle, 4),
        "mean_idle_batch": round(sum(p.idle_ratio_batch for p in plans) / len(plans), 4) if plans else 0.0,
        **_step_tokens(plans),
    }


def _step_tokens(plans: list) -> dict:
    """Tokens per optimizer step: min / median / max (the global batch each step trains)."""
    import numpy as np

    from dcp.planner.step_tokens import step_tokens

    tok = step_tokens(plans)
    if not len(tok):
        return {"tokens_per_step_min": 0, "tokens_per_step_median": 0, "tokens_per_step_max": 0}
    return {"tokens_per_step_min": int(tok.min()), "tokens_per_step_median": float(np.median(tok)),
            "tokens_per_step_max": int(tok.max())}


def run(args: argparse.Namespace) -> int:
    from dcp.data_dists import load_lengths_csv
    from dcp.planner.assemble import EpochPlanner
    from dcp.planner.batch_settings import check_batch_settings
    from dcp.planner.lengths import synthetic_lengths
    from dcp.planner.step_tokens import batch_tokens
    from dcp.planner.table import ProfileTable, check_table_for_model, with_engine_state
    from dcp.planner.tokens import token_pack_line

    try:
        config = load_config(args.config) if args.config else DCPConfig()
        if args.method:
            config = config.replace(planning=_replace(config.planning, method=args.method))
        table = ProfileTable.load(args.table) if args.table else None
        world = args.world_size or (table.meta.world_size if table is not None else 8)
        if table is None:
            table = _build_table(config, world)
        else:
            check_table_for_model(table, num_layers=config.model.num_layers,
                                  model_name=f"the config's model ({config.model.name})")
            table = with_engine_state(table, config.model, config.runtime.engine, world)  # M_C: this engine's state
        if args.lengths:
            lengths = list(load_lengths_csv(args.lengths).tokens)
        else:
            n = 2000 if args.synthetic is None else args.synthetic
            lengths = synthetic_lengths(n, table.max_len, config.planning.seed).tolist()
        for line in check_batch_settings(lengths, config):
            print(f"dcp plan: warning: {line}", file=sys.stderr)
        planner = EpochPlanner(lengths, table, config, world, args.epoch)
        plans = list(planner)
    except (ValueError, OSError) as exc:
        print(f"dcp plan: error: {exc}", file=sys.stderr)
        return 2
    shown = plans if args.steps < 0 else plans[: args.steps]
    rows = [step_row(p, config.model) for p in shown]
    summary = summarize(plans, world)
    budgets = planner.arrays.mbq.token_budget if planner.arrays is not None else {}
    summary.update(method=config.planning.method, world_size=world,
                   tokens_per_step_target=planner.input.config.planning.tokens_per_step,
                   token_pack_seq_groups=sorted(budgets))
    if rows:
        cols = list(rows[0])
        print("  ".join(f"{c:>12}" for c in cols))
        for r in rows:
            print("  ".join(f"{r[c]!s:>12}" for c in cols))
        print(LEGEND)
    print(batch_tokens(config, planner.lengths, world)[1])
    print(token_pack_line(config.planning.method, config.advanced.micro_batch_tokens, budgets, planner.shapes is not None))
    print("epoch: " + "  ".join(f"{k}={v}" for k, v in summary.items()))
    if args.json:
        print(json.dumps({"steps": rows, "summary": summary}))
    return 0


def _replace(section, **kw):
    import dataclasses

    return dataclasses.replace(section, **kw)
