"""``dcp bench padded``: predicted vs measured time of micro-batches of unequal lengths on CPU.

One process (one thread by default), the tiny Transformer-1D widened so layer work dominates Python
overhead. A profile table is measured at the seq_group bounds (``--edges``) for every micro-batch size
of ``--batch-sizes``, equal-length samples only, as the profiler does:

- ``--rows profiler`` (default): the dual-layer profiler's own measurement
  (``dcp.profiler.measure.measure_candidate``: t_f, t_b, T_C of two layers), so the error includes the
  dual-layer estimate;
- ``--rows steps``: whole-model steps (forward + backward), isolating the length model.

Then ``--cells`` micro-batches of unequal lengths are drawn (seq_group and size at random, lengths
uniform inside the seq_group's interval), collated with right padding and run as training runs them
(Transformer-1D packs unequal lengths into one row of documents; no padding is computed). Their measured
forward + backward time is compared with ``TimeLookup.lengths_time_s`` (real lengths), and, for
reference, with pricing every sample at the longest one (``padded_times_s``, what padding would cost).
Rows and cells are timed round-robin, ``--reps`` rounds in a shuffled order each, and medians compared,
so a slow phase of a shared machine hits both sides alike; ``--clock cpu`` (default) times process CPU
time, which other processes sharing the cores do not inflate.

Last, ``padded_efficiency``: the real tokens/s of a right-padded micro-batch of ``--efficiency-lens``
over that of an unpadded one with the same real tokens (the issue's GPU acceptance figure, here on CPU).

A table; with ``--json`` the last line is ``{"err_median_pct", "err_p90_pct", "padded_err_median_pct",
"padded_efficiency", "cells", ...}``; ``--csv PATH`` writes one tidy row per cell.
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
    common.add_profile_grid(parser, edges="128,256,512,1024", batch_sizes="1,2,4", sizes_note=" (cells draw 2..max)")
    parser.add_argument("--cells", type=int, default=24, help="micro-batches of unequal lengths to measure")
    common.add_rounds(parser)
    parser.add_argument("--rows", default="profiler", choices=("profiler", "steps"),
                        help="profiler: dual-layer rows; steps: whole-model steps at the bounds")
    common.add_cpu_model(parser)
    common.add_seed(parser, "the drawn micro-batches")
    parser.add_argument("--efficiency-lens", default="1024,700,400,200",
                        help="lengths of the padded micro-batch whose real tokens/s is compared with an unpadded one")
    parser.add_argument("--csv", default="", help="write one row per cell to this CSV (e.g. runs/bench_padded.csv)")


def _check(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    edges = int_list(args.edges, "--edges")
    eff_lens = int_list(args.efficiency_lens, "--efficiency-lens")
    sizes = sorted(set(int_list(args.batch_sizes, "--batch-sizes")))
    if edges != sorted(set(edges)):
        raise ValueError(f"--edges ({args.edges!r}) must be strictly increasing: e.g. 128,256,512")
    if max(sizes) < 2:
        raise ValueError(f"--batch-sizes ({args.batch_sizes!r}) must include a size >= 2: micro-batches of "
                         "unequal lengths need two samples")
    common.check_positive(args, "cells", "reps", "hidden_size", "num_layers", "threads")
    if args.num_layers < 2 and args.rows == "profiler":
        raise ValueError(f"--num-layers ({args.num_layers}) must be >= 2 with --rows profiler (dual-layer)")
    return edges, sizes, eff_lens


def padded_efficiency(model: Any, lens: list[int], ctx: Any, *, reps: int, clock: str = "cpu",
                      seed: int = 0) -> dict[str, float]:
    """Real tokens/s of a micro-batch of unequal ``lens`` (right-padded as collated) over that of an unpadded
    one of the same real tokens (equal lengths), forward + backward, alternating, medians. 1.0: padding
    costs nothing; the dense-mask path gave 0.36 on CPU for [1024, 700, 400, 200]."""
    import torch

    from dcp.data import collate_tokens

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    each = sum(lens) // len(lens)
    padded = collate_tokens([torch.randint(0, vocab, (n,), generator=gen) for n in lens])
    equal = collate_tokens([torch.randint(0, vocab, (each,), generator=gen) for _ in lens])
    common.step_s(model, padded, ctx, clock), common.step_s(model, equal, ctx, clock)
    t_pad, t_eq = [], []
    for _ in range(reps):
        t_pad.append(common.step_s(model, padded, ctx, clock))
        t_eq.append(common.step_s(model, equal, ctx, clock))
    tp, te = statistics.median(t_pad), statistics.median(t_eq)
    return {"padded_ms": 1e3 * tp, "unpadded_ms": 1e3 * te,
            "padded_efficiency": (sum(lens) / tp) / (each * len(lens) / te)}


def run(args: argparse.Namespace) -> int:
    edges, sizes, eff_lens = _check(args)  # before the heavy imports: a bad flag fails at once
    import numpy as np
    import torch
    from tqdm import tqdm

    from dcp.data import collate_tokens
    from dcp.models import build_model
    from dcp.planner.cost import micro_batch_time_s
    from dcp.planner.stream import TimeLookup
    from dcp.planner.table import ProfileRow, ProfileTable, TableMeta
    from dcp.profiler.adapters import get_adapter
    from dcp.profiler.measure import MeasureSettings, measure_candidate
    from dcp.runtime.context import SPContext

    torch.set_num_threads(args.threads)
    model = build_model("t1d-tiny", hidden_size=args.hidden_size, num_layers=args.num_layers)
    L, vocab = model.config.num_layers, model.config.vocab_size
    ctx = SPContext.single(attention="sdpa")
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    row_keys = [(g, e, b) for g, e in enumerate(edges) for b in sizes]
    row_batch = {k: model.synthetic_batch(k[2], k[1], generator=gen) for k in row_keys}
    cells = []
    for _ in range(args.cells):
        g = rng.randrange(len(edges))
        lo = edges[g - 1] + 1 if g else max(1, edges[0] // 4)
        c = rng.randint(2, max(sizes))
        lens = [rng.randint(lo, edges[g]) for _ in range(c)]
        cells.append((g, tuple(lens), collate_tokens([torch.randint(0, vocab, (n,), generator=gen) for n in lens])))
    adapter = get_adapter(model)
    settings = MeasureSettings(warmup_iters=0, measure_iters=1, clock=args.clock)

    def measure_row(k):
        if args.rows == "steps":
            return common.step_s(model, row_batch[k], ctx, args.clock)
        return measure_candidate(adapter, ctx, k[2], k[1], settings)

    def measure(item):
        kind, k = item
        return measure_row(k) if kind == "row" else common.step_s(model, cells[k][2], ctx, args.clock)

    items = [("row", k) for k in row_keys] + [("cell", i) for i in range(len(cells))]
    with tqdm(total=args.reps * len(items), desc="bench padded", unit="run") as bar:
        got = common.round_robin(items, measure, args.reps, rng, bar)

    rows = []
    for g, e, b in row_keys:
        vals = got[("row", (g, e, b))]
        if args.rows == "steps":
            t_f = t_b = 0.0
            t_c = statistics.median(vals)
        else:
            t_f, t_b, t_c = (statistics.median(getattr(m, f) for m in vals) for f in ("t_f_s", "t_b_s", "t_const_s"))
        rows.append(ProfileRow(g, e, b, 1, t_f, t_b, 0.0, 0.0, t_c, 0.0, L))
    table = ProfileTable(rows, TableMeta(model="t1d-bench", hardware="cpu", dtype="float32", world_size=1,
                                         seq_group_edges=tuple(edges)))
    times = TimeLookup(table)
    out = []
    for i, (g, lens, _) in enumerate(cells):
        meas = statistics.median(got[("cell", i)])
        pred = times.lengths_time_s(g, 1, 0, lens)
        padded = float(times.padded_times_s(g, 1, 0, len(lens), [max(lens)])[0])
        out.append({"seq_group": g, "lens": " ".join(map(str, lens)), "tokens": sum(lens),
                    "padded_tokens": len(lens) * max(lens), "meas_ms": 1e3 * meas, "pred_ms": 1e3 * pred,
                    "err_pct": 100 * (pred - meas) / meas, "padded_pred_ms": 1e3 * padded,
                    "padded_err_pct": 100 * (padded - meas) / meas})
    print(f"rows: {args.rows}; model t1d-tiny hidden {args.hidden_size} L {L}; edges {edges}; b {sizes}; "
          f"{args.reps} rounds, {args.threads} thread(s), {args.clock} clock")
    a, b1, b2 = times.length_model(len(edges) - 1, 1, 0)
    print(f"length model of the last seq_group: {1e3 * a:.3f} ms + {1e6 * b1:.3f} us/token + "
          f"{1e9 * b2:.4f} ns/token^2; row at the bound {1e3 * micro_batch_time_s(rows[-1], 0):.2f} ms (b {sizes[-1]})")
    print(f"{'grp':>3} {'lengths':<24} {'tokens':>6} {'padded':>6} {'meas ms':>8} {'pred ms':>8} {'err %':>6} "
          f"{'as padded ms':>12} {'err %':>6}")
    for r in out:
        print(f"{r['seq_group']:>3} {r['lens']:<24} {r['tokens']:>6} {r['padded_tokens']:>6} {r['meas_ms']:>8.2f} "
              f"{r['pred_ms']:>8.2f} {r['err_pct']:>6.1f} {r['padded_pred_ms']:>12.2f} {r['padded_err_pct']:>6.1f}")
    errs = np.abs([r["err_pct"] for r in out])
    padded_errs = np.abs([r["padded_err_pct"] for r in out])
    summary = {"err_median_pct": round(float(np.median(errs)), 2), "err_p90_pct": round(float(np.percentile(errs, 90)), 2),
               "err_max_pct": round(float(errs.max()), 2),
               "padded_err_median_pct": round(float(np.median(padded_errs)), 2), "cells": len(out),
               "rows": args.rows, "reps": args.reps, "clock": args.clock}
    print(f"|error| of the real-length price: median {summary['err_median_pct']}%, p90 {summary['err_p90_pct']}%, "
          f"max {summary['err_max_pct']}%; priced as padded to the longest: median {summary['padded_err_median_pct']}%")
    eff = padded_efficiency(model, eff_lens, ctx, reps=args.reps, clock=args.clock, seed=args.seed)
    summary["padded_efficiency"] = round(eff["padded_efficiency"], 3)
    print(f"padded efficiency: lengths {eff_lens} {eff['padded_ms']:.1f} ms vs {len(eff_lens)} x "
          f"{sum(eff_lens) // len(eff_lens)} unpadded {eff['unpadded_ms']:.1f} ms: real tokens/s ratio "
          f"{eff['padded_efficiency']:.3f}")
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(out[0]) if out else [])
            writer.writeheader()
            writer.writerows(out)
        print(f"wrote {args.csv}")
    if args.json:
        print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    return common.standalone_main("dcp bench padded", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
