"""Where the training thread's CPU goes per micro-batch: the paper's loop of one rank of a W-rank job (the
setup of ``dcp bench scale``: fake process group, paper-scale plans, the tiny model), each call timed with
``time.thread_time_ns``; medians over the micro-batches of steps 2.. .

    PYTHONPATH=$PWD python scripts/host_segments.py --world-size 4096 --rank 2048 --steps 10 [--mb-ms 50]

Segments: ``next`` (the data iterator: the step loop, the prefetch hand-over, the phase board), ``optdyn``
(``optimize_dynamics``), ``profile_enter`` / ``exit`` (``mgr.profile``), ``call-fwd`` (``engine(batch)`` minus
the model's forward), and ``host``, their sum; ``fwd``, ``backward`` and ``step`` are the model's and the
engine's (``backward`` and ``step`` include the runtime's loss weight and boundary checks). The clocks cost
~0.5 us each warm, inside the segments. Run it from the tree to measure (another tree: its PYTHONPATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import time
from collections import defaultdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mb-ms", type=float, default=0.0, help="sleep per micro-batch at the forward's end")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dcp import set_manager
    from dcp.bench.census import Census
    from dcp.bench.scale import _tiny_model, _TokenDataset, _without_count
    from dcp.data_dists import load_lengths
    from dcp.sim.scenario import paper_config, paper_table, scenario

    torch.set_num_threads(1)
    logging.getLogger("dcp").setLevel(logging.WARNING)
    dist.init_process_group("fake", store=FakeStore(), rank=args.rank, world_size=args.world_size)
    sc = scenario("t1d-5b", "h200")
    config, table = paper_config(sc, "dcp-intra"), paper_table(sc, args.world_size)
    config = config.replace(runtime=dataclasses.replace(config.runtime, prefetch="on"))
    lengths = load_lengths("t1d-balanced", scale="paper", num_samples=40 * args.world_size * (args.steps + 2))
    data, model, tt, fwd = _TokenDataset(lengths.tokens), _tiny_model(), time.thread_time_ns, [0]

    def forward(model: torch.nn.Module, batch: object, ctx: object) -> tuple[torch.Tensor, torch.Tensor]:
        c0 = tt()
        logits = model(batch.inputs[:, :16])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets[:, :16].flatten(),
                                                 ignore_index=-100, reduction="sum")
        count = (batch.targets != -100).sum()
        if args.mb_ms:
            time.sleep(args.mb_ms / 1e3)
        fwd[0] = tt() - c0
        return loss, count

    Census(dist, clock=lambda: 0, agreeing_world=True, others_row=_without_count).__enter__()
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), table=table,
                      forward_fn=forward)
    eng, seg, it = mgr.engine, defaultdict(list), iter(mgr.get_data_iter(max_steps=args.steps))
    while True:
        c0 = tt()
        try:
            batch = next(it)
        except StopIteration:
            break
        c1 = tt()
        mgr.optimize_dynamics(batch, eng)
        c2 = tt()
        timer = mgr.profile(batch, eng)
        timer.__enter__()
        c3 = tt()
        loss = eng(batch)
        c4 = tt()
        eng.backward(loss)
        c5 = tt()
        eng.step()
        c6 = tt()
        timer.__exit__(None, None, None)
        c7 = tt()
        if mgr.global_step >= 2:
            parts = {"next": c1 - c0, "optdyn": c2 - c1, "profile_enter": c3 - c2, "call-fwd": c4 - c3 - fwd[0],
                     "fwd": fwd[0], "backward": c5 - c4, "step": c6 - c5, "exit": c7 - c6}
            parts["host"] = parts["next"] + parts["optdyn"] + parts["profile_enter"] + parts["call-fwd"] + parts["exit"]
            for k, v in parts.items():
                seg[k].append(v)
    for k, v in seg.items():
        print(f"{k:14s} n={len(v):4d} median {statistics.median(v) / 1e3:8.1f} us  mean {sum(v) / len(v) / 1e3:8.1f} us")


if __name__ == "__main__":
    main()
