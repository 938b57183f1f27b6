"""Where ``dcp bench scale``'s host time per micro-batch goes: its setup (fake process group, paper-scale plans,
the tiny model) with only ``time.thread_time_ns`` brackets, host time accounted as the bench accounts (thread
CPU minus the forward, backward and engine.step, plus the manager's step_done), per micro-batch and per step.

    PYTHONPATH=$PWD python scripts/host_gap.py --world-size 4096 --rank 2048 --steps 10 [--mb-ms 0]

Prints the median step's host ms (compare ``host_ms_raw_per_step``), the distribution of the per-micro-batch
host time (median, mean, p90, p99), the share of the total in the steps' first micro-batches and in
micro-batches over 150 us, and the mean and median of each segment (``next``: the data iterator, its step
boundary included; ``optdyn``; ``enter`` / ``exit``: ``mgr.profile``; ``callfwd``: ``engine(batch)`` minus the
forward; ``step_done``), and of the model's ``fwd``, ``backward`` and ``step`` (not host). A median per segment
leaves out the step boundaries and the rare slow micro-batches; the mean beside it shows what they add. (It
replaced ``scripts/host_segments.py``, which printed the medians alone.)

``--calls`` also wraps the runtime's calls on the per-micro-batch path (the prefetcher's ``take``, the phase
board's ``enter``, ``optimize_dynamics``, ``mgr.profile`` and its timer's enter / exit, ``before_forward``,
``forward_out``: the forward's check and count) with thread-CPU brackets, and ``take`` with a wall-clock one too (the
training thread's wait for the next batch), and prints each call's median and mean over the micro-batches, the
step's first micro-batch apart (``@first``: its calls run after the step boundary). The wrappers add ~1-2 us
per call to the segments above.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import time
from collections import defaultdict

SEGMENTS = ("next", "optdyn", "enter", "callfwd", "exit", "step_done")
MODEL_SEGMENTS = ("fwd", "backward", "step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mb-ms", type=float, default=0.0, help="sleep per micro-batch at the forward's end")
    parser.add_argument("--calls", action="store_true", help="time each runtime call on the micro-batch path")
    parser.add_argument("--store", choices=("hash", "fake"), default="hash", help="as dcp bench scale --store")
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
    store = FakeStore() if args.store == "fake" else dist.HashStore()  # as dcp bench scale --store
    dist.init_process_group("fake", store=store, rank=args.rank, world_size=args.world_size)
    sc = scenario("t1d-5b", "h200")
    config, table = paper_config(sc, "dcp-intra"), paper_table(sc, args.world_size)
    config = config.replace(advanced=dataclasses.replace(config.advanced, prefetch="on"))
    lengths = load_lengths("t1d-balanced", scale="paper", num_samples=40 * args.world_size * (args.steps + 2))
    data, model, tt, acc = _TokenDataset(lengths.tokens), _tiny_model(), time.thread_time_ns, {"fwd": 0, "sd": 0}

    def forward(model: torch.nn.Module, batch: object, ctx: object) -> tuple[torch.Tensor, torch.Tensor]:
        c0 = tt()
        logits = model(batch.inputs[:, :16])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets[:, :16].flatten(),
                                                 ignore_index=-100, reduction="sum")
        count = (batch.targets != -100).sum()
        if args.mb_ms:
            time.sleep(args.mb_ms / 1e3)
        acc["fwd"] = tt() - c0
        return loss, count

    mgrs: list = []
    census = Census(dist, clock=lambda: mgrs[0].global_step if mgrs else -1, agreeing_world=True,
                    others_row=_without_count)
    census.__enter__()
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), table=table,
                      forward_fn=forward)
    mgrs.append(mgr)
    calls = _wrap_calls(mgr) if args.calls else None
    eng, inner_done = mgr.engine, mgr.step_done

    def step_done(sync: object) -> None:
        c0 = tt()
        inner_done(sync)
        acc["sd"] = tt() - c0

    mgr.step_done = step_done
    per_mb, start, index = [], {}, defaultdict(int)  # per_mb: (step, index in step, host ns, segments, model ns)
    it = iter(mgr.get_data_iter(max_steps=args.steps))
    while True:
        c0, t = tt(), mgr.global_step
        start.setdefault(t, c0)
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
        acc["fwd"] = acc["sd"] = 0
        loss = eng(batch)
        c4 = tt()
        eng.backward(loss)
        c5 = tt()
        eng.step()
        c6 = tt()
        timer.__exit__(None, None, None)
        c7 = tt()
        seg = {"next": c1 - c0, "optdyn": c2 - c1, "enter": c3 - c2, "callfwd": c4 - c3 - acc["fwd"],
               "exit": c7 - c6, "step_done": acc["sd"],
               # the model's and the engine's, not host (backward and step hold the runtime's loss weight and
               # boundary checks)
               "fwd": acc["fwd"], "backward": c5 - c4, "step": c6 - c5 - acc["sd"]}
        model_ns = acc["fwd"] + (c5 - c4) + (c6 - c5 - acc["sd"])
        per_mb.append((t, index[t], c7 - c0 - model_ns, seg, model_ns))
        index[t] += 1
    census.__exit__()
    steps = [t for t in sorted(start) if t >= 1 and t + 1 in start]
    # the step's thread CPU minus the model's brackets and the census's own work (the bench's raw figure)
    host = {t: start[t + 1] - start[t] - sum(m[4] for m in per_mb if m[0] == t) - census.own_s.get(t, 0.0) * 1e9
            for t in steps}
    timed = [m for m in per_mb if m[0] in host]
    hs = sorted(h / 1e3 for _, _, h, _, _ in timed)
    total, n = sum(hs), len(hs)
    print(f"steps {steps}: micro-batches {[index[t] for t in steps]}, host ms "
          f"{[round(host[t] / 1e6, 3) for t in steps]}, median step "
          f"{statistics.median(host[t] for t in steps) / 1e6:.3f} ms")
    first = sum(h / 1e3 for _, i, h, _, _ in timed if i == 0)
    slow = [h / 1e3 for _, i, h, _, _ in timed if i > 0 and h > 150_000]
    print(f"per micro-batch host us: n {n} median {hs[n // 2]:.1f} mean {total / n:.1f} p90 {hs[int(0.9 * n)]:.1f} "
          f"p99 {hs[int(0.99 * n)]:.1f}; first of a step: {first / total:.0%} of the total; later ones over 150 us: "
          f"{len(slow)}, {sum(slow) / total:.0%} of the total")
    for k in SEGMENTS + MODEL_SEGMENTS:
        v = [mb[k] / 1e3 for _, _, _, mb, _ in timed]
        print(f"{k:10s} median {statistics.median(v):8.1f} us  mean {sum(v) / len(v):8.1f} us"
              + ("  (model)" if k in MODEL_SEGMENTS else ""))
    for name, v in sorted((calls or {}).items()):
        print(f"call {name:24s} n {len(v):4d} median {statistics.median(v) / 1e3:8.1f} us  mean "
              f"{sum(v) / len(v) / 1e3:8.1f} us")


def _wrap_calls(mgr: object) -> dict[str, list[int]]:
    """Wrap the runtime's per-micro-batch calls with thread-CPU brackets (``take`` also wall-clock); returns the
    ns per call by name, '@first' for those made while the step's first micro-batch is the pending one."""
    from dcp.runtime import loop, manager, phases, prefetch, profiling

    out: dict[str, list[int]] = defaultdict(list)

    def wrap(owner: object, name: str, label: str, clock: object = time.thread_time_ns) -> None:
        fn = getattr(owner, name)

        def call(*a: object, **k: object) -> object:
            c0 = clock()
            try:
                return fn(*a, **k)
            finally:
                step = mgr._loop.step
                out[label + ("@first" if step is not None and step.mb_index <= 0 else "")].append(clock() - c0)

        setattr(owner, name, call)

    wrap(prefetch.BatchPrefetcher, "take", "take (wall)", time.perf_counter_ns)
    for owner, name in ((prefetch.BatchPrefetcher, "take"), (phases.PhaseBoard, "enter"),
                        (manager.DCPManager, "optimize_dynamics"), (manager.DCPManager, "profile"),
                        (profiling.MicroBatchTimer, "__enter__"), (profiling.MicroBatchTimer, "__exit__"),
                        (manager.DCPManager, "before_forward"), (loop.StepLoop, "forward_out")):
        wrap(owner, name, name)
    return out


if __name__ == "__main__":
    main()
