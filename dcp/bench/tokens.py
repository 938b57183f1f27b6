"""``dcp bench tokens``: micro-batches sized in tokens vs in samples, measured and predicted, on CPU.

One process, the tiny Transformer-1D widened so layer work dominates Python overhead (as ``dcp bench padded``).
A profile table is measured at the seq_group bounds (``--edges``) for every micro-batch size of
``--batch-sizes``: whole-model forward + backward steps of equal-length samples. Then ``--docs`` short documents
of the first seq_group are drawn (lognormal, mean ``--mean-tokens``, clipped to the bound: text far below its
bound) and split in FIFO order two ways, as the planner does (``advanced.micro_batch_tokens``):

- ``samples``: b documents per micro-batch, b of the row with the best tokens per second at the bound (Eq. 1);
- ``tokens``: greedy packs within the token budget b' x bound of the row the planner picks for these documents
  (``dcp.planner.tokens.best_token_pack``), each run as one row of documents.

Both are timed round-robin (``--reps`` rounds, shuffled, medians; ``--clock cpu`` by default, robust on a shared
machine) and priced by the planner (``TimeLookup.lengths_times_s`` from the real lengths, anchored at the row).
The table gives per arm: micro-batches, measured and predicted seconds for all the documents, tokens per second,
and the measured and predicted speedup of the token packs. ``--json``: the last line holds the same figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from typing import Any

from dcp.argtypes import int_list
from dcp.bench import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_json(parser)
    common.add_profile_grid(parser, edges="512,2048", batch_sizes="1,2,4,8")
    parser.add_argument("--docs", type=int, default=160, help="documents of the first seq_group to run")
    parser.add_argument("--mean-tokens", type=int, default=120, help="mean document length (lognormal, sigma 1)")
    common.add_rounds(parser)
    common.add_cpu_model(parser)
    common.add_seed(parser, "the documents")


def _check(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    edges = int_list(args.edges, "--edges")
    sizes = sorted(set(int_list(args.batch_sizes, "--batch-sizes")))
    if edges != sorted(set(edges)) or edges[0] < 2:
        raise ValueError(f"--edges ({args.edges!r}) must be strictly increasing and >= 2: e.g. 512,2048")
    if sizes[0] < 1:
        raise ValueError(f"--batch-sizes ({args.batch_sizes!r}) must be >= 1: e.g. 1,2,4,8")
    common.check_positive(args, "docs", "mean_tokens", "reps", "hidden_size", "num_layers", "threads")
    return edges, sizes


def _documents(args: argparse.Namespace, bound: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(args.seed)
    x = np.exp(rng.normal(np.log(args.mean_tokens) - 0.5, 1.0, args.docs))
    return np.clip(np.rint(x), 1, bound).astype(int).tolist()


def _table(model: Any, edges: list[int], sizes: list[int], measured: dict) -> Any:
    from dcp.planner.table import ProfileRow, ProfileTable, TableMeta

    rows = [ProfileRow(g, e, b, 1, 0.0, 0.0, 0.0, 0.0, statistics.median(measured[(g, e, b)]), 0.0,
                       model.config.num_layers) for g, e in enumerate(edges) for b in sizes]
    return ProfileTable(rows, TableMeta(model="t1d-bench", hardware="cpu", dtype="float32", world_size=1,
                                        seq_group_edges=tuple(edges)))


def _arms(table: Any, lens: list[int]) -> dict[str, tuple[Any, list[tuple[int, int]]]]:
    """Per arm, (the setting it runs with, its micro-batches as (start, end) into ``lens``)."""
    import numpy as np

    from dcp.planner.intra import best_settings, candidate_settings
    from dcp.planner.stream import TimeLookup
    from dcp.planner.tokens import best_token_pack, token_runs

    kw = dict(mem_capacity_bytes=float("inf"), sp_sizes=(1,), world_size=1, ranks_per_node=1, dynamic_recompute=True)
    primary = best_settings(table, **kw)[0]
    arr = np.asarray(lens, dtype=np.int64)
    pick, _ = best_token_pack(TimeLookup(table), primary, candidate_settings(table, **kw)[0], arr)
    pack = pick or primary  # the planner would keep samples: the token arm then shows the same budget's packs
    starts = token_runs(arr, pack.micro_batch_size * pack.seq_len).tolist()
    cuts = list(range(0, len(lens), primary.micro_batch_size))
    as_runs = lambda st: list(zip(st, [*st[1:], len(lens)], strict=True))  # noqa: E731
    return {"samples": (primary, as_runs(cuts)), "tokens": (pack, as_runs(starts))}


def run(args: argparse.Namespace) -> int:
    edges, sizes = _check(args)  # before the heavy imports: a bad flag fails at once
    import torch

    from dcp.models import build_model, collate_tokens
    from dcp.planner.stream import TimeLookup
    from dcp.runtime.context import SPContext

    torch.set_num_threads(args.threads)
    model = build_model("t1d-tiny", hidden_size=args.hidden_size, num_layers=args.num_layers)
    ctx = SPContext.single(attention="sdpa")
    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    rows = {(g, e, b): model.synthetic_batch(b, e, generator=gen) for g, e in enumerate(edges) for b in sizes}
    lens = _documents(args, edges[0])
    docs = [torch.randint(0, vocab, (n,), generator=gen) for n in lens]
    rng = random.Random(args.seed)
    measured = common.round_robin(list(rows), lambda k: common.step_s(model, rows[k], ctx, args.clock), args.reps, rng)
    table = _table(model, edges, sizes, measured)
    arms = _arms(table, lens)
    batches = {(arm, i): collate_tokens(docs[a:e]) for arm, (_, runs) in arms.items() for i, (a, e) in enumerate(runs)}
    got = common.round_robin(list(batches), lambda k: common.step_s(model, batches[k], ctx, args.clock), args.reps,
                             rng)
    times, out = TimeLookup(table), {}
    for arm, (s, runs) in arms.items():
        meas = sum(statistics.median(got[(arm, i)]) for i in range(len(runs)))
        # as the planner prices them: b-sample runs at their count's row, token packs at the budget's row
        pred = sum(times.lengths_time_s(0, 1, 0, lens[a:e]) if arm == "samples" else
                   float(times.lengths_times_s(0, 1, 0, s.micro_batch_size, [sum(lens[a:e])],
                                               [sum(n * n for n in lens[a:e])])[0]) for a, e in runs)
        out[arm] = {"micro_batches": len(runs), "budget_tokens": s.micro_batch_size * s.seq_len,
                    "meas_s": meas, "pred_s": pred, "meas_tokens_per_s": sum(lens) / meas,
                    "pred_tokens_per_s": sum(lens) / pred, "pred_err_pct": 100 * (pred - meas) / meas}
    summary = {"docs": len(lens), "tokens": sum(lens), "bound": edges[0], "clock": args.clock, "reps": args.reps,
               "arms": out, "meas_speedup": out["samples"]["meas_s"] / out["tokens"]["meas_s"],
               "pred_speedup": out["samples"]["pred_s"] / out["tokens"]["pred_s"]}
    print(f"t1d-tiny hidden {args.hidden_size} L {args.num_layers}; {len(lens)} documents, {sum(lens)} tokens "
          f"(mean {sum(lens) / len(lens):.0f}, bound {edges[0]}); {args.reps} rounds, {args.clock} clock")
    print(f"{'arm':<8} {'budget':>7} {'mbs':>5} {'meas s':>8} {'pred s':>8} {'err %':>6} {'meas tok/s':>11} "
          f"{'pred tok/s':>11}")
    for arm, r in out.items():
        print(f"{arm:<8} {r['budget_tokens']:>7} {r['micro_batches']:>5} {r['meas_s']:>8.3f} {r['pred_s']:>8.3f} "
              f"{r['pred_err_pct']:>6.1f} {r['meas_tokens_per_s']:>11.0f} {r['pred_tokens_per_s']:>11.0f}")
    print(f"token packs vs sample-count micro-batches: measured {summary['meas_speedup']:.2f}x, "
          f"predicted {summary['pred_speedup']:.2f}x")
    if args.json:
        print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.standalone_main("dcp bench tokens", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
