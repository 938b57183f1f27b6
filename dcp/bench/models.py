"""Forward+backward time of a reference model per (sequence length, SP size) on gloo CPU processes.

    dcp bench models --model t1d-tiny --seq-lens 256,1024,4096 --sp-sizes 1,2 [--json]
    python -m dcp.bench.models ...        (the same)

One row per measurement: median step time over ``--iters`` (after one warm-up), tokens per second per
rank (the paper's per-GPU throughput, b * s / (p * T)), and the largest difference of the summed loss
from the one-process value (0 up to float rounding: SP must not change the result).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from dcp.argtypes import int_list, positive_int
from dcp.named_models import MODEL_NAMES


def _measure(rank: int, world_size: int, model_name: str, seq_len: int, batch_size: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    from dcp.models import build_model
    from dcp.runtime.context import SPContext

    model = build_model(model_name)
    batch = model.synthetic_batch(batch_size, seq_len, generator=torch.Generator().manual_seed(0))
    group = dist.group.WORLD if world_size > 1 else None
    ctx = SPContext(group=group, sp_size=world_size, sp_rank=rank, attention="sdpa")
    times, loss_total = [], 0.0
    for i in range(iters + 1):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        loss, count = model(batch, ctx)
        loss.backward()
        dist.barrier()
        if i:
            times.append(time.perf_counter() - start)
        loss_total = loss.detach().clone()
    if group is not None:
        dist.all_reduce(loss_total, group=group)
    return {"step_s": statistics.median(times), "loss_sum": float(loss_total), "tokens": batch.tokens}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="t1d-tiny", choices=MODEL_NAMES, help="a named reference model")
    parser.add_argument("--seq-lens", default="256,1024,4096", help="comma-separated token counts")
    parser.add_argument("--sp-sizes", default="1,2", help="comma-separated SP sizes (one process per rank)")
    parser.add_argument("--batch-size", type=positive_int, default=1, help="samples per micro-batch")
    parser.add_argument("--iters", type=positive_int, default=3, help="timed iterations after one warm-up")
    parser.add_argument("--json", action="store_true", help="last line: a JSON object with every row")


def run(args: argparse.Namespace) -> int:
    seq_lens = int_list(args.seq_lens, "--seq-lens")  # before any process starts: a bad flag fails at once
    sp_sizes = int_list(args.sp_sizes, "--sp-sizes")
    from dcp.distributed.launch import run_distributed

    rows = []
    for seq_len in seq_lens:
        base = None
        for p in sp_sizes:
            out = run_distributed(_measure, p, args.model, seq_len, args.batch_size, args.iters)[0]
            base = out["loss_sum"] if base is None else base
            row = {
                "model": args.model, "seq_len": seq_len, "batch_size": args.batch_size, "sp_size": p,
                "step_s": round(out["step_s"], 4),
                "tokens_per_s_per_rank": round(out["tokens"] / (p * out["step_s"]), 1),
                "loss_rel_diff": abs(out["loss_sum"] - base) / abs(base),
            }
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcp bench models", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
