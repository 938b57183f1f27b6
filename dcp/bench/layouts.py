"""One attention (forward + backward) under each layout of SP size 2 on gloo CPU processes, against the
analytic CPU model's prediction, and the bytes each layout hands to its collectives against the model's count.

    dcp bench layouts [--seq-len 2048 --heads 8 --kv-heads 2 --head-dim 32 --iters 8] [--json]

Layouts: ``2x1`` (Ulysses over both ranks, K/V sent unexpanded) and ``1x2`` (context parallelism: balanced
chunks, K/V all-gathered). One row per layout: median time, the prediction (``analytic.attention_time_s``
plus twice ``layout.layout_comm_s``, CPU_SMALL), both relative to ``2x1``, and the forward bytes sent
(all-to-all and all-gather inputs) next to ``layout.ulysses_bytes`` / ``context_bytes``. A last row times
moving one rank's K/V block as one all-gather against a ring's P2P steps (why the runtime gathers:
dcp.runtime.context_parallel).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from dcp.argtypes import positive_int

LAYOUTS = ((2, 1), (1, 2))


def _measure(rank: int, world_size: int, seq_len: int, heads: int, kv_heads: int, head_dim: int,
             iters: int) -> dict:
    import torch
    import torch.distributed as dist

    from dcp.runtime.context import SPContext
    from dcp.runtime.context_parallel import take_shard
    from dcp.runtime.ulysses import ulysses_attention

    torch.set_num_threads(1)  # one core per rank, as the CPU model assumes
    world = dist.group.WORLD
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, seq_len, heads, head_dim, generator=gen)
    k, v = (torch.randn(1, seq_len, kv_heads, head_dim, generator=gen) for _ in range(2))
    gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    out = {}
    for u, c in LAYOUTS:
        extra = dict(context_size=c, context_group=world) if c > 1 else {}
        ctx = SPContext(group=world, sp_size=2, sp_rank=rank, attention="sdpa", **extra)
        shard = [take_shard(t, ctx.shard_ranges(seq_len)).clone().requires_grad_() for t in (q, k, v)]
        sent = {"a2a": 0, "gather": 0}
        inner_a2a, inner_gather = dist.all_to_all_single, getattr(dist, gather)

        def a2a(o, i, *args, _f=inner_a2a, sent=sent, **kw):
            sent["a2a"] += i.numel() * i.element_size()
            return _f(o, i, *args, **kw)

        def gat(o, i, *args, _f=inner_gather, sent=sent, **kw):
            sent["gather"] += i.numel() * i.element_size()
            return _f(o, i, *args, **kw)

        dist.all_to_all_single = a2a
        setattr(dist, gather, gat)
        try:
            ulysses_attention(*shard, ctx, causal=True, doc_lens=((seq_len,),))  # forward bytes only
        finally:
            dist.all_to_all_single = inner_a2a
            setattr(dist, gather, inner_gather)
        times = []
        for i in range(iters + 1):
            dist.barrier()
            start = time.perf_counter()
            ulysses_attention(*shard, ctx, causal=True, doc_lens=((seq_len,),)).sum().backward()
            if i:
                times.append(time.perf_counter() - start)
        out[f"{u}x{c}"] = {"time_s": statistics.median(times), **sent}
    out["transfer"] = _transfer(k, v, rank, world_size, iters)
    return out


def _transfer(k, v, rank: int, world_size: int, iters: int) -> dict:
    """Seconds to move this rank's K/V block to the other ranks: one all-gather, or a ring's world_size - 1
    P2P steps (``batch_isend_irecv``), the alternative context attention (dcp.runtime.context_parallel)."""
    import torch
    import torch.distributed as dist

    kv = torch.stack((k, v)).chunk(world_size, dim=2)[rank].contiguous()
    out, recv = kv.new_empty((world_size * kv.shape[0], *kv.shape[1:])), torch.empty_like(kv)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def ring() -> None:
        for _ in range(world_size - 1):
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % world_size),
                   dist.P2POp(dist.irecv, recv, (rank - 1) % world_size)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

    times: dict[str, list[float]] = {"all_gather": [], "ring": []}
    for i in range(iters + 1):
        for name, fn in (("all_gather", lambda: gather(out, kv)), ("ring", ring)):
            dist.barrier()
            start = time.perf_counter()
            fn()
            if i:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-len", type=positive_int, default=2048, help="tokens of the one sequence")
    parser.add_argument("--heads", type=positive_int, default=8, help="query heads")
    parser.add_argument("--kv-heads", type=positive_int, default=2, help="K/V heads (divide --heads; 2 divides them)")
    parser.add_argument("--head-dim", type=positive_int, default=32, help="head dimension")
    parser.add_argument("--iters", type=positive_int, default=8, help="timed iterations after one warm-up")
    parser.add_argument("--json", action="store_true", help="last line: a JSON object with every row")


def run(args: argparse.Namespace) -> int:
    from dcp.config import ModelShapeConfig
    from dcp.distributed.launch import run_distributed
    from dcp.planner.analytic import CPU_SMALL, attention_time_s
    from dcp.planner.layout import context_bytes, layout_comm_s, ulysses_bytes

    if args.heads % args.kv_heads or args.kv_heads % 2 or args.seq_len % 4:
        print(f"dcp bench layouts: error: --kv-heads ({args.kv_heads}) must be even and divide --heads ({args.heads}), "
              f"and --seq-len ({args.seq_len}) a multiple of 4: both layouts of 2 ranks need them", flush=True)
        return 2
    model = ModelShapeConfig(num_heads=args.heads, num_kv_heads=args.kv_heads, hidden_size=args.heads * args.head_dim)
    measured = run_distributed(_measure, 2, args.seq_len, args.heads, args.kv_heads, args.head_dim, args.iters)[0]
    att_f, att_b = attention_time_s(model, args.seq_len, 1, 2, CPU_SMALL)
    rows = []
    for u, c in LAYOUTS:
        name = f"{u}x{c}"
        comm = layout_comm_s(model, 1, args.seq_len, 2, CPU_SMALL, dtype_bytes=4, layout=(u, c))
        qkv, o = ulysses_bytes(args.seq_len // 2, args.heads, args.kv_heads, args.head_dim, u, 4)
        want = {"a2a": qkv + o, "gather": context_bytes(args.seq_len // c, args.heads, args.kv_heads,
                                                        args.head_dim, u, c, 4)}
        rows.append({"layout": name, "measured_s": measured[name]["time_s"], "predicted_s": att_f + att_b + 2 * comm,
                     "a2a_bytes": measured[name]["a2a"], "a2a_bytes_model": want["a2a"],
                     "gather_bytes": measured[name]["gather"], "gather_bytes_model": want["gather"]})
    base = rows[0]
    for row in rows:
        row["measured_vs_2x1"] = row["measured_s"] / base["measured_s"]
        row["predicted_vs_2x1"] = row["predicted_s"] / base["predicted_s"]
        print(" ".join(f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in row.items()), flush=True)
    transfer = measured["transfer"]
    print(f"kv_transfer all_gather_s={transfer['all_gather']:.5f} ring_s={transfer['ring']:.5f}", flush=True)
    if args.json:
        print(json.dumps({"rows": rows, "kv_transfer_s": transfer}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcp bench layouts", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
