"""One rank's side of a sweep: profile once per (model, W), then run every dataset x method and measure.

``run_group(rank, world_size, runs, info)`` is called on every rank of a process group (spawned CPU
processes or torchrun ranks). For each run it builds the model, takes the profile table (cached, or
measured once per (model, W) for the whole group), and hands the run to an executor
(``dcp.experiments.execute``: dcp's manager by default) that trains ``warmup_steps + steps`` optimizer
steps and returns, per measured step, every rank's busy time and the step's wall time next to the
plan's predictions. Rank 0 turns those into runs.csv / steps.csv rows (``dcp.experiments.results``)
and prints one progress line per run; other ranks return None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp.experiments.execute import build_model, execute_direct, execute_manager, step_record
from dcp.experiments.results import group_busy_s, summarize_run, write_results
from dcp.experiments.sweep import RunSpec

__all__ = ["GroupInfo", "run_group", "step_record"]

GIB = 1024**3


@dataclass(kw_only=True, slots=True, frozen=True)
class GroupInfo:
    """Facts shared by every run of one process group, fixed by the launcher."""

    git_sha: str
    """Commit of the code that ran."""
    stamp: str
    """The sweep launch's timestamp; run ids are <stamp>-<index>."""
    first_index: int
    """Index (in the whole sweep) of this group's first run, for progress lines and run ids."""
    total: int
    """Runs in the whole sweep."""
    indices: tuple[int, ...] = ()
    """Index in the whole sweep of each run given to run_group (a resumed sweep skips finished runs); empty:
    first_index, first_index + 1, ..."""
    out_dir: str = ""
    """Results folder rank 0 appends each finished run's rows to as soon as it ends (a later failure keeps
    them); empty: the caller writes the returned outcomes."""


def run_group(rank: int, world_size: int, runs: list[RunSpec], info: GroupInfo) -> list[dict[str, Any]] | None:
    """Execute ``runs`` (same world size) on this rank; rank 0 returns one outcome dict per run."""
    import torch
    import torch.distributed as dist

    from dcp.runtime.registry import SPGroupRegistry

    if any(r.world_size != world_size for r in runs):
        raise ValueError(
            f"runs with world sizes {sorted({r.world_size for r in runs})} were given to a group of {world_size} "
            "ranks: the launcher must group runs by world size"
        )
    device = _device(runs[0].sweep.device)
    if device.type == "cpu":
        torch.set_num_threads(runs[0].sweep.threads_per_rank)
        if runs[0].sweep.pin_cpus:
            _pin(rank, runs[0].sweep.threads_per_rank)
    registries: dict[tuple, Any] = {}
    tables: dict[Any, Any] = {}
    outcomes = []
    bar = None
    for i, run in enumerate(runs):
        cfg = run.config
        sizes = tuple(p for p in cfg.planning.sp_sizes if p <= world_size)
        key = (cfg.planning.ranks_per_node, sizes)
        if key not in registries:
            # new_group is a collective over the world: every rank builds registries in the same order
            registries[key] = SPGroupRegistry.for_config(cfg, world_size, sizes)
        model = build_model(run.model, device)
        table = _table(model, cfg, rank, world_size, registries[key], tables, run.sweep.refresh_profile)
        if rank == 0 and bar is None:  # after the first profile, whose own bar has closed
            from tqdm.auto import tqdm

            # runs of the whole sweep (this group continues where the previous one stopped); a line per run above it
            bar = tqdm(total=info.total, initial=info.first_index, desc="sweep runs", unit="run", dynamic_ncols=True)
        t0 = time.perf_counter()
        execute = execute_manager if run.sweep.executor == "manager" else execute_direct
        steps, extra = execute(run, rank, world_size, device, registries[key], table, model)
        wall = time.perf_counter() - t0
        dist.barrier()
        if bar is None:
            continue
        index = info.indices[i] if info.indices else info.first_index + i
        run_id = f"{info.stamp}-{index:03d}"
        update = profiled_update_s(table)
        for s in steps:
            s["run_id"] = run_id
            s["profiled_update_time_s"] = "" if update is None else update
        outcome = _run_row(run, run_id, info, steps, extra, wall)
        outcomes.append({"run": outcome, "steps": _step_rows(run, run_id, steps),
                         "config": {**_config_doc(run), **load_doc(table, outcome["load_avg_1m"])}})
        if info.out_dir:
            save_outcomes(info.out_dir, run.sweep.to_dict(), outcomes[-1:])
        bar.write(
            f"[{index + 1}/{info.total}] {run.label}: {outcome['tokens_per_s']:.0f} tok/s, "
            f"step {outcome['step_time_s']:.3f}s (pred {outcome['predicted_step_time_s']:.3f}s), "
            f"idle {outcome['idle_ratio']:.2f} (pred {outcome['predicted_idle_ratio']:.2f}), {wall:.1f}s"
        )
        bar.update()
    if bar is not None:
        bar.close()
    return outcomes if rank == 0 else None


def save_outcomes(out_dir: str | Path, sweep: dict[str, Any], outcomes: list[dict[str, Any]]) -> None:
    """Append finished runs' rows to out_dir's runs.csv / steps.csv and their configs to config.json."""
    write_results(out_dir, [o["run"] for o in outcomes], [row for o in outcomes for row in o["steps"]],
                  sweep=sweep, run_configs={o["run"]["run_id"]: o["config"] for o in outcomes})


def _table(model: Any, cfg: Any, rank: int, world_size: int, registry: Any, memo: dict, refresh: bool) -> Any:
    """The profiler's table for (model, W): cached in cfg.profiling.cache_dir, else profiled now and cached.

    Rank 0 alone reads the cache and broadcasts what it found (ranks on other nodes may not see the same
    folder; a rank profiling while another reads a hit would hang in the profiler's collectives). A stale
    cache (other memory capacity, seq_groups, dcp version, ...) is re-profiled and replaced, since a sweep
    definition is the source of truth; ``refresh`` profiles even on a hit. Memoised per cache key for the
    rest of the group.
    """
    import torch.distributed as dist

    from dcp.profiler import cache
    from dcp.profiler.dual_layer import cache_key_for, profile_table

    key = cache_key_for(model, cfg, world_size)
    if key in memo:
        return memo[key]
    found = [None, "refresh"]
    if rank == 0 and not refresh:
        look = cache.lookup(cfg.profiling.cache_dir, key)
        found = [look.table if look.status == "hit" else None, look.status]
    dist.broadcast_object_list(found, src=0)
    table, status = found
    t0 = time.perf_counter()
    if table is None:
        table = profile_table(model, cfg, world_size=world_size, rank=rank, registry=registry, progress=rank == 0)
        path = cache.store(table, cfg.profiling.cache_dir, key, rank=rank)
    if rank == 0:
        what = "cached" if status == "hit" else f"{status} cache: profiled in {time.perf_counter() - t0:.1f}s, stored"
        print(f"profile {cfg.model.name} W={world_size}: {what} ({len(table)} rows, "
              f"{cache.cache_path(cfg.profiling.cache_dir, key) if status == 'hit' else path})", flush=True)
    memo[key] = table
    return table


def pinned_cpus(rank: int, threads: int, cores: int) -> set[int]:
    """Cores of ``rank`` under sweep.pin_cpus: ``threads`` consecutive cores from rank * threads, mod cores."""
    return {(rank * threads + i) % cores for i in range(min(threads, cores))}


def _pin(rank: int, threads: int) -> None:
    if not hasattr(os, "sched_setaffinity"):  # macOS, Windows
        if rank == 0:
            print("note: sweep.pin_cpus is not supported on this OS (no sched_setaffinity); ranks are not pinned",
                  flush=True)
        return
    os.sched_setaffinity(0, pinned_cpus(rank, threads, os.cpu_count() or 1))


def profiled_update_s(table: Any) -> float | None:
    """Gradient all-reduce + optimizer update per step measured with the profile (None: not measured)."""
    extra = table.meta.extra or {}
    if "grad_sync_s" not in extra or "optimizer_step_s" not in extra:
        return None
    return float(extra["grad_sync_s"]) + float(extra["optimizer_step_s"])


def _device(kind: str) -> Any:
    import torch

    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def load_doc(table: Any, run_load: float) -> dict:
    """The host's 1-minute load average when the run ended and when its profile was taken (None where the
    table does not record it): a CPU profile taken under other load than the run misprices it
    (``dcp bench simulator`` prints both)."""
    prof = (table.meta.extra or {}).get("load_avg_1m")
    return {"load_avg_1m": None if run_load != run_load else round(float(run_load), 2),
            "profile_load_avg_1m": None if prof is None else float(prof)}


def _run_row(run: RunSpec, run_id: str, info: GroupInfo, steps: list[dict], extra: dict, wall: float) -> dict:
    summary = summarize_run(steps, run.config.planning.tokens_per_step)  # target 0: unset, each method its own
    return {
        "run_id": run_id,
        "git_sha": info.git_sha,
        "config_hash": run.config_hash(),
        "sweep": run.sweep.name,
        "method": run.method,
        "model": run.model,
        "dataset": run.dataset,
        "world_size": run.world_size,
        "device": run.sweep.device,
        **summary,
        "peak_mem_gib": extra["peak_mem_bytes"] / GIB,
        "mem_meter": extra["mem_meter"],
        "predicted_peak_mem_gib": extra["predicted_peak_mem_bytes"] / GIB,
        "profile_source": extra["profile_source"],
        "executor": extra["executor"],
        "wall_s": wall,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        "timestamp": info.stamp,
    }


def _step_rows(run: RunSpec, run_id: str, steps: list[dict]) -> list[dict]:
    rows = []
    for s in steps:
        groups = s["groups"]
        busy = group_busy_s(s["busy_s"], [(g["first_rank"], g["sp_size"]) for g in groups])
        base = {k: v for k, v in s.items() if k not in ("groups", "busy_s")}
        for gi, (g, b) in enumerate(zip(groups, busy, strict=True)):
            rows.append({
                **base, "method": run.method, "model": run.model, "dataset": run.dataset,
                "world_size": run.world_size, "group": gi, **g, "measured_group_busy_s": b,
            })
    return rows


def _config_doc(run: RunSpec) -> dict:
    # host_cpus: where W x threads_per_rank exceeds it, ranks time-share cores (dcp bench simulator says so)
    return {"config_hash": run.config_hash(), "label": run.label, "host_cpus": os.cpu_count(), **run.resolved()}
