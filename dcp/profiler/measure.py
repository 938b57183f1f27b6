"""Measure one candidate (seq_len, b, p) on one SP group: the heart of dual-layer profiling.

Two layers of the real model run on a synthetic micro-batch: layer 0 warms up (caches, allocator,
kernels), layer 1 is measured. Per repetition:

1. constant part: ``layer_inputs`` (embedding) forward, ``head_loss`` forward + backward, embedding
   backward -> T_C;
2. layer 0 forward + backward (warm-up, discarded);
3. layer 1 forward with autograd on (what a non-recomputed layer and a recompute both run) -> t_f, then
   its backward from a random output gradient -> t_b;
4. layer 1 again, checkpointed the way the runtime checkpoints (forward, then recompute + backward)
   -> t_ckpt. With ``timing='checkpoint'`` (default) the stored t_f, t_b solve ``t_f + t_b = plain
   layer`` and ``2 t_f + t_b = t_ckpt``, so Eq. 4-5 are exact at r = 0 and r = L: t_f is then the
   marginal cost of one recomputation, checkpoint bookkeeping included (several percent of a small
   layer). ``timing='plain'`` keeps the paper's raw forward and backward times.

Each timed region is read with ``settings.clock`` (dcp.profiler.clock): by default ``wall``, on CUDA too (a
synchronised wall-clock span); ``pipelined`` reads the region's cost with the GPU queue pre-filled as inside a
whole model, max(host enqueue, GPU time).

Memory comes from one metered pass before the timed ones (so a candidate that does not fit stops before
any timing). With the saved-tensor meter (CPU):

- m_inp = bytes of layer 1's input (what a checkpointed layer keeps);
- m     = unique bytes layer 1 saves for backward, its input, the parameters and the aux values excluded;
- M_C   = parameters + gradients + optimizer state + what the embedding saves + the aux values the layer
          saves (shared by all layers, counted once) + max(what the head saves, m): during backward of a fully recomputed model the head's saved
          tensors are freed before the first layer recomputes, and one recomputed layer's m is alive at a
          time, so the peak of the step is ``L * m_inp + M_C`` (Eq. 6 at r = L).

With the allocator meter (CUDA) the same quantities come from ``memory_allocated`` differences and the
transient peaks of the head and of one layer's forward + backward.

Inside an SP group every rank runs the same shapes, so all ranks meet every collective (the Ulysses
all-to-alls) in the same order. Times are the median over repetitions, then the MAX over the group (the
group is as slow as its slowest rank); memory is the MAX over the group too. Using group-agreed values
is what keeps the adaptive search identical on every rank of the group.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dcp.config import CLOCKS
from dcp.distributed.comm import all_reduce_values
from dcp.profiler.adapters import ModelAdapter
from dcp.profiler.clock import RegionClock, resolve_clock
from dcp.profiler.memory import (
    AllocatorMeter,
    SavedTensorMeter,
    free_cached_memory,
    out_of_memory_errors,
    storage_bytes,
    storage_key,
    tensors_in,
)
from dcp.runtime.recompute import checkpoint_layer


@dataclass(kw_only=True, slots=True, frozen=True)
class Measurement:
    """Group-agreed figures of one candidate (per rank)."""

    t_f_s: float
    """Forward time of the measured layer (autograd on)."""
    t_b_s: float
    """Backward time of the measured layer, without its recompute."""
    m_act_bytes: float
    """Bytes the layer keeps for backward beyond its input."""
    m_inp_bytes: float
    """Bytes of the layer's input."""
    t_const_s: float
    """Embedding + head + loss forward and backward."""
    m_const_bytes: float
    """State bytes + embedding/aux bytes + the larger of the head's and one layer's working set."""
    fits: bool = True
    """False when Eq. 6 at r = L exceeds the capacity: memory is measured, times are not (inf)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class MeasureSettings:
    """How to measure: repetitions, meter, capacity and fixed state bytes."""

    warmup_iters: int = 1
    """Untimed repetitions after the metered pass."""
    measure_iters: int = 3
    """Timed repetitions; the median is kept."""
    meter: str = "saved"
    """'saved' (saved-tensor bytes, any device) or 'allocator' (CUDA allocator)."""
    capacity_bytes: float | None = None
    """Emulated capacity for the saved-tensor meter (None: unlimited)."""
    state_bytes: float = 0.0
    """Parameters + gradients + optimizer state of the model (bytes per rank)."""
    seed: int = 0
    """Seed of the synthetic batch (same on every rank of a group: they must see the same batch)."""
    timing: str = "checkpoint"
    """'checkpoint': also time the measured layer checkpointed and store the t_f, t_b that make Eq. 4-5
    exact at r = 0 and r = L (see solve_recompute_cost); 'plain': the paper's plain forward/backward."""
    clock: str = "auto"
    """dcp.profiler.clock: 'auto' (= wall), 'wall' (time.perf_counter between
    syncs), 'pipelined' (CUDA: max of the host's enqueue time and the GPU's time with the queue pre-filled,
    as a layer runs inside a whole model) or 'cpu' (time.process_time of this process: robust on a shared,
    oversubscribed CPU machine, but blind to time spent waiting for communication)."""

    def __post_init__(self) -> None:
        if self.meter not in ("saved", "allocator"):
            raise ValueError(f"MeasureSettings.meter ({self.meter!r}) is not 'saved' or 'allocator': pick one")
        if self.timing not in ("checkpoint", "plain"):
            raise ValueError(f"MeasureSettings.timing ({self.timing!r}) is not 'checkpoint' or 'plain': pick one")
        if self.clock not in CLOCKS:
            raise ValueError(f"MeasureSettings.clock ({self.clock!r}) is not one of {list(CLOCKS)}: pick one")
        if self.measure_iters < 1 or self.warmup_iters < 0:
            raise ValueError(
                f"MeasureSettings.measure_iters ({self.measure_iters}) must be >= 1 and warmup_iters "
                f"({self.warmup_iters}) >= 0: use at least one timed repetition"
            )


def _barrier(ctx: Any) -> None:
    # Start timed regions together: a rank that enters early would otherwise time its wait in the
    # first all-to-all as layer time.
    if ctx.sp_size > 1:
        import torch.distributed as dist

        dist.barrier(group=ctx.group)


def _timed(fn: Callable[[], Any], device: torch.device, ctx: Any, clock: str = "wall") -> tuple[float, Any]:
    """One region timed with ``clock`` 'wall' or 'cpu' (dcp.profiler.clock), the group's barrier first. A
    pipelined region needs a RegionClock that lives across repetitions (it learns how long to hold)."""
    if resolve_clock(clock, device) == "pipelined":
        raise ValueError("_timed times one region with a fresh clock: use a RegionClock for 'pipelined'")
    return _region_clock(clock, device, ctx).time(fn)


def _region_clock(clock: str, device: torch.device, ctx: Any) -> RegionClock:
    # an out-of-memory error in a timed region on one rank is agreed on by the group in that region
    return RegionClock(clock, device, barrier=lambda: _barrier(ctx), agree=lambda values: group_max(values, ctx),
                       failures=out_of_memory_errors())


def group_max(values: list[float], ctx: Any) -> list[float]:
    """Element-wise MAX over the ranks of the SP group (identity for sp_size 1), on the group's backend
    device (CPU for gloo, the rank's GPU for NCCL)."""
    if ctx.sp_size == 1:
        return values
    import torch.distributed as dist

    return all_reduce_values(values, dist.ReduceOp.MAX, ctx.group)


def _device_of(adapter: ModelAdapter) -> torch.device:
    p = next(adapter.module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _ensure_grads(module: torch.nn.Module) -> dict[torch.nn.Parameter, torch.Tensor | None]:
    """Give every trainable parameter a gradient buffer (a training step has them), return the old ones."""
    old = {}
    for p in module.parameters():
        if p.requires_grad:
            old[p] = p.grad
            p.grad = torch.zeros_like(p)
    return old


def _one_pass(adapter: ModelAdapter, batch: Any, ctx: Any, clock: RegionClock) -> dict[str, Any]:
    """Constant part, warm-up layer, measured layer; returns timings and the tensors the meters need."""
    out: dict[str, Any] = {}
    t_embed, (hidden, aux) = clock.time(lambda: adapter.layer_inputs(batch, ctx), "embed")
    x_last = hidden.detach().requires_grad_(True)  # stands in for the last layer's output

    def head() -> None:
        loss, _count = adapter.head_loss(x_last, batch, ctx, aux)
        loss.backward()

    t_head, _ = clock.time(head, "head")
    t_embed_b, _ = clock.time(lambda: hidden.backward(x_last.grad), "embed backward")
    out["t_const_s"] = t_embed + t_head + t_embed_b
    # Layer 0: warm-up, forward and backward like the measured one.
    x0 = hidden.detach().requires_grad_(True)
    y0 = adapter.run_layer(0, x0, aux, ctx)
    y0.backward(torch.ones_like(y0))
    x1 = y0.detach().requires_grad_(True)
    out.update(hidden=hidden, aux=aux, x1=x1)
    return out


def group_all_ok(ok: bool, ctx: Any) -> bool:
    """True only if every rank of the SP group says ok (one all-reduce MIN on the group).

    After an out-of-memory error one rank may want to skip a candidate that the others finished: every
    rank calls this at the same point, success or failure, so the group decides together and no rank is
    left waiting in a collective the others skipped.
    """
    if ctx.sp_size == 1:
        return ok
    import torch.distributed as dist

    return all_reduce_values([1.0 if ok else 0.0], dist.ReduceOp.MIN, ctx.group)[0] > 0


def measure_candidate(
    adapter: ModelAdapter,
    ctx: Any,
    micro_batch_size: int,
    seq_len: int,
    settings: MeasureSettings,
    fault: Callable[[], None] | None = None,
) -> Measurement | None:
    """Dual-layer measurement of (seq_len, b) on the SP group of ``ctx``; None if it ran out of memory,
    ``fits=False`` (memory only) if it cannot fit the capacity even with full recompute.

    Out-of-memory errors (``torch.OutOfMemoryError`` on a GPU, the emulated one on CPU) are caught, the
    memory freed, and the group agrees on the outcome. ``fault`` (tests) runs at the end of the memory
    pass and may raise such an error.

    An OOM that strikes a single rank in a timed region (outside the region's own collectives) is agreed
    on in that region (dcp.profiler.clock.RegionClock), so every rank of the group reports it together.
    Limit: the ranks of a group run identical shapes, so an OOM normally strikes all of them at the same
    operation; one that strikes a single rank *inside* a Ulysses all-to-all leaves its peers waiting in
    that collective until the process group's timeout turns the wait into an error (no silent hang). The model's gradients are restored afterwards, so profiling
    inside a training run leaves no trace.
    """
    if adapter.num_layers < 2:
        raise ValueError(
            f"model num_layers ({adapter.num_layers}) must be >= 2 for dual-layer profiling: "
            "the first layer warms up, the second is measured"
        )
    oom = out_of_memory_errors()
    device = _device_of(adapter)
    resolve_clock(settings.clock, device)  # an impossible clock fails here, before any work
    gen = torch.Generator().manual_seed(settings.seed * 1_000_003 + seq_len * 101 + micro_batch_size)
    batch = adapter.synthetic_batch(micro_batch_size, seq_len, generator=gen)
    if hasattr(batch, "to"):
        batch = batch.to(device)
    params = list(adapter.module.parameters())
    old_grads = _ensure_grads(adapter.module)
    try:
        # Phase 1: memory (the largest footprint of the candidate, so an OOM most likely happens here).
        mem: list[float] | None = None
        try:
            if settings.meter == "allocator":
                mem = _memory_allocator(adapter, batch, ctx, device, settings)
            else:
                mem = _memory_saved(adapter, batch, ctx, device, settings, params)
            if fault is not None:
                fault()  # after the pass's last collective, like an OOM in its final backward
        except oom:
            mem = None
            free_cached_memory()
        # One collective whatever happened: the failure flag and the memory figures, MAX over the group.
        failed, m_act, m_inp, m_const = group_max([float(mem is None)] + (mem or [0.0, 0.0, 0.0]), ctx)
        if failed:
            return None
        full_recompute_bytes = adapter.num_layers * m_inp + m_const  # Eq. 6 at r = L
        if settings.capacity_bytes is not None and full_recompute_bytes > settings.capacity_bytes:
            # Does not fit even with full recompute: no point timing it (the search stops here).
            inf = float("inf")
            return Measurement(t_f_s=inf, t_b_s=inf, t_const_s=inf, m_act_bytes=m_act, m_inp_bytes=m_inp,
                               m_const_bytes=m_const, fits=False)
        # Phase 2: time.
        times: dict[str, list[float]] | None = {"t_f_s": [], "t_b_s": [], "t_ckpt_s": [], "t_const_s": []}
        try:
            _time_passes(adapter, batch, ctx, device, settings, times)
        except oom:
            times = None
            free_cached_memory()
        if not group_all_ok(times is not None, ctx):
            return None
        med = [statistics.median(times[k]) for k in ("t_f_s", "t_b_s", "t_ckpt_s", "t_const_s")]
        t_f_s, t_b_s, t_ckpt_s, t_const_s = group_max(med, ctx)
        if settings.timing == "checkpoint":
            t_f_s, t_b_s = solve_recompute_cost(t_f_s, t_b_s, t_ckpt_s)
        return Measurement(
            t_f_s=t_f_s, t_b_s=t_b_s, t_const_s=t_const_s,
            m_act_bytes=m_act, m_inp_bytes=m_inp, m_const_bytes=m_const,
        )
    finally:
        for p, g in old_grads.items():
            p.grad = g


def solve_recompute_cost(t_f_s: float, t_b_s: float, t_ckpt_s: float) -> tuple[float, float]:
    """(t_f, t_b) that make Eq. 4-5 exact at both ends: r = 0 costs t_f + t_b (a plain layer) and r = L
    costs 2 t_f + t_b = t_ckpt (a checkpointed layer: forward, then recompute + backward).

    t_f becomes the marginal cost of recomputing a layer (its forward plus the checkpoint's
    bookkeeping, which is not negligible for small layers); t_b the rest of a plain layer. If noise makes
    the checkpointed layer look no dearer than a plain one, the plain figures are kept.
    """
    plain = t_f_s + t_b_s
    extra = t_ckpt_s - plain
    if not 0 < extra < plain:
        return t_f_s, t_b_s
    return extra, plain - extra


def _time_passes(
    adapter: ModelAdapter, batch: Any, ctx: Any, device: torch.device, settings: MeasureSettings,
    times: dict[str, list[float]],
) -> None:
    clock = _region_clock(settings.clock, device, ctx)
    for it in range(settings.warmup_iters + settings.measure_iters):
        st = _one_pass(adapter, batch, ctx, clock)
        x1, aux = st["x1"], st["aux"]
        t_f, y1 = clock.time(lambda x1=x1, aux=aux: adapter.run_layer(1, x1, aux, ctx), "forward")
        grad = torch.randn_like(y1)
        t_b, _ = clock.time(lambda y1=y1, grad=grad: y1.backward(grad), "backward")
        del y1
        # The same layer checkpointed the way the runtime does it (forward, then recompute + backward).
        x1c = x1.detach().requires_grad_(True)

        def ckpt(x1c: torch.Tensor = x1c, aux: Any = aux, grad: torch.Tensor = grad) -> None:
            fn = _LayerFn(adapter, 1, aux, ctx)
            checkpoint_layer(fn, x1c, enabled=True).backward(grad)

        t_c, _ = clock.time(ckpt, "checkpointed")
        if it >= settings.warmup_iters:
            times["t_f_s"].append(t_f)
            times["t_b_s"].append(t_b)
            times["t_ckpt_s"].append(t_c)
            times["t_const_s"].append(st["t_const_s"])
        del st, x1, x1c, grad


class _LayerFn:
    """``hidden -> adapter.run_layer(i, hidden, aux, ctx)`` for checkpoint (keeps aux and ctx out of
    the checkpointed arguments)."""

    def __init__(self, adapter: ModelAdapter, i: int, aux: Any, ctx: Any) -> None:
        self.adapter, self.i, self.aux, self.ctx = adapter, i, aux, ctx

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.adapter.run_layer(self.i, hidden, self.aux, self.ctx)


def _memory_saved(
    adapter: ModelAdapter, batch: Any, ctx: Any, device: torch.device, settings: MeasureSettings, params: list
) -> list[float]:
    cap, base = settings.capacity_bytes, settings.state_bytes
    with SavedTensorMeter(exclude=params, capacity_bytes=cap, base_bytes=base) as embed_meter:
        hidden, aux = adapter.layer_inputs(batch, ctx)
    aux_tensors = [t for t in tensors_in(aux)]
    aux_keys = {storage_key(t) for t in aux_tensors}
    embed_b = embed_meter.saved_bytes
    # The head sees the last layer's output; a detached copy of the embedding has the same shape.
    x_last = hidden.detach().requires_grad_(True)
    with SavedTensorMeter(exclude=params, capacity_bytes=cap, base_bytes=base + embed_b) as head_meter:
        loss, _ = adapter.head_loss(x_last, batch, ctx, aux)
    head_saved = dict(head_meter.saved_storages)
    loss.backward()
    del loss
    x0 = hidden.detach().requires_grad_(True)
    with torch.no_grad():
        x1 = adapter.run_layer(0, x0, aux, ctx).detach().requires_grad_(True)
    m_inp = storage_bytes(x1)
    budget = base + embed_b + 2 * m_inp
    with SavedTensorMeter(exclude=params + [x1], capacity_bytes=cap, base_bytes=budget) as layer_meter:
        y1 = adapter.run_layer(1, x1, aux, ctx)
    # Aux values (rotary tables, masks) that the layers save are shared by all of them and alive all step:
    # count them once, in M_C (and not again in the head's share).
    layer_aux = {k: n for k, n in layer_meter.saved_storages.items() if k in aux_keys}
    m_act = layer_meter.saved_bytes - sum(layer_aux.values())
    aux_b = sum(layer_aux.values())
    head_b = sum(n for k, n in head_saved.items() if k not in layer_aux)
    y1.backward(torch.ones_like(y1))
    m_const = base + embed_b + aux_b + max(head_b, m_act)
    return [float(m_act), float(m_inp), float(m_const)]


def eq6_terms(*, m_act: float, head_peak: float, b_work: float, num_layers: int, fixed: float) -> tuple[float, float]:
    """(m, M_C) of Eq. 6 from one layer's kept activations ``m_act``, the head's peak ``head_peak``, a layer
    backward's working bytes ``b_work`` (its output gradient plus transient peak) and ``fixed`` (state,
    embedding, aux).

    Above L * m_inp + fixed, a step peaks at
      r < L: (L - r) * m_act + max(head_peak, b_work)  (a plain layer's m_act is among the kept ones), and
      r > 0: m_act + b_work                            (a recomputed layer rebuilds its m_act in backward);
    the true peak is the max of the two, convex in r. Eq. 6 is linear, (L - r) * m + M_C, so it is made exact
    at r = 0 and r = L (the chord, never below the convex curve in between). Counting the recomputed layer's
    m_act at r = 0 as well over-predicted Transformer-2D by one layer's m_act (7-10 %) on an H100.
    """
    plain_peak = max(head_peak, b_work)
    recompute_peak = m_act + b_work
    m_const = fixed + max(plain_peak, recompute_peak)
    return m_act - max(0.0, recompute_peak - plain_peak) / num_layers, m_const


def _memory_allocator(
    adapter: ModelAdapter, batch: Any, ctx: Any, device: torch.device, settings: MeasureSettings
) -> list[float]:
    # Warm the allocator and kernels once so the metered pass sees steady-state behaviour.
    _one_pass(adapter, batch, ctx, _region_clock("wall", device, ctx))
    with AllocatorMeter(device) as embed_meter:
        hidden, aux = adapter.layer_inputs(batch, ctx)
    # kept = embedding's saved tensors + aux + the embedding output itself (x0, counted in L * m_inp)
    embed_aux_b = embed_meter.kept_bytes - hidden.numel() * hidden.element_size()
    x_last = hidden.detach().requires_grad_(True)
    with AllocatorMeter(device) as head_meter:
        loss, _ = adapter.head_loss(x_last, batch, ctx, aux)
        loss.backward()
        del loss
    head_peak = head_meter.peak_bytes
    x0 = hidden.detach().requires_grad_(True)
    with torch.no_grad():
        x1 = adapter.run_layer(0, x0, aux, ctx).detach().requires_grad_(True)
    m_inp = x1.numel() * x1.element_size()
    with AllocatorMeter(device) as fwd_meter:
        y1 = adapter.run_layer(1, x1, aux, ctx)
    out_b = y1.numel() * y1.element_size()
    m_act = max(0, fwd_meter.kept_bytes - out_b)
    with AllocatorMeter(device) as layer_meter:
        y1.backward(torch.ones_like(y1))
        del y1
    m_act, m_const = eq6_terms(m_act=m_act, head_peak=head_peak, b_work=out_b + max(0, layer_meter.peak_bytes),
                               num_layers=adapter.num_layers,
                               fixed=settings.state_bytes + max(0, embed_aux_b))
    if settings.capacity_bytes is not None and m_const + 2 * m_inp > settings.capacity_bytes:
        raise torch.OutOfMemoryError(
            f"constant memory ({m_const / 2**20:.1f} MiB) exceeds the capacity ({settings.capacity_bytes / 2**20:.1f} MiB)"
        )
    return [float(m_act), float(m_inp), float(m_const)]
