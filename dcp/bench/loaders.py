"""``dcp bench loaders``: padding waste and token balance of each loader against fixed-size batching.

For every length distribution (the paper's short / balanced / long-dominated 1D sets from
``dcp.data_dists`` at CPU scale) and every loader, it plans the whole epoch for ``--world-size`` ranks and
reports, over the steps where every rank has work:

* ``waste_pct``: padding tokens / computed tokens (dummy warm-up micro-batches count as waste);
* ``work_bal``: mean over steps of max/mean *computed* tokens per rank (what sets the step time);
* ``real_bal``: the same for real (non-padding) tokens;
* ``fill_pct``: real tokens per rank-step / the token budget;
* ``steps``, ``samples_per_step``: how many optimizer steps the epoch takes and how big they are.

The fixed-size baseline uses the largest batch size whose worst case fits the budget
(``budget // longest sample``), as a fixed shape must. Pure Python: no torch.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence

from dcp.argtypes import positive_int, sample_count, world_size
from dcp.bench import common

DISTRIBUTIONS = ("t1d-short", "t1d-balanced", "t1d-long")
LOADERS = ("fixed", "balanced-closest", "balanced-first", "balanced-packed", "varbatch", "curriculum-varbatch",
           "curriculum-same-shape", "static-shapes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=world_size, default=4, help="data-parallel ranks (default 4)")
    parser.add_argument("--num-samples", type=sample_count, default=8000, help="samples per distribution (default 8000)")
    parser.add_argument("--max-tokens", type=positive_int, default=8192, help="token budget of a micro-batch, at least the longest sample (default 8192)")
    parser.add_argument("--pool-size", type=positive_int, default=64, help="load-balanced pool size (default 64)")
    parser.add_argument("--max-shapes", type=positive_int, default=8, help="static-shapes bucket count (default 8)")
    common.add_seed(parser, "the lengths and the shuffles")
    parser.add_argument("--distributions", nargs="+", default=list(DISTRIBUTIONS), help="distribution names")
    parser.add_argument("--loaders", nargs="+", default=list(LOADERS), choices=LOADERS, help="loaders to measure")
    common.add_json(parser, help="print a JSON object with every row as the last line")


def load_lengths(name: str, num_samples: int, seed: int) -> tuple[list[int], str]:
    """Lengths of a named distribution from ``dcp.data_dists`` at CPU scale, and where they came from."""
    from dcp.data_dists import load_distribution

    return load_distribution(name, scale="cpu", num_samples=num_samples, seed=seed), "dcp.data_dists(cpu)"


def _summarise(per_step: list[list[tuple[int, int, int]]], budget: int) -> dict:
    """per_step[k][r] = (real tokens, computed tokens, samples) of rank r at step k."""
    import numpy as np

    a = np.asarray(per_step, dtype=float)  # [step, rank, 3]
    real, work = a[:, :, 0], a[:, :, 1]
    busy = work.min(axis=1) > 0  # balance is measured where every rank has work
    return {
        "waste_pct": round(100.0 * (1.0 - real.sum() / work.sum()), 2),
        "work_bal": round(float(np.mean(work[busy].max(axis=1) / work[busy].mean(axis=1))), 3),
        "real_bal": round(float(np.mean(real[busy].max(axis=1) / np.maximum(real[busy].mean(axis=1), 1))), 3),
        "fill_pct": round(100.0 * float(real.sum() / (a.shape[0] * a.shape[1] * budget)), 1),
        "steps": int(a.shape[0]),
        "samples_per_step": round(float(a[:, :, 2].sum(axis=1).mean()), 1),
    }


def _cell(batches: Sequence) -> tuple[int, int, int]:
    return (sum(b.tokens for b in batches), sum(b.padded_tokens for b in batches), sum(b.size for b in batches))


def _fixed(lengths: list[int], args: argparse.Namespace) -> list[list[tuple[int, int, int]]]:
    from dcp.loaders._common import epoch_permutation

    w = args.world_size
    size = max(1, args.max_tokens // max(lengths))
    shards = [epoch_permutation(len(lengths), args.seed, 0)[r::w].tolist() for r in range(w)]
    steps = []
    for s in range(0, min(len(x) for x in shards), size):
        row = []
        for shard in shards:
            part = [lengths[i] for i in shard[s : s + size]]
            row.append((sum(part), len(part) * max(part), len(part)))
        steps.append(row)
    return steps


def _balanced(strategy: str, packing: bool) -> Callable:
    def build(lengths: list[int], args: argparse.Namespace) -> list[list[tuple[int, int, int]]]:
        from dcp.loaders.balanced import LoadBalancedConfig, lockstep_steps

        cfg = LoadBalancedConfig(load_balanced_pool_size=args.pool_size, load_balanced_max_tokens_for_batch=args.max_tokens,
                                 load_balanced_batching_strategy=strategy, sequence_packing=packing,
                                 infinite_loop=False, dataloader_seed=args.seed, oversized_samples="alone")
        return [[_cell(rank_step) for rank_step in step] for step in lockstep_steps(lengths, cfg, args.world_size)]

    return build


def _varbatch(order_kind: str, same_shape: bool) -> Callable:
    def build(lengths: list[int], args: argparse.Namespace) -> list[list[tuple[int, int, int]]]:
        from dcp.loaders.varbatch import VariableBatchConfig, plan_variable_batches, shuffled_order

        if order_kind == "curriculum":
            order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))  # == the distributed sort's order
        else:
            order = shuffled_order(len(lengths), args.seed, 0)
        cfg = VariableBatchConfig(max_tokens_per_batch=args.max_tokens, same_shape_micro_batches=same_shape)
        steps = plan_variable_batches(order, lengths, cfg, args.world_size)
        return [[_cell(s.for_rank(r)) for r in range(args.world_size)] for s in steps]

    return build


def _static(lengths: list[int], args: argparse.Namespace) -> list[list[tuple[int, int, int]]]:
    from dcp.loaders.static_shapes import StaticShapeConfig, plan_static_shapes

    cfg = StaticShapeConfig(max_shapes=args.max_shapes, max_tokens_per_batch=args.max_tokens, seed=args.seed)
    plan = plan_static_shapes(lengths, cfg, args.world_size)
    return [[_cell([b]) for b in step] for step in plan.steps]


BUILDERS: dict[str, Callable] = {
    "fixed": _fixed,
    "balanced-closest": _balanced("prefer_closest", False),
    "balanced-first": _balanced("prefer_first", False),
    "balanced-packed": _balanced("prefer_closest", True),
    "varbatch": _varbatch("shuffled", False),
    "curriculum-varbatch": _varbatch("curriculum", False),
    "curriculum-same-shape": _varbatch("curriculum", True),
    "static-shapes": _static,
}

COLUMNS = ("distribution", "loader", "waste_pct", "work_bal", "real_bal", "fill_pct", "steps", "samples_per_step",
           "plan_ms")


def _check_budget(args: argparse.Namespace, data: dict[str, tuple[list[int], str]]) -> None:
    """Every loader needs a micro-batch to hold any one sample: below the longest sample, varbatch and
    static-shapes refuse it mid-run and fixed and balanced run it alone over the budget (fill_pct in the thousands
    of percent), so the loaders would not be compared at one budget. One line naming the flag, before any row."""
    name, longest = max(((d, max(lengths)) for d, (lengths, _) in data.items()), key=lambda x: x[1])
    need = longest
    if "static-shapes" in args.loaders:  # its shapes are padded to a multiple of its pad_to_multiple_of
        from dcp.loaders.static_shapes import StaticShapeConfig

        k = StaticShapeConfig().pad_to_multiple_of
        need = -(-longest // k) * k
    if args.max_tokens < need:
        where = f"({longest} tokens, in {name} with --num-samples {args.num_samples} --seed {args.seed})"
        rule = (f"is below the longest sample {where}" if args.max_tokens < longest else  # else only its padding
                f"is below {need} tokens, the longest sample {where} padded to static-shapes' multiple of {k}")
        raise ValueError(f"--max-tokens ({args.max_tokens}) {rule}: a micro-batch must hold any one sample: pass "
                         f"--max-tokens >= {need}")


def run(args: argparse.Namespace) -> int:
    if args.num_samples < args.world_size:  # each flag alone is checked >= 1 as it is parsed
        raise ValueError(f"--num-samples ({args.num_samples}) < --world-size ({args.world_size}): every rank needs "
                         f"samples: pass --num-samples >= {args.world_size}")
    data = {d: load_lengths(d, args.num_samples, args.seed) for d in args.distributions}
    _check_budget(args, data)
    rows, sources = [], {}
    print(f"# world_size={args.world_size} max_tokens={args.max_tokens} num_samples={args.num_samples} "
          f"pool={args.pool_size} max_shapes={args.max_shapes} seed={args.seed}")
    print(" ".join(f"{c:>20}" if i < 2 else f"{c:>16}" for i, c in enumerate(COLUMNS)))
    from tqdm.auto import tqdm

    bar = tqdm(total=len(args.distributions) * len(args.loaders), desc="bench loaders", unit="row", dynamic_ncols=True)
    for dist_name in args.distributions:
        lengths, source = data[dist_name]
        sources[dist_name] = source
        for loader in args.loaders:
            bar.set_postfix_str(f"{dist_name} {loader}")
            t0 = time.perf_counter()
            per_step = BUILDERS[loader](lengths, args)
            row = {"distribution": dist_name, "loader": loader, **_summarise(per_step, args.max_tokens),
                   "plan_ms": round(1e3 * (time.perf_counter() - t0), 1)}
            rows.append(row)
            bar.write(" ".join(f"{row[c]!s:>20}" if i < 2 else f"{row[c]!s:>16}" for i, c in enumerate(COLUMNS)))
            bar.update()
    bar.close()
    if args.json:
        print(json.dumps({"bench": "loaders", "world_size": args.world_size, "max_tokens": args.max_tokens,
                          "num_samples": args.num_samples, "sources": sources, "rows": rows}))
    return 0
