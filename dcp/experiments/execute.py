"""Executing one run on this rank: the manager's training loop (default) or a minimal direct loop.

Both executors run the same plans (``EpochPlanner`` over the run's lengths and the profiled table) and
return, on rank 0, one record per measured step (``step_record``) plus run-level facts.

- ``manager``: the paper's loop (Figure 14) through ``dcp.set_manager``: ``get_data_iter``,
  ``optimize_dynamics``, ``profile``, engine forward/backward/step (DDP or DeepSpeed ZeRO-1). Busy time
  per rank and step time come from the manager's own ``step_stats`` (busy = time inside ``mgr.profile``
  minus the gradient sync and optimizer step; step time = start of one step to the start of the next).
- ``direct``: the runner's own loop: per step a barrier, this rank's micro-batches, one flat gradient
  all-reduce, AdamW. Same plans, no manager: a cross-check of the manager's overhead.

Memory: on CUDA the allocator's peak counter is read around every micro-batch (free). On CPU the meter
counts saved tensors through autograd hooks, whose Python callbacks cost ~10 % of a small micro-batch's
time; inside the timed steps they would bias the very step times the simulator is validated against. On
CPU the peak is therefore measured after the timed steps, by replaying every measured micro-batch of
this rank once more (forward and backward, same SP group and recompute setting, no optimizer update).

A packed micro-batch (seq_group -1) of 1D samples runs as ONE sequence of documents: Transformer-1D packs
unequal lengths into one row with per-document attention and positions (dcp.models.t1d). 2D packs of
mixed shapes run sample by sample (a video's frames x positions grid does not flatten into one row).
"""

from __future__ import annotations

import dataclasses
import time
from itertools import islice
from typing import Any

from dcp.experiments.results import idle_ratio_from_busy
from dcp.experiments.sweep import RunSpec, model_config


# ----- shared pieces ---------------------------------------------------------------------------------
def build_model(name: str, device: Any) -> Any:
    from dcp.models.t1d import T1DConfig, Transformer1D
    from dcp.models.t2d import Transformer2D

    mcfg = model_config(name)
    model = Transformer1D(mcfg) if isinstance(mcfg, T1DConfig) else Transformer2D(mcfg)
    return model.to(device)


def build_dataset(run: RunSpec) -> Any:
    """SyntheticTokenDataset / SyntheticVideoDataset over lengths drawn from the run's distribution."""
    from dcp.data_dists import load_lengths
    from dcp.runtime.data import SyntheticTokenDataset, SyntheticVideoDataset

    s = run.sweep
    got = load_lengths(run.distribution, scale=s.scale, num_samples=s.num_samples, seed=s.seed)
    mcfg = model_config(run.model)
    if got.shapes is None:
        return SyntheticTokenDataset(list(got.tokens), vocab_size=mcfg.vocab_size, seed=s.seed)
    return SyntheticVideoDataset(list(got.shapes), in_channels=mcfg.in_channels, seed=s.seed)


def first_plans(dataset: Any, table: Any, cfg: Any, world_size: int, count: int) -> list[Any]:
    """The epoch's first ``count`` StepPlans (pure, identical on every rank and to the manager's)."""
    from dcp.planner import EpochPlanner

    shapes = dataset.sample_shapes() if hasattr(dataset, "sample_shapes") else None
    plans = list(islice(EpochPlanner(dataset.lengths(), table, cfg, world_size, 0, shapes=shapes), count))
    if len(plans) < count:
        raise ValueError(
            f"sweep.num_samples gives only {len(plans)} steps for {cfg.planning.method} at W={world_size}, fewer "
            f"than warmup_steps + steps ({count}): raise sweep.num_samples"
        )
    return plans


def split_samples(batch: Any) -> list[Any]:
    """One Batch per sample, cut to its own length (no padding): how a packed micro-batch runs here."""
    from dcp.data import Batch

    out = []
    for i, n in enumerate(batch.seq_lens):
        if batch.shapes is None:
            out.append(Batch(inputs=batch.inputs[i:i + 1, :n], targets=batch.targets[i:i + 1, :n], seq_lens=(n,),
                             sample_ids=(batch.sample_ids[i],)))
        else:
            t, s = batch.shapes[i]
            out.append(Batch(inputs=batch.inputs[i:i + 1, :t, :s], targets=batch.targets[i:i + 1, :t, :s],
                             seq_lens=(n,), shapes=((t, s),), sample_ids=(batch.sample_ids[i],)))
    return out


def packed_forward(model: Any, batch: Any, ctx: Any) -> tuple[Any, Any]:
    """forward_fn for packed micro-batches: 1D, one forward of the pack (the model runs it as documents);
    2D, the sum of per-sample (loss_sum, count)."""
    if batch.size == 1 or batch.shapes is None:
        return model(batch, ctx)
    loss, count = 0, 0
    for one in split_samples(batch):
        part_loss, part_count = model(one, ctx)
        loss, count = loss + part_loss, count + part_count
    return loss, count


class Meter:
    """Peak bytes while active: CUDA allocator peak, or live saved activations on CPU (plus nothing else)."""

    def __init__(self, device: Any, params: list[Any]) -> None:
        self.device, self.params, self.inner = device, params, None

    def __enter__(self) -> Meter:
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from dcp.profiler.memory import SavedTensorMeter

            self.inner = SavedTensorMeter(exclude=self.params).__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.inner is not None:
            self.inner.__exit__(*exc)

    def peak(self) -> float:
        import torch

        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device))
        return float(self.inner.peak_bytes)


def _inline_meter(inline: bool, device: Any, params: list[Any]) -> Any:
    """A Meter around a timed micro-batch on CUDA (free); nothing on CPU (metered by replay_peak)."""
    import contextlib

    return Meter(device, params) if inline else contextlib.nullcontext()


def replay_peak(plans: list[Any], rank: int, registry: Any, model: Any, dataset: Any, attention: str,
                forward: Any, device: Any, params: list[Any], precision: str = "fp32") -> float:
    """Largest metered peak of this rank's micro-batches in ``plans``, re-run untimed (the CPU memory pass).

    Every rank of an SP group replays the same micro-batches in plan order, so the Ulysses collectives
    inside a group match; groups never talk to each other here. Gradients are dropped afterwards.
    ``precision`` ('bf16' / 'fp32', resolved) is the one the timed steps ran in.
    """
    from dcp.distributed import autocast

    peak = 0.0
    for plan in plans:
        group = plan.group_of(rank)
        if not group.micro_batches:
            continue
        ctx = registry.context(group, rank, attention)
        for mb in group.micro_batches:
            batch = dataset.collate([dataset[j] for j in mb.sample_ids])
            with Meter(device, params) as meter:
                with autocast(precision, device):
                    loss_sum, _ = forward(model, batch.to(device), ctx)
                loss_sum.backward()
            peak = max(peak, meter.peak())
    model.zero_grad(set_to_none=True)
    return peak


def _plain_forward(model: Any, batch: Any, ctx: Any) -> tuple[Any, Any]:
    return model(batch, ctx)


def state_bytes(model: Any, optimizer: Any, device: Any) -> float:
    """Parameters + gradients + optimizer state on CPU; 0 on CUDA (the allocator peak includes them)."""
    if device.type == "cuda":
        return 0.0
    from dcp.profiler.memory import state_bytes as measure

    return float(measure(model, optimizer).total_bytes)


def predicted_peak(plans: list[Any], table: Any) -> float:
    """Largest Eq. 6 memory of any micro-batch in the plans (row: smallest profiled b >= its size)."""
    from dcp.planner.cost import micro_batch_mem_bytes

    rows: dict[tuple[int, int], list] = {}
    for row in table.rows:
        rows.setdefault((row.seq_group, row.sp_size), []).append(row)
    best = 0.0
    for plan in plans:
        for g in plan.groups:
            for mb in g.micro_batches:
                if mb.seq_group < 0:
                    continue  # packed micro-batches mix seq_groups; no single row describes them
                cands = sorted(rows.get((mb.seq_group, g.sp_size), []), key=lambda r: r.micro_batch_size)
                row = next((r for r in cands if r.micro_batch_size >= mb.size), None)
                if row is not None:
                    best = max(best, micro_batch_mem_bytes(row, g.recompute_of(mb)))  # (its own r)
    return best


def _reduce_peak(local: float) -> float:
    import torch.distributed as dist

    from dcp.distributed.comm import all_reduce_values

    return all_reduce_values([local], dist.ReduceOp.MAX)[0]


def _extra(run: RunSpec, peak: float, plans: list[Any], table: Any, device: Any, executor: str) -> dict:
    return {
        "peak_mem_bytes": peak,
        "mem_meter": "cuda-allocator" if device.type == "cuda" else "saved-tensors+state",
        "predicted_peak_mem_bytes": predicted_peak(plans[run.sweep.warmup_steps:], table),
        "profile_source": table.meta.source,
        "executor": executor,
    }


def ideal_step_time_s(plan: Any, table: Any, cfg: Any, world_size: int) -> float:
    """Time of the step's samples at the ideal bound on ``world_size`` GPUs: each at its seq_group's best tokens
    per GPU-second in ``table``, no idle, no sync (``dcp.sim.cluster.ideal_tokens_per_s``)."""
    from dcp.sim.cluster import ideal_tokens_per_s

    lengths = [n for g in plan.groups for mb in g.micro_batches for n in mb.seq_lens]
    return sum(lengths) / ideal_tokens_per_s(lengths, table, cfg, world_size)


def step_record(step: int, plan: Any, busy_s: list[float], wall_s: float, ideal_time_s: float = float("nan")) -> dict:
    """The measured and predicted figures of one step (rank 0), in steps.csv terms; ``ideal_time_s`` from
    :func:`ideal_step_time_s`."""
    groups = [
        {
            "first_rank": g.first_rank,
            "sp_size": g.sp_size,
            "ga_steps": g.ga_steps,
            "recompute_layers": g.recompute_layers,
            "group_tokens": g.tokens,
            "predicted_group_time_s": g.time_s,
        }
        for g in plan.groups
    ]
    return {
        "step": step,
        "predicted_step_time_s": plan.step_time_s,
        "measured_step_time_s": wall_s,
        "measured_compute_time_s": max(busy_s),
        "predicted_idle_ratio": plan.idle_ratio_gpu,
        "measured_idle_ratio": idle_ratio_from_busy(busy_s),
        "tokens": plan.tokens,
        "samples": plan.samples,
        "ideal_time_s": ideal_time_s,
        "groups": groups,
        "busy_s": list(busy_s),
    }


# ----- executor 1: the manager (the paper's loop) ------------------------------------------------------
def execute_manager(run: RunSpec, rank: int, world_size: int, device: Any, registry: Any, table: Any,
                    model: Any) -> tuple[list[dict], dict]:
    import torch

    from dcp.api import set_manager

    sweep, cfg = run.sweep, run.config
    # Every step's StepStats (all ranks' busy times) are needed for the measured idle ratio, whatever the
    # log interval: gather them each step.
    cfg = cfg.replace(advanced=dataclasses.replace(cfg.advanced, stats_every=1))
    dataset = build_dataset(run)
    total = sweep.warmup_steps + sweep.steps
    plans = first_plans(dataset, table, cfg, world_size, total)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mgr = set_manager(model, dataset, cfg, optimizer=optimizer, engine=cfg.runtime.engine, table=table,
                      forward_fn=packed_forward if run.method == "packed" else None)
    engine = mgr.engine
    params = [p for p in model.parameters() if p.requires_grad]
    peak = 0.0
    inline = device.type == "cuda"  # CPU: metered in an untimed replay afterwards (module docstring)
    for batch in mgr.get_data_iter(max_steps=total):
        mgr.optimize_dynamics(batch, engine)
        with mgr.profile(batch, engine, mgr.gas):
            with _inline_meter(inline, device, params) as meter:
                loss = engine(batch.to(device) if inline else batch)
                engine.backward(loss)
            if meter is not None:
                peak = max(peak, meter.peak())
            engine.step()
    stats = mgr.step_stats  # the same on every rank: busy times of all ranks, this rank's step time
    if len(stats) != total:
        raise RuntimeError(f"manager recorded {len(stats)} steps, expected {total}: report this as a bug")
    records = []
    for i in range(sweep.warmup_steps, total):
        st, plan = stats[i], plans[i]
        if st.step != plan.step:
            raise RuntimeError(f"manager step {st.step} is not planned step {plan.step}: plans diverged")
        records.append(step_record(i - sweep.warmup_steps, plan, list(st.busy_s), st.step_time_s,
                                   ideal_step_time_s(plan, table, cfg, world_size)))
    if not inline:
        forward = packed_forward if run.method == "packed" else _plain_forward
        replay, replay_params = model, params
        if cfg.runtime.engine.startswith("fsdp2"):
            # the replay runs each SP group on its own: a sharded model would gather over every rank (unmatched),
            # so an unsharded twin replays the activations; the sharded state is counted by state_bytes below
            replay = build_model(run.model, device)
            replay_params = [p for p in replay.parameters() if p.requires_grad]
        peak = replay_peak(plans[sweep.warmup_steps:], rank, registry, replay, dataset, cfg.runtime.attention,
                           forward, device, replay_params, mgr.precision)
    peak = _reduce_peak(peak + state_bytes(model, optimizer, device))
    return records, _extra(run, peak, plans, table, device, "manager")


# ----- executor 2: direct (plans + own timed loop) -----------------------------------------------------
def execute_direct(run: RunSpec, rank: int, world_size: int, device: Any, registry: Any, table: Any,
                   model: Any) -> tuple[list[dict], dict]:
    import torch
    import torch.distributed as dist

    from dcp.distributed import autocast, backend_device, resolve_precision

    sweep, cfg = run.sweep, run.config
    precision = resolve_precision(cfg.runtime.precision, device)  # as the manager's ddp engine runs it
    dataset = build_dataset(run)
    plans = first_plans(dataset, table, cfg, world_size, sweep.warmup_steps + sweep.steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    counts = dataset.target_counts()
    records: list[dict] = []
    peak = 0.0
    inline = device.type == "cuda"  # CPU: metered in an untimed replay afterwards (module docstring)
    forward = packed_forward if run.method == "packed" else _plain_forward
    for i, plan in enumerate(plans):
        group = plan.group_of(rank)
        ctx = registry.context(group, rank, cfg.runtime.attention)
        # Batches are collated before the clock starts (data generation is not what methods differ in);
        # every rank of an SP group collates the same full micro-batch from (seed, epoch, sample id).
        batches = [dataset.collate([dataset[j] for j in mb.sample_ids]) for mb in group.micro_batches]
        # Loss weight 1 / (labelled tokens of the whole step, all ranks): summing every rank's gradient
        # then gives the mean-loss gradient whatever the SP sizes and ga_steps.
        weight = 1.0 / max(1, sum(counts[j] for j in plan.sample_ids))
        dist.barrier()  # every rank starts the step together: busy and wall times share an origin
        t0 = time.perf_counter()
        for batch in batches:
            with _inline_meter(inline, device, params) as meter:
                with autocast(precision, device):
                    loss_sum, _ = forward(model, batch.to(device) if inline else batch, ctx)
                (loss_sum * weight).backward()
            if meter is not None:
                peak = max(peak, meter.peak())
        _sync(device)
        busy = time.perf_counter() - t0
        _all_reduce_grads(params)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        wall = time.perf_counter() - t0
        stats = torch.tensor([busy, wall], dtype=torch.float64, device=backend_device())
        gathered = [torch.zeros_like(stats) for _ in range(world_size)]
        dist.all_gather(gathered, stats)
        if i >= sweep.warmup_steps and rank == 0:
            records.append(step_record(i - sweep.warmup_steps, plan, [float(g[0]) for g in gathered],
                                       max(float(g[1]) for g in gathered),
                                       ideal_step_time_s(plan, table, cfg, world_size)))
    if not inline:
        peak = replay_peak(plans[sweep.warmup_steps:], rank, registry, model, dataset, cfg.runtime.attention,
                           forward, device, params, precision)
    peak = _reduce_peak(peak + state_bytes(model, optimizer, device))
    return records, _extra(run, peak, plans, table, device, "direct")


def _all_reduce_grads(params: list[Any]) -> None:
    """Sum every rank's gradient in one flat collective; ranks without work contribute zeros."""
    import torch

    from dcp.distributed.comm import all_reduce_grads_flat, copy_flat_into_grads

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat, _ = all_reduce_grads_flat(params)
    copy_flat_into_grads(params, flat)


def _sync(device: Any) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
