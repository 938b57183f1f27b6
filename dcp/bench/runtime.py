"""``dcp bench runtime``: the manager's per-step overhead and the cost of switching SP groups.

On 2 gloo processes with the tiny Transformer-1D:
- overhead: the same fixed step (one SP group of 2, ga_steps micro-batches of fixed samples) run by a plain
  hand-written loop (forward, weighted backward, one flat all-reduce, SGD step) and by the manager
  (iterator, plan-hash check, weights, engine), alternating rounds; overhead_pct compares wall-time medians (overhead_cpu_pct: CPU time).
- SP switch: steps that alternate between one SP-2 group and two SP-1 groups vs steps that stay on one
  size; the switch cost is the alternating run's time minus the mean of the two fixed runs, per switch.
- prefetch: the manager at sp=2 with ``advanced.prefetch`` off (collation of every micro-batch on the
  training thread) in the same rotation; prefetch_saving_ms is the median over rounds of (off - on) per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (the fastest round is used)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sample")
    parser.add_argument("--ga-steps", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--mb-size", type=int, default=1, help="samples per micro-batch (collation work grows with it)")
    parser.add_argument("--fsdp2", action="store_true", help="also time the manager under runtime.engine fsdp2 (the "
                        "model sharded over both ranks), against ddp on the same plans")
    parser.add_argument("--log", action="store_true", help="show the manager's per-step log lines (off: no output per step)")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def fixed_step_plan(epoch: int, step: int, sp_sizes: tuple[int, ...], ga: int, seq_len: int, world: int,
                    b: int = 1) -> Any:
    """Step ``step`` of a hand-made epoch: one group per SP size in ``sp_sizes``, ``ga`` micro-batches of ``b``
    samples of ``seq_len`` tokens each, samples ``(2 * step + g) * ga * b`` onwards for group ``g``."""
    from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan

    groups, first = [], 0
    for g, p in enumerate(sp_sizes):
        # every step and group its own samples (at most 2 groups a step): the runtime refuses a sample trained
        # twice in an epoch (dcp.runtime.position)
        base = (2 * step + g) * ga * b
        mbs = tuple(MicroBatch(sample_ids=tuple(base + b * k + j for j in range(b)), seq_lens=(seq_len,) * b,
                               seq_group=0) for k in range(ga))
        groups.append(GroupPlan(first_rank=first, sp_size=p, recompute_layers=0, micro_batches=mbs))
        first += p
    return StepPlan(epoch=epoch, step=step, world_size=world, method="dcp-intra", groups=tuple(groups))


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    import dataclasses
    import logging

    import torch
    import torch.distributed as dist

    from dcp.api import set_manager
    from dcp.config import AdvancedConfig, DCPConfig, RuntimeConfig
    from dcp.models import T1DConfig, Transformer1D
    from dcp.runtime.data import SyntheticTokenDataset
    from dcp.runtime.engines import all_reduce_grads_flat, copy_flat_into_grads

    if not spec.get("log"):  # the manager still builds its records; nothing is written per step
        logging.getLogger("dcp").setLevel(logging.WARNING)
    steps, ga, seq_len = spec["steps"], spec["ga_steps"], spec["seq_len"]
    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset([seq_len] * (2 * steps * ga * spec["mb_size"]), vocab_size=model.config.vocab_size)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    b = spec["mb_size"]
    fixed = fixed_step_plan(0, 0, (2,), ga, seq_len, world, b)
    # default config except one log line per round (a per-step line to a pipe costs ~0.5 ms on this host)
    config = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(log_every=steps),
                       advanced=AdvancedConfig(prefetch="on"))
    def plans(e: int) -> list[Any]:
        return [fixed_step_plan(e, s, spec["pattern"](s), ga, seq_len, world, b) for s in range(steps)]

    mgr = set_manager(model, data, config, optimizer=opt, plans=plans)
    # the same manager with collation on the training thread (advanced.prefetch = false), same optimizer
    off = config.replace(advanced=dataclasses.replace(config.advanced, prefetch="off"))
    mgr_off = set_manager(model, data, off, optimizer=opt, plans=plans)
    managers = {"nopf": mgr_off}
    if spec.get("fsdp2"):  # a twin of the model, sharded by the fsdp2 engine, on the same plans
        import copy

        twin = copy.deepcopy(model)
        sharded = config.replace(runtime=dataclasses.replace(config.runtime, engine="fsdp2"))
        managers["fsdp2"] = set_manager(twin, data, sharded, optimizer=torch.optim.SGD(twin.parameters(), lr=1e-3),
                                        plans=plans)
    pattern = {"sp2": lambda s: (2,), "sp1": lambda s: (1, 1), "switch": lambda s: (2,) if s % 2 else (1, 1),
               "nopf": lambda s: (2,), "fsdp2": lambda s: (2,)}
    ctx = mgr.registry.context(fixed.groups[0], rank)
    n_step = sum(data.target_counts()[i] for i in fixed.sample_ids)
    batches = [data.collate([data[i] for i in mb.sample_ids]) for mb in fixed.groups[0].micro_batches]
    params = [p for p in model.parameters()]

    def plain_round() -> tuple[float, float]:
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            for i, mb in enumerate(fixed.groups[0].micro_batches):
                batch = data.collate([data[j] for j in mb.sample_ids]) if spec["collate"] else batches[i]
                loss, _ = model(batch, ctx)
                (loss / n_step).backward()
            flat, _ = all_reduce_grads_flat(params)
            copy_flat_into_grads(params, flat)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, time.process_time() - c0

    def manager_round(name: str) -> tuple[float, float]:
        spec["pattern"] = pattern[name]
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        m = managers.get(name, mgr)
        batches, waited = m.get_data_iter(), 0.0
        while True:  # the training thread's wait for its next micro-batch (collation, step bookkeeping)
            t = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - t
            if batch is None:
                break
            m.train_micro_batch(batch)
        wait_s.setdefault(name, []).append(waited / steps)
        return time.perf_counter() - t0, time.process_time() - c0

    # time spent in the manager's per-step check/stats exchange (its only collective besides the sync)
    begin = mgr._loop.begin_step
    exchange_s: list[float] = []
    wait_s: dict[str, list[float]] = {}

    def timed_begin(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        step = begin(*a, **k)
        exchange_s.append(time.perf_counter() - t)
        return step

    mgr._loop.begin_step = timed_begin
    spec["pattern"] = pattern["sp2"]
    plain_round(), manager_round("sp2"), manager_round("nopf")  # warm-up
    exchange_s.clear()
    wait_s.clear()
    kinds = ["plain", "sp2", "sp1", "switch", "nopf"] + (["fsdp2"] if spec.get("fsdp2") else [])
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    from tqdm.auto import tqdm

    for r in tqdm(range(spec["rounds"]), desc="bench runtime", unit="round", disable=rank != 0, dynamic_ncols=True):
        for name in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:  # rotate: no kind always runs first
            times[name].append(plain_round() if name == "plain" else manager_round(name))
    out: dict[str, list[float]] = {k: [w / steps for w, _ in v] for k, v in times.items()}
    out.update({f"{k}_cpu": [c / steps for _, c in v] for k, v in times.items()})
    out["exchange"] = exchange_s
    out.update({f"{k}_wait": v for k, v in wait_s.items()})
    return out


def run(args: argparse.Namespace) -> int:
    from dcp.distributed.launch import run_distributed

    for flag in ("steps", "rounds", "seq_len", "ga_steps", "mb_size"):  # before starting processes
        if getattr(args, flag) < 1:
            name = "--" + flag.replace("_", "-")
            raise ValueError(f"{name} ({getattr(args, flag)}) must be >= 1: zero or negative counts are not defaults")
    if args.mb_size * args.ga_steps > 100:
        raise ValueError(f"--mb-size x --ga-steps ({args.mb_size * args.ga_steps}) must be <= 100: the bench's "
                         "groups take 100 samples each")
    spec = {"steps": args.steps, "rounds": args.rounds, "seq_len": args.seq_len, "ga_steps": args.ga_steps,
            "mb_size": args.mb_size,
            "collate": True, "pattern": None, "log": args.log, "fsdp2": args.fsdp2}
    t0 = time.perf_counter()
    per_step = run_distributed(_worker, 2, spec, timeout_s=900)[0]
    exchange = per_step.pop("exchange")
    kinds = ("plain", "sp2", "sp1", "switch", "nopf") + (("fsdp2",) if args.fsdp2 else ())
    cpu = {k: per_step.pop(f"{k}_cpu") for k in kinds}
    waits = {k[:-5]: per_step.pop(k) for k in [k for k in per_step if k.endswith("_wait")]}
    wait_ms = {k: 1e3 * statistics.median(waits[k]) for k in ("sp2", "nopf")}
    # Rounds of all kinds run back to back, so comparing within a round cancels slow drifts of the host's
    # load; the median over rounds is reported (the fastest rounds are printed too).
    best = {k: min(v) for k, v in per_step.items()}
    med = {k: statistics.median(v) for k, v in per_step.items()}
    pairs = list(zip(per_step["plain"], per_step["sp2"], per_step["sp1"], per_step["switch"], strict=True))
    # collation ahead on a thread vs on the training thread, per step (the same round, back to back)
    prefetch_ms = 1e3 * statistics.median(off - on for on, off in zip(per_step["sp2"], per_step["nopf"], strict=True))
    prefetch_pct = 100.0 * statistics.median(off / on - 1.0 for on, off in zip(per_step["sp2"], per_step["nopf"],
                                                                               strict=True))
    # The headline is wall time: it includes waiting in the plan-hash all-gather. Process CPU time (what
    # the manager adds in work) is reported beside it; it is not inflated by other processes on the host.
    overhead_pct = 100.0 * statistics.median(m / p - 1.0 for p, m, _, _ in pairs)
    overhead_cpu = 100.0 * statistics.median(m / p - 1.0 for p, m in zip(cpu["plain"], cpu["sp2"], strict=True))
    overhead_best = 100.0 * (best["sp2"] - best["plain"]) / best["plain"]
    # a pattern of alternating steps switches SP size once per step
    switch_ms = 1e3 * statistics.median(w - 0.5 * (a + b) for _, a, b, w in pairs)
    exchange_ms = 1e3 * statistics.median(exchange)
    exchange_pct = 100.0 * statistics.median(exchange) / best["sp2"]
    print(f"# dcp bench runtime: 2 gloo processes, t1d-tiny, seq_len {args.seq_len}, ga_steps {args.ga_steps}, "
          f"mb_size {args.mb_size}, {args.steps} steps x {args.rounds} rounds ({time.perf_counter() - t0:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for name, label in (("plain", "plain loop, sp=2"), ("sp2", "manager, sp=2"), ("sp1", "manager, sp=[1,1]"),
                        ("switch", "manager, alternating sp=2 / sp=[1,1]"),
                        ("nopf", "manager, sp=2, advanced.prefetch = false"),
                        ("fsdp2", "manager, sp=2, runtime.engine = fsdp2")):
        if name not in per_step:
            continue
        spread = f"median {1e3 * med[name]:.2f} max {1e3 * max(per_step[name]):.2f}"
        print(f"step_ms {name:7s} {1e3 * best[name]:8.2f}  ({spread})  {label}")
    for name in ("plain", "sp2"):
        print(f"step_cpu_ms {name:7s} {1e3 * statistics.median(cpu[name]):8.2f}  (median process CPU time, rank 0)")
    print(f"overhead_pct {overhead_pct:.2f}  (manager sp=2 vs plain loop sp=2, wall time, median ratio; "
          f"fastest rounds: {overhead_best:.2f})")
    print(f"overhead_cpu_pct {overhead_cpu:.2f}  (same, process CPU time of rank 0)")
    print(f"exchange_ms {exchange_ms:.3f}  (manager bookkeeping between steps: stats all-gather on logged steps, per step; {exchange_pct:.2f} % of a step)")
    print(f"batch_wait_ms sp2 {wait_ms['sp2']:.3f} nopf {wait_ms['nopf']:.3f}  (training thread's wait for its next "
          "micro-batch per step: collation + step bookkeeping; median over rounds, rank 0)")
    print(f"prefetch_saving_ms {prefetch_ms:.3f}  ({prefetch_pct:.2f} %; prefetch off minus on, per step, median over rounds)")
    print(f"sp_switch_ms {switch_ms:.3f}  (alternating minus mean of fixed sizes, per switch; median over rounds)")
    fsdp2_pct = None
    if args.fsdp2:  # the same plans and work; the sharded engine's gathers and reduce-scatters against ddp's sync
        fsdp2_pct = 100.0 * statistics.median(f / d - 1.0 for d, f in zip(per_step["sp2"], per_step["fsdp2"],
                                                                             strict=True))
        print(f"fsdp2_vs_ddp_pct {fsdp2_pct:.2f}  (manager sp=2 under fsdp2 vs ddp, wall time, median ratio per round)")
    if args.json:
        print(json.dumps({"overhead_pct": round(overhead_pct, 3), "sp_switch_ms": round(switch_ms, 4),
                          "overhead_cpu_pct": round(overhead_cpu, 3), "exchange_ms": round(exchange_ms, 4),
                          "prefetch_saving_ms": round(prefetch_ms, 4), "prefetch_saving_pct": round(prefetch_pct, 3),
                          "batch_wait_ms": {k: round(v, 4) for k, v in wait_ms.items()},
                          "step_ms": {k: round(1e3 * v, 3) for k, v in best.items()},
                          **({"fsdp2_vs_ddp_pct": round(fsdp2_pct, 3)} if fsdp2_pct is not None else {})}))
    return 0
