"""``dcp profile``: run the dual-layer profiler on N local processes and cache the table.

Examples::

    dcp profile --model t1d-tiny --nproc 2 --mem-capacity-gib 0.05
    dcp profile --config run.toml --refresh --out profiler/t1d-tiny-w2.csv

The table lands in ``profiling.cache_dir`` (keyed by model config, world size, hardware, dtype, dcp
version); a valid cached table is reused unless ``--refresh``. With ``--nproc N`` > 1 the command
starts N gloo processes on this machine (one thread each). A progress bar runs over the candidates and
a summary prints, per seq_group, the best (b, p, r) under the memory capacity and its predicted time
and memory.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dcp.argtypes import positive_float, positive_int_list, process_count
from dcp.files import check_writable_file

MODELS = ("t1d-tiny", "t2d-tiny")


class ProfileCLIError(ValueError):
    """A ``dcp profile`` flag has a bad value; the message names the flag and the fix."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="t1d-tiny", choices=MODELS, help="reference model to profile")
    parser.add_argument("--config", default=None, help="TOML run config (its [model] fields replace the reference model's)")
    parser.add_argument("--nproc", type=process_count, default=1, help="local gloo processes (the world size W)")
    parser.add_argument("--mem-capacity-gib", type=positive_float, default=None,
                        help="override planning.mem_capacity_gib")
    parser.add_argument("--edges", type=positive_int_list, default=None,
                        help="override profiling.seq_group_edges, e.g. 256,512,1024")
    parser.add_argument("--refresh", action="store_true", help="profile again even if a cached table exists")
    parser.add_argument("--out", default=None, help="also write the table here (.csv, or .parquet with the parquet extra: pyarrow)")
    parser.add_argument("--grow-only", action="store_true", help="profile each seq_group only at its smallest p")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _model_overrides(model_name: str, raw_model: dict[str, Any]) -> dict[str, Any]:
    from dcp.models import build_config

    base = build_config(model_name)
    fields = set(getattr(base, "__dataclass_fields__", {}))
    skip = {"name", "param_bytes", "optimizer_bytes_per_param"}
    return {k: v for k, v in raw_model.items() if k in fields and k not in skip and v != 0}


def resolve(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """(DCPConfig, model overrides) from the flags; the config's model section is the built model's shape."""
    import dataclasses

    from dcp.config import DCPConfig, load_config, read_toml
    from dcp.models import build_config

    if args.nproc < 1:
        raise ProfileCLIError(f"--nproc ({args.nproc}) must be >= 1: pass the number of processes to start")
    config = load_config(args.config) if args.config else DCPConfig()
    overrides: dict[str, Any] = {}
    if args.config:
        overrides = _model_overrides(args.model, read_toml(args.config).get("model", {}))
    model_cfg = build_config(args.model, **overrides)
    planning, profiling = config.planning, config.profiling
    if args.mem_capacity_gib is not None:
        planning = dataclasses.replace(planning, mem_capacity_gib=args.mem_capacity_gib)
    if args.edges:
        edges = args.edges
        if isinstance(edges, str):  # a Namespace built by hand
            try:
                edges = tuple(int(x) for x in edges.split(","))
            except ValueError:
                raise ProfileCLIError(f"--edges ({edges!r}) must be integers separated by commas: e.g. 256,512") from None
        profiling = dataclasses.replace(profiling, seq_group_edges=tuple(edges))
    config = config.replace(model=model_cfg.shape(), profiling=profiling, planning=planning)
    from dcp.profiler.clock import resolve_clock

    resolve_clock(config.advanced.clock, "cpu")  # dcp profile runs CPU processes: fail here, not in each rank
    return config, overrides


def _worker(rank: int, world_size: int, model_name: str, overrides: dict, config: Any, refresh: bool,
            progress: bool, grow_only: bool) -> tuple[str, str, str] | None:
    from dcp.models import build_model
    from dcp.profiler import cache
    from dcp.profiler.dual_layer import _rank0_lookup, cache_key_for, profile_table
    from dcp.runtime.compiled import compile_layers

    model = build_model(model_name, **overrides)
    compile_layers(model, config.runtime.compile)  # the table prices the layers the run executes
    registry = None
    if world_size > 1:
        from dcp.profiler.adapters import get_adapter
        from dcp.profiler.search import sp_sizes_to_try
        from dcp.runtime.registry import SPGroupRegistry

        adapter = get_adapter(model)
        sizes = sp_sizes_to_try(config.planning.sp_sizes, num_heads=adapter.num_heads, world_size=world_size,
                                num_kv_heads=adapter.num_kv_heads)
        registry = SPGroupRegistry.for_config(config, world_size, sizes)
    if grow_only:  # not the cached default search: profile without touching the cache
        table = profile_table(model, config, world_size=world_size, rank=rank, registry=registry,
                              progress=progress, grow_only=True)
        status = "profiled (grow-only, not cached)"
    else:
        # load_or_profile's steps, with --out written before the cache: a cache folder that cannot be
        # written never costs the profiled table (store() also falls back to a temporary folder and says so)
        key = cache_key_for(model, config, world_size)
        found, text = _rank0_lookup(config.profiling.cache_dir, key, refresh, world_size, rank)
        if found == "hit":
            return (text, "hit", str(cache.cache_path(config.profiling.cache_dir, key))) if rank == 0 else None
        table = cache.with_key(profile_table(model, config, world_size=world_size, rank=rank, registry=registry,
                                             progress=progress), key)
        # the cache first (store() falls back to a temporary folder and says so), --out after it (run() writes
        # it, atomically): a failing --out never costs the profiled table
        where = str(cache.store(table, config.profiling.cache_dir, key, rank=rank))
        return (table.to_csv(), "profiled", where) if rank == 0 else None
    return (table.to_csv(), status, "not cached") if rank == 0 else None


def _clock_of(table: Any) -> str:
    from dcp.profiler.cache import KEY_FIELD

    return str((table.meta.extra.get(KEY_FIELD) or {}).get("clock", "unrecorded"))


def summary_lines(table: Any, config: Any, world_size: int) -> list[str]:
    """One line per seq_group: best (b, p, r) under the capacity with predicted time and memory."""
    from dcp.planner import best_settings

    best = best_settings(
        table,
        mem_capacity_bytes=config.planning.mem_capacity_bytes,
        sp_sizes=config.planning.sp_sizes,
        world_size=world_size,
        ranks_per_node=config.planning.ranks_per_node,
        dynamic_recompute=config.planning.method == "dcp-intra",
    )
    lines = [f"{'group':>5} {'seq_len':>7} {'rows':>4} {'b':>3} {'p':>3} {'r':>3} {'time_ms':>9} {'mem_MiB':>9} {'tok/gpu/s':>10}"]
    for g, edge in enumerate(table.seq_group_edges):
        n = len(table.rows_for(g))
        s = best.get(g)
        if s is None:
            lines.append(f"{g:>5} {edge:>7} {n:>4} {'-':>3} {'-':>3} {'-':>3} {'does not fit':>20}")
            continue
        lines.append(
            f"{g:>5} {edge:>7} {n:>4} {s.micro_batch_size:>3} {s.sp_size:>3} {s.recompute_layers:>3} "
            f"{s.time_s * 1e3:>9.2f} {s.mem_bytes / 2**20:>9.1f} {s.tokens_per_gpu_s:>10.0f}"
        )
    return lines


def _fail(exc: BaseException) -> int:
    print(f"dcp profile: error: {str(exc).strip()}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from dcp.planner.table import ProfileTable
    from dcp.profiler.cache import CacheError

    try:
        config, overrides = resolve(args)
        if args.out:
            check_writable_file(args.out, flag="--out")  # before profiling: a bad --out costs nothing
    except (ValueError, OSError) as exc:
        return _fail(exc)
    if args.print_config:
        print(config.to_json())
        return 0
    work = (args.model, overrides, config, args.refresh, not args.quiet, args.grow_only)
    try:
        if args.nproc == 1:
            out = _worker(0, 1, *work)
        else:
            from dcp.distributed.launch import run_distributed

            timeout_s = config.runtime.collective_timeout_s
            out = run_distributed(_worker, args.nproc, *work, timeout_s=3600.0, pg_timeout_s=timeout_s)[0]
    except CacheError as exc:
        return _fail(exc)
    except Exception as exc:  # a child's CacheError arrives wrapped in DistributedFailure
        if "CacheError" in str(exc):
            return _fail(str(exc).strip().splitlines()[-1].partition(": ")[2])
        from dcp.distributed.launch import DistributedFailure

        if isinstance(exc, DistributedFailure) and not os.environ.get("DCP_TRACEBACK"):
            # a rank died, stalled or raised: one line naming it and its phase (the tracebacks on request)
            print(f"dcp profile: error: {exc.summary()} (set DCP_TRACEBACK=1 for the ranks' tracebacks)",
                  file=sys.stderr)
            return 1
        raise
    assert out is not None
    csv_text, status, where = out
    table = ProfileTable.from_csv(csv_text, text=True)
    print(f"profile table: {len(table)} rows, {status}; profiling took {table.meta.extra.get('profile_wall_s', 0.0)} s, "
          f"timed with the {_clock_of(table)} clock; model {table.meta.model}, world {table.meta.world_size}, "
          f"{table.meta.hardware}")
    print(f"table: {where}")
    if args.out:
        try:
            table.save(args.out)  # atomic: the old file stays whole if this fails
        except OSError as exc:
            kept = f"the table is kept at {where}" if status != "profiled (grow-only, not cached)" else \
                "the grow-only table was not cached"
            return _fail(f"--out ({args.out!r}) could not be written ({exc.strerror or exc}): {kept}; copy it "
                         "from there or pass a writable --out")
        print(f"wrote {args.out}")
    print("\n".join(summary_lines(table, config, args.nproc)))
    return 0
