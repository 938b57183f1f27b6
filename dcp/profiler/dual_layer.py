"""``profile_table``: the dual-layer profiler over every seq_group and candidate (b, p), in parallel.

Phases run per SP size p, ascending. In a phase the W ranks split into the registry's blocks of p
ranks (``SPGroupRegistry``); each block takes its share of the pending seq_groups (round robin) and
runs :class:`~dcp.profiler.search.BatchSearch` on each, measuring every candidate with
:func:`~dcp.profiler.measure.measure_candidate`. Blocks work at the same time on different
candidates; ranks left over when p does not divide W idle for the phase. At the end of a phase every
rank calls ``all_gather_object`` once, so all ranks hold the same rows before deciding what the next
phase profiles (a seq_group that did not fit at b = 1 moves to the next p). The final table is built
from the same gathered rows on every rank, so every rank returns an identical table: the planner then
computes identical plans everywhere.

Collectives inside a phase stay inside one block (the Ulysses all-to-alls, barriers, the group's
agreement on out-of-memory and its MAX of timings); the only world-wide collective is the gather at the
phase end, which every rank reaches exactly once per phase, whatever its block did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from dcp.config import DCPConfig
from dcp.distributed.device import autocast, resolve_precision
from dcp.memory import weight_copy_bytes
from dcp.planner.table import ProfileRow, ProfileTable, TableMeta, engine_state_bytes
from dcp.profiler.adapters import ModelAdapter, get_adapter
from dcp.profiler.cache import CacheKey
from dcp.profiler.clock import resolve_clock
from dcp.profiler.measure import MeasureSettings, measure_candidate
from dcp.profiler.memory import state_bytes
from dcp.profiler.search import (
    BatchSearch,
    assign_round_robin,
    past_heads,
    pending_groups,
    row_fits,
    sp_sizes_to_try,
)
from dcp.runtime.phases import PhaseBoard

# fault(seq_group, micro_batch_size, sp_size) -> None; may raise an out-of-memory error (tests)
FaultFn = Callable[[int, int, int], None]
INF = float("inf")


def hardware_name(device: torch.device) -> str:
    """Cache-key description of the device: GPU name, or CPU architecture and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu-{platform.machine() or 'unknown'}-{os.cpu_count()}cores"


def _module_facts(adapter: ModelAdapter) -> tuple[torch.device, str]:
    p = next(adapter.module.parameters(), None)
    if p is None:
        return torch.device("cpu"), "float32"
    return p.device, str(p.dtype).replace("torch.", "")


def table_precision(adapter: ModelAdapter | Any, config: DCPConfig) -> str:
    """The precision a table for this model and config is measured in: runtime.precision resolved on the
    model's device ('bf16' or 'fp32'); a bf16 module (DeepSpeed's bf16 mode) is measured in bf16."""
    device, dtype = _module_facts(get_adapter(adapter))
    return "bf16" if dtype == "bfloat16" else resolve_precision(config.runtime.precision, device)


def cache_key_for(adapter: ModelAdapter | Any, config: DCPConfig, world_size: int) -> CacheKey:
    """The cache key of profiling ``adapter`` (or a model) with ``config`` on ``world_size`` ranks."""
    from dcp import __version__

    adapter = get_adapter(adapter)
    device, dtype = _module_facts(adapter)
    sizes = sp_sizes_to_try(
        config.planning.sp_sizes, num_heads=adapter.num_heads, world_size=world_size, max_sp_size=adapter.max_sp_size,
        num_kv_heads=adapter.num_kv_heads,
    )
    return CacheKey(
        model=adapter.name,
        model_hash=adapter.config_hash(),
        world_size=world_size,
        hardware=hardware_name(device),
        dtype=dtype,
        precision=table_precision(adapter, config),
        version=__version__,
        seq_group_edges=tuple(config.profiling.seq_group_edges),
        sp_sizes=tuple(sizes),
        max_micro_batch_size=config.profiling.max_micro_batch_size,
        mem_capacity_gib=float(config.planning.mem_capacity_gib),
        clock=resolve_clock(config.advanced.clock, device),
        compile=config.runtime.compile,
    )


def _row(g: int, s: int, b: int, p: int, L: int, m: Any) -> ProfileRow:
    # out of memory on some rank of the group, or over the capacity at r = L: keep the candidate, marked
    if m is None:
        return ProfileRow(
            seq_group=g, seq_len=s, micro_batch_size=b, sp_size=p, t_f_s=INF, t_b_s=INF, m_act_bytes=INF,
            m_inp_bytes=INF, t_const_s=INF, m_const_bytes=INF, num_layers=L, feasible=False,
        )
    values = dataclasses.asdict(m)
    fits = values.pop("fits")
    return ProfileRow(seq_group=g, seq_len=s, micro_batch_size=b, sp_size=p, num_layers=L, feasible=fits, **values)


def _profile_block(
    adapter: ModelAdapter,
    ctx: Any,
    groups: list[int],
    edges: tuple[int, ...],
    settings: MeasureSettings,
    config: DCPConfig,
    fault: FaultFn | None,
    bar: Any,
    board: Any = None,
) -> list[ProfileRow]:
    """The adaptive search of one block over its seq_groups (ascending); same decisions on every rank
    of the block because every decision uses group-agreed measurements."""
    rows: list[ProfileRow] = []
    capacity = config.planning.mem_capacity_bytes
    p, L = ctx.sp_size, adapter.num_layers
    for g in groups:
        s = edges[g]
        search = BatchSearch(
            max_micro_batch_size=config.profiling.max_micro_batch_size,
            capacity_bytes=capacity,
            state_bytes=settings.state_bytes,
        )
        while (b := search.next_b()) is not None:
            hook = (lambda g=g, b=b: fault(g, b, p)) if fault is not None else None
            with _phase(board, f"profiling seq_group {g} (s={s}) b={b} p={p}"):
                m = measure_candidate(adapter, ctx, b, s, settings, fault=hook)
            row = _row(g, s, b, p, L, m)
            search.record(row)
            rows.append(row)
            if bar is not None:
                bar.set_postfix_str(f"s={s} b={b} p={p}{'' if row_fits(row, capacity) else ' (does not fit)'}")
        if bar is not None:
            bar.update(1)  # one (seq_group, p) search done; the phase's end adds the other blocks' searches
        if not search.fits_at_b1:
            # Memory grows with length: the longer seq_groups of this block cannot fit at this p either.
            break
    return rows


def _phase(board: Any, phase: str) -> Any:
    """The board's collective phase (a rank that dies or stalls inside it is named), or nothing at W = 1."""
    return board.collective(phase, comm_only=True) if board is not None else contextlib.nullcontext()


def _gather(rows: list[ProfileRow], world_size: int) -> list[ProfileRow]:
    if world_size == 1:
        return rows
    import torch.distributed as dist

    parts: list[Any] = [None] * world_size
    dist.all_gather_object(parts, rows)
    return [r for part in parts for r in part]


def _world_and_rank(world_size: int | None, rank: int | None) -> tuple[int, int]:
    import torch.distributed as dist

    on = dist.is_available() and dist.is_initialized()
    w = world_size if world_size is not None else (dist.get_world_size() if on else 1)
    r = rank if rank is not None else (dist.get_rank() if on else 0)
    if not 0 <= r < w:
        raise ValueError(f"rank ({r}) must be in [0, world_size={w}): pass torch.distributed.get_rank()")
    if w > 1 and not on:
        raise ValueError(
            f"world_size ({w}) > 1 but torch.distributed is not initialised: call init_process_group on every rank"
        )
    return w, r


def profile_table(
    model: Any,
    config: DCPConfig,
    world_size: int | None = None,
    registry: Any = None,
    *,
    rank: int | None = None,
    adapter: ModelAdapter | None = None,
    progress: bool = True,
    optimizer: torch.optim.Optimizer | None = None,
    grow_only: bool = False,
    fault: FaultFn | None = None,
) -> ProfileTable:
    """Profile ``model`` for every seq_group of ``config.profiling`` on all ``world_size`` ranks.

    Call it on every rank (it is collective). ``world_size`` and ``rank`` default to torch.distributed's
    (1 and 0 without a process group). ``registry`` is the job's SPGroupRegistry (built here if None,
    which is itself collective). ``grow_only`` profiles a seq_group only at the smallest p where
    b = 1 fits; by default larger p are profiled too, because DCP-intra can trade a larger p for less
    recompute. Returns the same table on every rank; the model's gradients and the RNG state are left
    as they were.
    """
    world_size, rank = _world_and_rank(world_size, rank)
    adapter = get_adapter(model) if adapter is None else adapter
    device, dtype = _module_facts(adapter)
    precision, bf16_module = table_precision(adapter, config), dtype == "bfloat16"
    prof = config.profiling
    sizes = sp_sizes_to_try(
        config.planning.sp_sizes, num_heads=adapter.num_heads, world_size=world_size, max_sp_size=adapter.max_sp_size,
        num_kv_heads=adapter.num_kv_heads,
    )
    if registry is None:
        from dcp.runtime.registry import SPGroupRegistry

        registry = SPGroupRegistry.for_config(config, world_size, sizes)
    state = state_bytes(adapter.module, optimizer, optimizer_bytes_per_param=config.model.optimizer_bytes_per_param)
    # measured on the whole model (set_manager profiles an fsdp2 run before sharding); the engine holds its share
    held = engine_state_bytes(float(state.total_bytes), config.model, config.runtime.engine, world_size, precision)
    settings = MeasureSettings(
        warmup_iters=config.advanced.warmup_iters,
        measure_iters=config.advanced.measure_iters,
        meter="allocator" if device.type == "cuda" else "saved",
        capacity_bytes=config.planning.mem_capacity_bytes,
        state_bytes=held,
        seed=config.planning.seed,
        clock=resolve_clock(config.advanced.clock, device),
    )
    from dcp.planner.plan import GroupPlan

    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        # one step per (seq_group, SP size) search, each measuring b = 1, 2, 4, ... while they fit; every
        # block's searches count (rank 0 sees the others' at the end of each SP-size phase)
        bar = tqdm(desc="dual-layer profiling", unit="search", total=len(sizes) * len(prof.seq_group_edges),
                   dynamic_ncols=True)
    searched = 0
    t0 = time.perf_counter()
    rows: list[ProfileRow] = []
    edges = prof.seq_group_edges
    # Profiling inside a training run must not move the run's random streams (output gradients are
    # drawn with randn_like): fork the RNG and restore it afterwards.
    rng = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    # Measured in the run's precision (bf16: autocast over the fp32 module, as the ddp engine runs it; no cast
    # cache across passes, so every layer forward pays and keeps its weight casts as in training).
    amp = contextlib.ExitStack()
    # every rank's phase on the rendezvous store, and a heartbeat: the ranks of an SP group meet in every
    # all-to-all, so a rank killed inside one is told from its peers by its stopped heartbeat (dcp.runtime.phases)
    board = PhaseBoard.for_default_group() if world_size > 1 else None
    try:
        rng.__enter__()
        amp.enter_context(autocast(precision, device, cache=False))
        if board is not None:
            amp.enter_context(board.heartbeat())
        for p in sizes:
            blocks = [first for first, q in registry.blocks if q == p]
            pending = pending_groups(len(edges), rows, p, config.planning.mem_capacity_bytes,
                                 grow_only=grow_only or past_heads(p, adapter.num_heads, adapter.num_kv_heads))
            share = assign_round_robin(pending, len(blocks)) if blocks else []
            mine: list[ProfileRow] = []
            for k, first in enumerate(blocks):
                if first <= rank < first + p and share[k]:
                    # the registry's context: a size past the K/V heads is measured in its context layout
                    ctx = registry.context(GroupPlan(first_rank=first, sp_size=p, recompute_layers=adapter.num_layers,
                                                     micro_batches=()), rank, attention=config.runtime.attention)
                    found = _profile_block(adapter, ctx, share[k], edges, settings, config, fault, bar, board)
                    # one copy per block: its first rank reports, the others hold the same rows
                    mine = found if rank == first else []
            with _phase(board, f"gathering the profile rows of SP size {p}"):
                rows.extend(_gather(mine, world_size))
            searched += len(edges)  # pending ones were searched (or skipped: longer than what fits), the rest fit at a smaller p
            if bar is not None:
                bar.update(searched - bar.n)
                bar.set_postfix_str(f"{len(rows)} rows")
    finally:
        amp.close()
        rng.__exit__(None, None, None)
        if bar is not None:
            bar.close()
    # once-per-step costs (gradient all-reduce, optimizer update) on the same ranks, for the simulator
    from dcp.profiler.update import measure_step_update

    with _phase(board, "profiling the step update (gradient all-reduce, optimizer)"):
        update = measure_step_update(adapter.module, world_size=world_size, optimizer=optimizer,
                                     engine=config.runtime.engine, iters=max(3, config.advanced.measure_iters))
    wall_s = time.perf_counter() - t0
    # The host's 1-minute load average at the end of profiling: on a shared CPU host the rows scale with
    # it, so a table taken under other load than the runs it prices mispredicts them (docs/simulator.md).
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if world_size > 1:
        # every rank reports the slowest rank's wall time (and the highest load it read), so the metadata
        # is identical everywhere
        import torch.distributed as dist

        from dcp.distributed.comm import all_reduce_values

        wall_s, load = all_reduce_values([wall_s, load], dist.ReduceOp.MAX)
    key = cache_key_for(adapter, config, world_size)
    meta = TableMeta(
        model=adapter.name,
        hardware=key.hardware,
        # the parameters' dtype, as in the key; the compute precision is extra["precision"] (and the key's)
        dtype=key.dtype,
        world_size=world_size,
        seq_group_edges=edges,
        version=key.version,
        source="profiled",
        extra={
            "model_hash": key.model_hash,
            "profile_wall_s": round(wall_s, 3),
            "load_avg_1m": None if math.isnan(load) else round(load, 2),
            "state_bytes": held,
            "state_bytes_whole": state.total_bytes,
            "mem_capacity_gib": float(config.planning.mem_capacity_gib),
            "sp_sizes": list(sizes),
            "meter": settings.meter,
            "grad_sync_s": update.grad_sync_s,
            "optimizer_step_s": update.optimizer_step_s,
            "update_engine": config.runtime.engine,
            "precision": precision,
            # autocast's bf16 weight copies in each measured m_act (a bf16 module makes none): with_engine_state
            # takes them out for the fsdp2 engines, which compute on their gathered bf16 parameters
            "weight_copy_bytes": weight_copy_bytes(config.model) if precision == "bf16" and not bf16_module else 0,
            "weight_copies_in_m_act": True,
        },
    )
    return ProfileTable(rows, meta)


def _rank0_lookup(cache_dir: str, key: CacheKey, refresh: bool, world_size: int, rank: int) -> tuple[str, str]:
    """Rank 0 reads the cache and tells everyone: ('hit', csv) | ('miss', '') | ('<ErrorClass>', message).

    Ranks must agree on profiling (it is collective) even when only rank 0 sees the file or a write is
    in flight, so nobody reads the cache but rank 0.
    """
    from dcp.profiler import cache

    out: tuple[str, str] = ("miss", "")
    if rank == 0:
        try:
            found = cache.load_or_refuse(cache_dir, key, refresh=refresh)
            out = ("hit", found.to_csv()) if found is not None else ("miss", "")
        except cache.CacheError as exc:
            out = (type(exc).__name__, str(exc))
    if world_size > 1:
        import torch.distributed as dist

        box: list[Any] = [out]
        dist.broadcast_object_list(box, src=0)
        out = box[0]
    if out[0] not in ("hit", "miss"):
        raise getattr(cache, out[0])(out[1])
    return out


def load_or_profile(
    model: Any,
    config: DCPConfig,
    world_size: int | None = None,
    registry: Any = None,
    *,
    rank: int | None = None,
    adapter: ModelAdapter | None = None,
    refresh: bool = False,
    progress: bool = True,
    optimizer: torch.optim.Optimizer | None = None,
    fault: FaultFn | None = None,
) -> tuple[ProfileTable, str]:
    """The cached table if valid, else profile inside this run and cache it (rank 0 writes).

    Collective: call it on every rank. Returns (table, status), status 'hit' or 'profiled', the same on
    every rank. A stale or corrupt cache raises (``dcp.profiler.cache.StaleCacheError`` /
    ``CorruptCacheError``, on every rank) unless ``refresh``.
    """
    from dcp.profiler import cache

    world_size, rank = _world_and_rank(world_size, rank)
    adapter = get_adapter(model) if adapter is None else adapter
    key = cache_key_for(adapter, config, world_size)
    status, text = _rank0_lookup(config.profiling.cache_dir, key, refresh, world_size, rank)
    if status == "hit":
        return ProfileTable.from_csv(text, text=True), "hit"
    table = profile_table(
        model, config, world_size=world_size, rank=rank, registry=registry, adapter=adapter,
        progress=progress, optimizer=optimizer, fault=fault,
    )
    table = cache.with_key(table, key)
    cache.store(table, config.profiling.cache_dir, key, rank=rank)
    return table, "profiled"


def need_profile(model: Any, config: DCPConfig, world_size: int | None = None, *, refresh: bool = False) -> bool:
    """True when ``config.profiling.cache_dir`` holds no valid table for this model and world size.

    Collective when torch.distributed is initialised (rank 0 decides, everyone gets its answer). Raises
    ``StaleCacheError`` / ``CorruptCacheError`` (ValueErrors telling how to refresh) for a cache that
    exists but cannot be used, unless ``refresh``.
    """
    world_size, rank = _world_and_rank(world_size, None)
    key = cache_key_for(model, config, world_size)
    return _rank0_lookup(config.profiling.cache_dir, key, refresh, world_size, rank)[0] != "hit"
