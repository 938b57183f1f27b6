"""``dcp bench gpu --only knobs``: what two runtime settings save a step on one device, through the manager.

The manager at W = 1 (NCCL on CUDA; gloo on the hidden CPU path) runs the same hand-made steps with a setting
on and off, in alternating order, round after round:

- ``advanced.prefetch``: "on" collates (and on CUDA pins) the next micro-batches on the prefetch thread; "off"
  does both on the training thread, between two micro-batches;
- ``advanced.cache_weight_casts``: on, autocast's bf16 weight copies are made at a step's first micro-batch and
  reused by its later ones; off, every micro-batch casts every weight (bf16 only: without autocast it changes
  nothing).

The loop is the paper's (forward, backward, step), with no host read of the loss, so the host runs ahead of the
device as a training job does. A round is one epoch of 6 steps of 4 micro-batches in each mode; the epoch's
fixed costs (the prefetch thread's start and stop, its first micro-batch collated in place, the end-of-epoch
stats exchange) are paid by both modes and spread over its steps. Per case and setting: the median step time
of each mode, the saving (off minus on, paired within a round), and for prefetching the host time of what the
prefetch thread takes off the training thread for one micro-batch (``dataset[i]``, ``collate`` and, on CUDA,
the pinned copy; not the host-to-device copy, which the training thread enqueues in both modes).

The cases: a short Transformer-1D micro-batch (1024 tokens, whose step an H200 runs in about the time the host
takes to enqueue it) and a long Transformer-2D one (16384 tokens of video latents: collation costs
milliseconds, and the device takes longer than the host to run the step).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from dcp.bench.runtime import fixed_step_plan

KNOB_CASES = (("t1d-5b", 1024, 1), ("t2d-1.2b", 16384, 1))
"""(model, tokens per sample, samples per micro-batch) of each case."""
TINY_CASES = (("t1d-tiny", 64, 2), ("t2d-tiny", 64, 1))
KNOBS = {"prefetch": ("on", "off"), "cache_weight_casts": (True, False)}
"""Each setting of RuntimeConfig compared, and its (on, off) values."""


def _dataset(model: Any, num_samples: int, tokens: int) -> Any:
    """Synthetic samples of ``tokens`` tokens for ``model``: token ids (T1D) or video latents of T x S (T2D)."""
    from dcp.runtime.data import SyntheticTokenDataset, SyntheticVideoDataset

    config = model.config
    if hasattr(config, "vocab_size"):
        return SyntheticTokenDataset([tokens] * num_samples, vocab_size=config.vocab_size)
    frames = config.synthetic_frames
    if tokens % frames:
        raise ValueError(f"knob case tokens ({tokens}) must be a multiple of t2d.synthetic_frames ({frames}): "
                         f"use {tokens - tokens % frames or frames} tokens")
    return SyntheticVideoDataset([(frames, tokens // frames)] * num_samples, in_channels=config.in_channels)


def _epoch_s(mgr: Any, sync: Any) -> float:
    """Seconds of one epoch of the paper's loop through ``mgr``, the device's queue drained at both ends."""
    eng = mgr.engine
    sync()
    t0 = time.perf_counter()
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, eng)
        loss = eng(batch)
        eng.backward(loss)
        eng.step()
    sync()
    return time.perf_counter() - t0


def paired_rounds(managers: dict[str, Any], rounds: int, steps: int, sync: Any = lambda: None) -> dict[str, list[float]]:
    """Seconds per step of each manager (one epoch of ``steps`` steps, divided), round by round: one warm-up
    epoch each (kernels, allocator, the prefetch thread), then ``rounds`` rounds of one epoch each, alternating
    which goes first, so a drift of the host's load falls on both."""
    for mgr in managers.values():
        _epoch_s(mgr, sync)
    modes = list(managers)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            times[mode].append(_epoch_s(managers[mode], sync) / steps)
    return times


def _collate_ms(data: Any, b: int, cuda: bool) -> float:
    """Median host ms of what the prefetch thread does for one micro-batch (BatchPrefetcher's collation)."""
    from dcp.runtime.prefetch import pin_batch

    times = []
    for i in range(5):
        t0 = time.perf_counter()
        batch = data.collate([data[j] for j in range(i * b, (i + 1) * b)])
        if cuda:
            batch = pin_batch(batch)
        times.append(time.perf_counter() - t0)
        del batch
    return 1e3 * statistics.median(times)


def _worker(rank: int, world: int, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The W = 1 job: for each case and setting, two managers on one model (the setting on and off), warmed up,
    then ``rounds`` paired rounds."""
    import gc
    import logging

    import torch

    from dcp.api import set_manager
    from dcp.config import AdvancedConfig, DCPConfig, RuntimeConfig
    from dcp.models import build_model

    logging.getLogger("dcp").setLevel(logging.WARNING)  # no per-round log lines
    cuda = spec["cuda"]
    if cuda:
        torch.cuda.set_device(0)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    steps, ga, rounds = spec["steps"], spec["ga"], spec["rounds"]
    out = []
    for name, tokens, b in spec["cases"]:
        model = build_model(name, num_layers=spec["layers"]).to(device)
        data = _dataset(model, 2 * steps * ga * b, tokens)

        def plans(e: int, tokens: int = tokens, b: int = b) -> list[Any]:
            return [fixed_step_plan(e, s, (1,), ga, tokens, 1, b) for s in range(steps)]

        base = RuntimeConfig(log_every=steps, precision=spec["precision"])
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        for knob, values in KNOBS.items():
            managers = {}
            for mode, value in zip(("on", "off"), values, strict=True):
                config = DCPConfig(model=model.config.shape(), runtime=base, advanced=AdvancedConfig(**{knob: value}))
                managers[mode] = set_manager(model, data, config, optimizer=opt, plans=plans)
            times = paired_rounds(managers, rounds, steps, sync)
            saving = [off - on for on, off in zip(times["on"], times["off"], strict=True)]
            row = {"model": name, "tokens": tokens, "b": b, "ga": ga, "knob": knob,
                   "step_ms_on": round(1e3 * statistics.median(times["on"]), 3),
                   "step_ms_off": round(1e3 * statistics.median(times["off"]), 3),
                   "saving_ms": round(1e3 * statistics.median(saving), 3),
                   "saving_pct": round(100 * statistics.median(
                       s / on for s, on in zip(saving, times["on"], strict=True)), 2),
                   "saving_positive_rounds": sum(s > 0 for s in saving), "rounds": rounds}
            if knob == "prefetch":
                row["collate_ms_per_micro_batch"] = round(_collate_ms(data, b, cuda), 3)
                # micro-batches that came ahead from the prefetch thread, per mode (off: none)
                row["prefetched"] = {mode: m._loop.prefetched for mode, m in managers.items()}
            out.append(row)
            del managers
        del model, opt
        gc.collect()  # the managers' and engines' reference cycles: the next case's model needs the memory
        if cuda:
            torch.cuda.empty_cache()
    return out


def knob_rows(*, cuda: bool, precision: str, layers: int, tiny: bool, rounds: int = 5) -> list[dict[str, Any]]:
    """One row per case (KNOB_CASES, or TINY_CASES on the CPU test path) and setting, measured in a W = 1 job."""
    from dcp.distributed.launch import run_distributed

    spec = {"cuda": cuda, "precision": precision, "layers": layers, "steps": 6, "ga": 4, "rounds": rounds,
            "cases": TINY_CASES if tiny else KNOB_CASES}
    env = {"DS_ACCELERATOR": "cuda"} if cuda else {}
    return run_distributed(_worker, 1, spec, backend="nccl" if cuda else "gloo", timeout_s=600, env=env)[0]


def print_knobs(rows: list[dict[str, Any]]) -> None:
    print(f"{'model':<10} {'tokens':>6} {'b':>2} {'ga':>3} {'setting':<19} {'step ms on':>11} {'off':>9} "
          f"{'saving ms':>10} {'saving %':>9} {'rounds +':>9} {'collate ms/mb':>14}")
    for r in rows:
        collate = r.get("collate_ms_per_micro_batch")
        print(f"{r['model']:<10} {r['tokens']:>6} {r['b']:>2} {r['ga']:>3} {r['knob']:<19} {r['step_ms_on']:>11.2f} "
              f"{r['step_ms_off']:>9.2f} {r['saving_ms']:>10.3f} {r['saving_pct']:>9.2f} "
              f"{r['saving_positive_rounds']:>4}/{r['rounds']:<4} {'-' if collate is None else f'{collate:.3f}':>14}")
