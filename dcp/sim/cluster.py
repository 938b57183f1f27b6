"""Run the real planner over a simulated cluster and account for time, idleness and memory.

For every StepPlan of ``plan_epoch`` (the same code the runtime uses):

- each SP group runs its micro-batches back to back; a micro-batch takes the time of its (seq_group, p, r,
  samples) row of the *truth* table (the planning table unless another is given, e.g. a measured one), by
  the paper's Eq. 4, which already contains the Ulysses all-to-alls of every layer;
- the step's compute phase lasts as long as its slowest group; ranks of faster groups idle until then
  (data-parallel ranks meet at the gradient synchronisation, so nobody may start the next step earlier);
- then every rank runs the ZeRO-1 gradient sync (reduce-scatter of gradients + all-gather of the updated
  parameters over all W ranks, ring formula) and its 1/W share of the optimizer update. With the deepspeed
  engine the sync is not overlapped with backward here (DeepSpeed can overlap part of it), which makes the
  per-step cost an upper bound and penalises methods that take more steps, as the paper describes for bucket
  parallel; the ddp engine's bucketed all-reduce overlaps the last backwards of every busy group
  (:func:`exposed_sync_groups_s`).

The ideal bound runs every sample at its best per-GPU efficiency from the truth table (Eq. 1 optimum with
minimal recompute, Algorithm 1), with no idle time and no synchronisation: ``tokens / (sum_i GPU-s_i / W)``.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dcp.config import PEER_METHODS, DCPConfig
from dcp.planner.analytic import GRAD_BUCKET_MIB, HardwareSpec, grad_sync_time_s, optimizer_step_time_s
from dcp.planner.assemble import plan_epoch
from dcp.planner.cost import memory_row, micro_batch_mem_bytes, row_lookup
from dcp.planner.intra import best_settings, candidate_settings
from dcp.planner.plan import StepPlan
from dcp.planner.slots import zero3_step_s
from dcp.planner.stream import TimeLookup, seq_groups_of
from dcp.planner.syncend import backward_share
from dcp.planner.table import ProfileTable
from dcp.planner.tokens import best_token_pack


class SimulationError(ValueError):
    """The simulation cannot run as asked; the message says why and how to fix it."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StepResult:
    """Simulated cost of one optimizer step."""

    step: int
    """Step index in the epoch."""
    compute_time_s: float
    """Slowest SP group's accumulated micro-batch time (the compute phase)."""
    sync_time_s: float
    """The step's gradient sync over all ranks (all-reduce, or ZeRO-1 reduce-scatter + all-gather), the part
    the compute phase does not hide: all of it for the deepspeed engine; for the ddp engine, which starts
    each bucket inside the backward of a rank's last micro-batch, what is left after the groups' last
    backwards (:func:`exposed_sync_groups_s`)."""
    optimizer_time_s: float
    """Each rank's 1/W share of the Adam update."""
    tokens: int
    """Tokens trained in the step."""
    samples: int
    """Samples trained in the step."""
    idle_gpu_s: float
    """GPU-seconds idle in the compute phase: sum over groups of p_i * (T* - g_i T_i), idle ranks fully."""
    idle_ratio_batch: float
    """Paper's per-batch form: mean over busy groups of (T* - g_i T_i) / T*."""
    peak_mem_bytes: float
    """Largest predicted memory of any micro-batch of the step (Eq. 6)."""
    group_idle_s: tuple[tuple[int, int, float], ...] = ()
    """(first_rank, sp_size, idle seconds) of every SP group: T* minus its accumulated time."""
    control_time_s: float = 0.0
    """The runtime's control plane in this step: its host time and its collectives besides the gradient
    sync (dcp.sim.control), on the critical path of every rank."""

    @property
    def step_time_s(self) -> float:
        return self.compute_time_s + self.sync_time_s + self.optimizer_time_s + self.control_time_s


@dataclass(kw_only=True, slots=True, frozen=True)
class SimResult:
    """One simulated epoch: throughput, idleness and the ideal bound."""

    method: str
    """Planning method."""
    world_size: int
    """Simulated GPUs."""
    num_steps: int
    """Optimizer steps of the epoch."""
    num_samples: int
    """Samples trained (every sample exactly once)."""
    tokens: int
    """Tokens trained."""
    total_time_s: float
    """Sum of step times (compute + sync + optimizer)."""
    compute_time_s: float
    """Sum of compute phases."""
    sync_time_s: float
    """Sum of gradient syncs and optimizer updates."""
    tokens_per_s: float
    """Throughput of the whole cluster."""
    idle_ratio: float
    """GPU-weighted idle fraction of the compute phases: idle GPU-s / (W * compute_time_s)."""
    idle_ratio_batch: float
    """Paper's per-batch idle ratio, averaged over steps weighted by compute time."""
    ideal_tokens_per_s: float
    """Throughput if every sample ran at its best per-GPU efficiency, no idle, no sync."""
    ideal_fraction: float
    """tokens_per_s / ideal_tokens_per_s (<= 1)."""
    idle_ratio_per_rank: tuple[float, ...]
    """Per GPU: its idle seconds in compute phases / compute_time_s (mean over ranks = idle_ratio)."""
    peak_mem_bytes: float
    """Largest predicted per-rank memory of any micro-batch."""
    mem_violations: int
    """Steps holding a micro-batch whose predicted memory exceeds the capacity (0 for a sound planner)."""
    plan_time_s: float
    """Wall time the planner took for the epoch."""
    control_time_s: float = 0.0
    """Sum of the steps' control-plane time (dcp.sim.control), part of total_time_s and of sync_time_s."""
    micro_batches_by_sp: tuple[tuple[int, int], ...] = ()
    """(sp_size, micro-batches run at it) over the epoch, sizes ascending (layouts: dcp.planner.layout)."""
    longest_sample_sp: int = 0
    """SP size of the micro-batch holding the epoch's longest sample."""

    @property
    def control_plane_share(self) -> float:
        """Share of the epoch's time the runtime's control plane takes."""
        return self.control_time_s / self.total_time_s if self.total_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def stronger_bucket(results: dict[str, SimResult]) -> str | None:
    """Which of 'bucket' (Open-Sora's rule) and 'bucket-search' (its searched reference time) in ``results``
    has the higher tokens/s: the baseline DCP's speedups are reported against (None: neither was run)."""
    return max((m for m in ("bucket", "bucket-search") if m in results),
               key=lambda m: results[m].tokens_per_s, default=None)


def ideal_tokens_per_s(lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, *,
                       two_d: bool = False) -> float:
    """Every sample at the best b*s/(p*T) of its seq_group (minimal recompute), perfectly packed on W GPUs;
    with advanced.micro_batch_tokens on (1D), a seq_group's samples in token packs where those cost less."""
    cfg = config.planning
    best = best_settings(table, mem_capacity_bytes=cfg.mem_capacity_bytes, sp_sizes=cfg.sp_sizes,
                         world_size=world_size, ranks_per_node=cfg.ranks_per_node, dynamic_recompute=True)
    arr, groups = seq_groups_of(lengths, table)
    times = TimeLookup(table)
    packs = None
    if config.advanced.micro_batch_tokens != "off" and not two_d:
        packs = candidate_settings(table, mem_capacity_bytes=cfg.mem_capacity_bytes, sp_sizes=cfg.sp_sizes,
                                   world_size=world_size, ranks_per_node=cfg.ranks_per_node, dynamic_recompute=True)
    gpu_s = 0.0
    for g in sorted(set(groups.tolist())):
        if g not in best:
            raise SimulationError(
                f"seq_group {g} (<= {table.seq_group_edges[g]} tokens) has no setting that fits "
                f"{cfg.mem_capacity_gib} GiB with sp_sizes {list(cfg.sp_sizes)} on {world_size} GPUs: "
                "allow larger SP sizes, more memory, or drop those samples"
            )
        s = best[g]
        # each sample at its own length (the runtime pads only to a micro-batch's longest sample)
        per_mb = times.padded_times_s(g, s.sp_size, s.recompute_layers, s.micro_batch_size, arr[groups == g])
        g_s = float(per_mb.sum()) * s.sp_size / s.micro_batch_size
        if packs is not None:  # advanced.micro_batch_tokens: token packs of the group's samples where cheaper
            lens = arr[groups == g]
            pick, per_token = best_token_pack(times, s, packs.get(g, []), lens)
            if pick is not None:
                g_s = min(g_s, per_token * float(lens.sum()))
        gpu_s += g_s
    return float(arr.sum()) * world_size / gpu_s


def _mem_row(mb, sp_size: int, rows: dict, edges: Sequence[int]):
    """The table row bounding a micro-batch's memory.

    - Samples of one length (2D: one shape per micro-batch): its seq_group at the smallest profiled b >= its
      size.
    - Samples of unequal lengths (1D; a sample-count or a token-packed micro-batch): the runtime runs them as one
      row of documents, whose activations grow with the tokens, so the row of its seq_group with the smallest
      b whose b x bound holds its tokens (the planner's token-pack rule, ``dcp.planner.tokens``); the
      size rule when none does.
    - A packed micro-batch of the ``packed`` baseline (seq_group -1): one sequence of its total tokens,
      bounded by that length at b = 1."""
    if mb.seq_group >= 0:
        group, size = mb.seq_group, mb.size
    else:
        group, size = bisect.bisect_left(edges, mb.tokens), 1
    one_length = mb.seq_group < 0 or min(mb.seq_lens, default=0) == max(mb.seq_lens, default=0)
    return memory_row(rows.get((group, sp_size), []), size, mb.tokens, one_length)


DDP_BUCKET_BYTES = GRAD_BUCKET_MIB * 2**20
"""The ddp engine's gradient bucket: the last one starts after backward."""


def exposed_sync_s(sync_s: float, overlap_s: float, grad_bytes: float) -> float:
    """What is left of a gradient all-reduce of ``sync_s`` when it runs alongside ``overlap_s`` of backward
    (the slowest group's last one: the other ranks' buckets wait for its buckets): the rest after the
    overlap, and never less than the last bucket, which can only start once that backward ends."""
    last_bucket = sync_s * min(1.0, DDP_BUCKET_BYTES / grad_bytes) if grad_bytes > 0 else sync_s
    return max(last_bucket, sync_s - overlap_s)


def exposed_sync_groups_s(sync_s: float, ends_s: np.ndarray, last_backward_s: np.ndarray, grad_bytes: float) -> float:
    """What is left of a gradient all-reduce of ``sync_s`` after a step whose busy groups end at ``ends_s``, each
    after a last backward of ``last_backward_s``. Every rank's buckets take part in every all-reduce, so a
    bucket's all-reduce starts once the LAST rank has produced it: the buckets of a group come ready evenly over
    its last backward [end - backward, end], and n buckets of sync / n each run one after another, so the sync
    ends at max_i (max_g (end_g - backward_g (1 - (i + 1) / n)) + (n - i) sync / n), at least the slowest
    group's end + one bucket. A group that ends a little before the slowest one after a short last backward
    holds the early buckets back (the slowest group's backward alone, :func:`exposed_sync_s`, would hide
    them). Idle ranks' zero gradients are ready at once."""
    if not len(ends_s):
        return sync_s
    n = max(1, round(grad_bytes / DDP_BUCKET_BYTES)) if grad_bytes > 0 else 1
    x = (np.arange(n) + 1.0) / n
    ready = (ends_s[:, None] - last_backward_s[:, None] * (1.0 - x[None, :])).max(axis=0)
    t_star = float(ends_s.max())
    done = float((ready + (n - np.arange(n)) * sync_s / n).max())
    return max(done, t_star + sync_s / n) - t_star


def step_cost(plan: StepPlan, times: TimeLookup | None, rows: dict, *, sync_s: float, optimizer_s: float,
              edges: Sequence[int] = (), overlap_grad_bytes: float = 0.0, control_s: float = 0.0,
              engine: str = "ddp") -> StepResult:
    """Cost of one StepPlan; ``times`` re-times micro-batches from a truth table (None: planner's times),
    each from its samples' real lengths (TimeLookup.lengths_time_s, as the planner prices them); ``rows``:
    :func:`row_lookup` of the table. ``overlap_grad_bytes`` > 0 (the ddp engine, that many gradient bytes) overlaps the sync with the
    backwards of the groups' last micro-batches (:func:`exposed_sync_groups_s`); 0 leaves it all exposed.
    ``engine`` "fsdp2-zero3": :func:`zero3_step_s` (the ranks in lockstep per micro-batch slot)."""
    group_times: list[float] = []
    slot_times: list[list[float]] = []
    first_forward: list[float] = []  # per busy group: its first micro-batch's forward (fsdp2 gathers under it)
    last_backward: list[float] = []
    peak = 0.0
    for g in plan.groups:
        t = t_mb = 0.0
        row, r = None, g.recompute_layers
        slot_times.append([])
        for mb in g.micro_batches:
            r = g.recompute_of(mb)  # each micro-batch at its own r (``StepPlan.mb_recompute_layers``)
            if times is not None and mb.seq_group >= 0:
                t_mb = times.lengths_time_s(mb.seq_group, g.sp_size, r, mb.seq_lens)
            else:
                t_mb = mb.time_s
            t += t_mb
            slot_times[-1].append(t_mb)
            row = _mem_row(mb, g.sp_size, rows, edges)
            if len(slot_times[-1]) == 1:
                first_forward.append(t_mb * (1.0 - backward_share(row, r)) if row is not None else 0.0)
            if row is not None:  # memory is per micro-batch: its activations are freed after its backward
                peak = max(peak, micro_batch_mem_bytes(row, r))
        group_times.append(t)
        last_backward.append(t_mb * backward_share(row, r) if row is not None else 0.0)
    t_star = max(group_times, default=0.0)
    if engine == "fsdp2-zero3":
        layers = next((rs[0].num_layers for rs in rows.values() if rs), 1)
        t_star, sync_s = zero3_step_s(slot_times, sync_s, layers)
    elif overlap_grad_bytes > 0 and group_times:
        busy_g = [i for i, g in enumerate(plan.groups) if g.micro_batches]
        ends, backs = np.asarray([group_times[i] for i in busy_g]), np.asarray([last_backward[i] for i in busy_g])
        if engine == "fsdp2":
            # one round each: the reduce-scatter under the last backward (per layer, as ddp's buckets), the
            # all-gather under the first forward (prefetched per layer; the first layer's is not hidden)
            layers = next((rs[0].num_layers for rs in rows.values() if rs), 1)
            gather = max(sync_s / 2 / layers, sync_s / 2 - min(first_forward, default=0.0))
            # (a reduce-scatter per layer unit: the layers are its buckets)
            sync_s = exposed_sync_groups_s(sync_s / 2, ends, backs, layers * DDP_BUCKET_BYTES) + gather
        else:
            sync_s = exposed_sync_groups_s(sync_s, ends, backs, overlap_grad_bytes)
    per_group = tuple((g.first_rank, g.sp_size, t_star - t) for g, t in zip(plan.groups, group_times, strict=True))
    idle = sum(p * i for _, p, i in per_group)
    busy = [t for g, t in zip(plan.groups, group_times, strict=True) if g.micro_batches]
    batch = sum(t_star - t for t in busy) / (len(busy) * t_star) if busy and t_star > 0 else 0.0
    return StepResult(step=plan.step, compute_time_s=t_star, sync_time_s=sync_s, optimizer_time_s=optimizer_s,
                      tokens=plan.tokens, samples=plan.samples, idle_gpu_s=idle, idle_ratio_batch=batch,
                      peak_mem_bytes=peak, group_idle_s=per_group, control_time_s=control_s)


def merge_phases(steps: list[StepResult]) -> list[StepResult]:
    """One StepResult per optimizer step: consecutive results of the same step index are phases of it (a peer's
    step, ``dcp.planner.peers``) that run one after another, each as long as its slowest group, with the step's
    gradient sync and optimizer update once, after the last phase (whose own sync and update are kept)."""
    out: list[StepResult] = []
    for st in steps:
        prev = out[-1] if out else None
        if prev is None or prev.step != st.step:
            out.append(st)
            continue
        compute = prev.compute_time_s + st.compute_time_s
        batch = ((prev.idle_ratio_batch * prev.compute_time_s + st.idle_ratio_batch * st.compute_time_s) / compute
                 if compute > 0 else 0.0)
        idle: dict[tuple[int, int], float] = {}
        for first, size, s_idle in prev.group_idle_s + st.group_idle_s:  # per rank block, summed over phases
            idle[(first, size)] = idle.get((first, size), 0.0) + s_idle
        out[-1] = StepResult(step=st.step, compute_time_s=compute, sync_time_s=st.sync_time_s,
                             optimizer_time_s=st.optimizer_time_s, tokens=prev.tokens + st.tokens,
                             samples=prev.samples + st.samples, idle_gpu_s=prev.idle_gpu_s + st.idle_gpu_s,
                             idle_ratio_batch=batch, peak_mem_bytes=max(prev.peak_mem_bytes, st.peak_mem_bytes),
                             group_idle_s=tuple((f, n, v) for (f, n), v in idle.items()),
                             control_time_s=st.control_time_s)  # one step, one agreement exchange
    return out


def simulate(lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, *,
             hardware: HardwareSpec | None, truth_table: ProfileTable | None = None, epoch: int = 0,
             return_steps: bool = False, shapes: Sequence[tuple[int, int]] | None = None,
             control_plane: bool | None = None) -> SimResult | tuple[SimResult, list[StepResult]]:
    """Plan one epoch with the real planner and simulate it.

    ``hardware`` gives the per-step gradient sync and optimizer time (``None``: zero, for tables whose
    T_C already includes them). ``truth_table`` (default: ``table``) times the micro-batches. ``shapes``
    ((frames, spatial tokens) per sample, 2D data) goes to the planner, which then keeps one shape per
    micro-batch (a 2D collate pads T and S separately). ``control_plane`` charges every step the runtime's
    control plane (dcp.sim.control: measured host time, priced collectives, at config.runtime.log_every);
    None: charged when ``hardware`` is given and has no step_overhead_s of its own (the CPU model's
    measured per-step overhead already holds the runtime's host time).
    """
    if world_size < 1:
        raise SimulationError(f"world_size ({world_size}) must be >= 1: pass the number of simulated GPUs")
    if not len(lengths):
        raise SimulationError("lengths (empty) must hold at least one sample: pass a non-empty length list")
    truth = truth_table or table
    t0 = time.perf_counter()
    if config.planning.method in PEER_METHODS:
        from dcp.planner.peers import plan_peer_epoch

        plans = plan_peer_epoch(lengths, table, config, world_size, epoch, shapes=shapes)
    else:
        plans = plan_epoch(lengths, table, config, world_size, epoch, shapes=shapes)
    plan_s = time.perf_counter() - t0
    model = config.model
    sync = grad_sync_time_s(model, hardware, world_size) if hardware else 0.0
    # The framework's own per-step time (manager step start, collation, engine bookkeeping) rides with the update.
    opt = optimizer_step_time_s(model, hardware, world_size) + hardware.step_overhead_s if hardware else 0.0
    if control_plane is None:
        control_plane = hardware is not None and hardware.step_overhead_s == 0
    control = 0.0
    if control_plane and hardware is not None:
        from dcp.sim.control import control_plane_s

        rt = config.runtime
        control = control_plane_s(world_size, hardware, log_every=rt.log_every,
                                  stats_every=config.advanced.stats_every)
    times = TimeLookup(truth) if truth_table is not None else None
    rows = row_lookup(truth)
    # the ddp engine overlaps the gradient all-reduce with the last backward (dcp.runtime.engines), fsdp2 its
    # reduce-scatter with the last backward and its all-gather with the first forward; deepspeed's ZeRO-1
    # reduces after the last backward
    overlap = model.num_params * model.param_bytes if config.runtime.engine in ("ddp", "fsdp2") and hardware else 0.0
    steps = merge_phases([step_cost(p, times, rows, sync_s=sync, optimizer_s=opt, edges=truth.seq_group_edges,
                                    overlap_grad_bytes=overlap, control_s=control, engine=config.runtime.engine)
                         for p in plans])
    seen = sum(s.samples for s in steps)
    if seen != len(lengths):
        raise SimulationError(
            f"planner placed {seen} samples of {len(lengths)}: every sample must be trained exactly once; "
            "this is a planner bug, report it with the length file"
        )
    by_sp: dict[int, int] = {}
    longest = (-1, 0)  # (tokens, sp_size)
    for plan in plans:
        for g in plan.groups:
            by_sp[g.sp_size] = by_sp.get(g.sp_size, 0) + len(g.micro_batches)
            for mb in g.micro_batches:
                longest = max(longest, (max(mb.seq_lens, default=0), g.sp_size))
    compute = sum(s.compute_time_s for s in steps)
    total = sum(s.step_time_s for s in steps)
    tokens = sum(s.tokens for s in steps)
    idle = sum(s.idle_gpu_s for s in steps)
    tps = tokens / total if total > 0 else 0.0
    rank_idle = [0.0] * world_size
    for st in steps:
        for first, size, idle_s in st.group_idle_s:
            for r in range(first, first + size):
                rank_idle[r] += idle_s
    ideal = ideal_tokens_per_s(lengths, truth, config, world_size, two_d=shapes is not None)
    cap = config.planning.mem_capacity_bytes
    result = SimResult(
        method=config.planning.method,
        world_size=world_size,
        num_steps=len(steps),
        num_samples=seen,
        tokens=tokens,
        total_time_s=total,
        compute_time_s=compute,
        sync_time_s=total - compute,
        tokens_per_s=tps,
        idle_ratio=idle / (world_size * compute) if compute > 0 else 0.0,
        idle_ratio_batch=sum(s.idle_ratio_batch * s.compute_time_s for s in steps) / compute if compute > 0 else 0.0,
        idle_ratio_per_rank=tuple(x / compute if compute > 0 else 0.0 for x in rank_idle),
        ideal_tokens_per_s=ideal,
        ideal_fraction=tps / ideal if ideal > 0 else 0.0,
        peak_mem_bytes=max((s.peak_mem_bytes for s in steps), default=0.0),
        mem_violations=sum(1 for s in steps if s.peak_mem_bytes > cap),
        plan_time_s=plan_s,
        control_time_s=sum(s.control_time_s for s in steps),
        micro_batches_by_sp=tuple(sorted(by_sp.items())),
        longest_sample_sp=longest[1],
    )
    return (result, steps) if return_steps else result
