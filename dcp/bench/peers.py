"""``dcp bench peers``: DCP against the strongest other schedulers on the simulator, dataset x method.

    dcp bench peers                      # 6 paper datasets + text, 32 simulated H200, 30k samples, seed 0
    dcp bench peers --datasets text --methods dcp-intra,megatron-dyncp --num-samples 5000 --json
    dcp bench peers --seeds 0,1,2,3 --json   # every dataset seed (the data and the planner's shuffle)

Every cell plans one epoch with the real planner (the peers: ``dcp.planner.peers``) and simulates it on the
analytic table of the dataset's paper model (t1d-5b for t1d-* and text, t2d-1.2b for t2d-*). Every method
trains the same global batch (``planning.tokens_per_step``): ``--tokens-per-step``, or the default every method
plans at (``dcp.planner.step_tokens.batch_tokens``; the target column); DCP methods with
``advanced.micro_batch_tokens = "auto"``. Columns: tokens/s, fraction of the ideal bound (one bound per dataset:
every sample at its best per-GPU efficiency, token packs included), GPU-weighted idle, optimizer steps, tokens per step
(min / median / max), the smallest and largest step as a share of the target, and the target; one row per
(dataset, seed, method). With --json the last line is ``{"rows": [{"dataset", "seed", "method", "tokens_per_s",
"ideal_fraction", "idle_ratio", "steps", "tokens_per_step_min", "tokens_per_step_median", "tokens_per_step_max",
"step_tokens_min_frac", "step_tokens_max_frac", "target_tokens_per_step"}]}``. ``--against FILE`` compares the
cells with an earlier --json output (``dcp.bench.peers_gate``: the planner's quality gate).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dcp.argtypes import nonneg_int, positive_int

DATASETS = ("t1d-short", "t1d-balanced", "t1d-long", "t2d-short", "t2d-balanced", "t2d-long", "text")
METHODS = ("bucket", "dcp-inter", "dcp-intra", "megatron-dyncp", "flexsp")
MODEL_OF = {"t1d": "t1d-5b", "t2d": "t2d-1.2b", "text": "t1d-5b"}
"""The paper model each dataset family trains."""


def _names(text: str, valid: tuple[str, ...], flag: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{flag} ({text!r}): {bad[0] if bad else 'empty'} is not one of "
                                         f"{list(valid)}; pass a comma-separated list of those")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dcp.config import METHODS as ALL
    from dcp.config import PEER_METHODS

    parser.add_argument("--datasets", type=lambda t: _names(t, _dataset_names(), "--datasets"),
                        default=DATASETS, help=f"comma-separated datasets (default: {','.join(DATASETS)})")
    parser.add_argument("--methods", type=lambda t: _names(t, ALL + PEER_METHODS, "--methods"), default=METHODS,
                        help=f"comma-separated methods (default: {','.join(METHODS)})")
    parser.add_argument("--num-samples", type=positive_int, default=30000, help="samples per dataset")
    parser.add_argument("--gpus", type=positive_int, default=32, help="simulated GPUs")
    parser.add_argument("--hardware", default="h200", choices=("h100", "h200"), help="simulated GPU")
    parser.add_argument("--seeds", "--seed", type=_seeds, default=(0,), dest="seeds",
                        help="comma-separated dataset seeds (each also the planner's shuffle seed), e.g. 0,1,2,3")
    parser.add_argument("--tokens-per-step", type=nonneg_int, default=0,
                        help="the global batch in tokens (0: the default batch, dcp.planner.step_tokens.batch_tokens)")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    parser.add_argument("--against", metavar="FILE",
                        help="an earlier --json output: exit 1 where a cell lost more than 1 point of its ideal "
                             "fraction or left the bounds it held (dcp.bench.peers_gate)")


def _seeds(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    try:
        return tuple(nonneg_int(p.strip()) for p in parts)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--seeds ({text!r}) must be integers >= 0 separated by commas: "
                                         "e.g. 0,1,2,3") from None


def _dataset_names() -> tuple[str, ...]:
    from dcp.data_dists import distribution_names

    return tuple(distribution_names())


def dataset_setup(ds: str, gpus: int, seed: int, *, num_samples: int = 30000, hardware: str = "h200",
                  tokens_per_step: float = 0.0) -> tuple:
    """(lengths, scenario, planning table, target tokens per step) of one dataset as the bench runs it: the
    dataset's paper model on ``hardware``, the target the default global batch unless given
    (``step_tokens.batch_tokens``)."""
    from dcp.data_dists import get_spec, load_lengths
    from dcp.planner.step_tokens import batch_tokens
    from dcp.sim.scenario import paper_config, paper_table, scenario

    lengths = load_lengths(ds, num_samples=num_samples, seed=seed)
    sc = scenario(MODEL_OF[get_spec(ds).grid], hardware)
    table = paper_table(sc, gpus, shapes=lengths.shapes)
    cfg = paper_config(sc, "bucket", seed=seed)
    cfg = cfg.replace(planning=dataclasses.replace(cfg.planning, tokens_per_step=round(tokens_per_step)))
    target = float(batch_tokens(cfg, lengths.tokens, gpus)[0])
    return lengths, sc, table, target


def method_config(sc, method: str, seed: int, tokens_per_step: float, gpus: int = 0):
    """The DCPConfig of ``method`` at the bench's global batch; ``gpus`` > 0 tells DCP the gradient sync the
    simulator prices on that many GPUs (advanced.grad_sync_s, ``paper_config``)."""
    from dcp.sim.scenario import DCP_METHODS, paper_config

    cfg = paper_config(sc, method, seed=seed, world_size=gpus)
    # DCP sizes short documents' micro-batches by tokens where that is cheaper (advanced.micro_batch_tokens; a
    # no-op on the t1d/t2d sets, +15% DCP-intra tokens/s on text); the peers pack by tokens anyway
    planning = dataclasses.replace(cfg.planning, tokens_per_step=round(tokens_per_step))
    advanced = dataclasses.replace(cfg.advanced, micro_batch_tokens="auto"
                                   if method in DCP_METHODS else cfg.advanced.micro_batch_tokens)
    return cfg.replace(planning=planning, advanced=advanced)


def cell(lengths, table, sc, method: str, gpus: int, seed: int, tokens_per_step: float) -> dict:
    """One (dataset, method) row's figures."""
    import numpy as np

    from dcp.sim.cluster import ideal_tokens_per_s, simulate

    cfg = method_config(sc, method, seed, tokens_per_step, gpus)
    res, steps = simulate(lengths.tokens, table, cfg, gpus, hardware=sc.hardware, shapes=lengths.shapes,
                          return_steps=True)
    # one bound for every method of a dataset: each sample at its best per-GPU efficiency, token packs included
    ideal = ideal_tokens_per_s(lengths.tokens, table, cfg.replace(advanced=dataclasses.replace(
        cfg.advanced, micro_batch_tokens="auto")), gpus, two_d=lengths.shapes is not None)
    tok = np.asarray([s.tokens for s in steps], dtype=np.int64)
    return {"method": method, "tokens_per_s": res.tokens_per_s, "ideal_fraction": res.tokens_per_s / ideal,
            "idle_ratio": res.idle_ratio, "steps": res.num_steps, "tokens_per_step_min": int(tok.min()),
            "tokens_per_step_median": float(np.median(tok)), "tokens_per_step_max": int(tok.max()),
            "mem_violations": res.mem_violations}


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from dcp.bench.peers_gate import GateFileError, compare, load_rows
    from dcp.config import PlanningConfig

    try:  # (read before the minutes of planning: a bad file fails at once)
        before = load_rows(args.against) if args.against else None
    except GateFileError as exc:
        print(f"dcp bench peers: error: {exc}", file=sys.stderr)
        return 2
    rows = []
    cells = len(args.datasets) * len(args.seeds) * len(args.methods)
    with tqdm(total=cells, desc="bench peers", unit="cell", file=sys.stderr, dynamic_ncols=True) as bar:
        for ds in args.datasets:
            for seed in args.seeds:
                lengths, sc, table, target = dataset_setup(ds, args.gpus, seed, num_samples=args.num_samples,
                                                           hardware=args.hardware,
                                                           tokens_per_step=args.tokens_per_step)
                for m in args.methods:
                    bar.set_postfix_str(f"{ds} seed {seed} {m}")
                    row = {"dataset": ds, "seed": seed, **cell(lengths, table, sc, m, args.gpus, seed, target),
                           "target_tokens_per_step": target}
                    row["step_tokens_min_frac"] = row["tokens_per_step_min"] / target
                    row["step_tokens_max_frac"] = row["tokens_per_step_max"] / target
                    rows.append(row)
                    bar.update(1)
    print(f"# {args.num_samples} samples per dataset, {args.gpus} x {args.hardware.upper()} (simulated), seeds "
          f"{','.join(map(str, args.seeds))}; every method at the target tokens per step (the default batch unless "
          "--tokens-per-step); min/max x: the smallest and largest step over the target")
    print(f"{'dataset':<13} {'seed':>4} {'method':<15} {'tokens/s':>10} {'ideal':>6} {'idle':>6} {'steps':>6} "
          f"{'tok/step min':>12} {'median':>10} {'max':>10} {'target':>10} {'min x':>6} {'max x':>6}")
    for r in rows:
        print(f"{r['dataset']:<13} {r['seed']:>4} {r['method']:<15} {r['tokens_per_s']:>10.0f} "
              f"{r['ideal_fraction']:>6.3f} {r['idle_ratio']:>6.3f} {r['steps']:>6} {r['tokens_per_step_min']:>12,} "
              f"{r['tokens_per_step_median']:>10,.0f} {r['tokens_per_step_max']:>10,} "
              f"{r['target_tokens_per_step']:>10,.0f} {r['step_tokens_min_frac']:>6.3f} "
              f"{r['step_tokens_max_frac']:>6.3f}")
    bad = [r for r in rows if r["mem_violations"]]
    for r in bad:
        print(f"# warning: {r['dataset']} {r['method']}: {r['mem_violations']} steps exceed the memory capacity")
    fails = []
    if before is not None:  # (before the JSON line, which stays the last)
        report, fails = compare(rows, before, args.against, PlanningConfig().step_tokens_bounds)
        print("\n".join(report + [f"# gate: {f}" for f in fails] + (["# gate: passed"] if not fails else [])))
    if args.json:
        keys = ("dataset", "seed", "method", "tokens_per_s", "ideal_fraction", "idle_ratio", "steps",
                "tokens_per_step_min", "tokens_per_step_median", "tokens_per_step_max", "step_tokens_min_frac",
                "step_tokens_max_frac", "target_tokens_per_step")
        print(json.dumps({"rows": [{k: r[k] for k in keys} for r in rows]}))
    return 1 if fails else 0


__all__ = ["DATASETS", "METHODS", "add_arguments", "cell", "run"]
