"""The manager's profiling hooks (paper step 2): load or profile the table, and record micro-batch times.

The profiler (``dcp.profiler``) measures the runtime's layers, so it sits above the runtime; the manager
reaches it only through a ``ProfileSource`` it is given (``dcp.set_manager`` passes
``dcp.profiler.source.CachedProfiler``). Without one, ``init_profiler`` falls back to an analytic table.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Protocol

import torch

from dcp.config import DCPConfig
from dcp.distributed.device import Span
from dcp.planner.table import with_engine_state
from dcp.runtime.step import ManagerError


class ProfileSource(Protocol):
    """Where profile tables come from: a cache-aware profiler (``dcp.profiler.source.CachedProfiler``)."""

    stale_error: type[Exception]
    """What ``need_profile`` / ``load_or_profile`` raise for a cached table of an older format or code."""

    def need_profile(self, target: Any, config: DCPConfig, world_size: int) -> bool:
        """True when no valid cached table exists for this run's key (collective)."""
        ...

    def load_or_profile(self, model: Any, config: DCPConfig, world_size: int, registry: Any, *, adapter: Any,
                        refresh: bool, **kwargs: Any) -> tuple[Any, str]:
        """(table, 'hit' or 'profiled'): the cached table, or one profiled in this run (collective)."""
        ...


class TableLoader:
    """need_profile / init_profiler of the manager: cache lookups, strict-cache refusals, log lines."""

    def __init__(self, source: ProfileSource | None, config: DCPConfig, world_size: int, rank: int,
                 log: logging.Logger) -> None:
        self.source, self.config, self.world_size, self.rank, self.log = source, config, world_size, rank, log

    def need_profile(self, target: Any) -> bool:
        """See ``DCPManager.need_profile`` (without a source: True, the analytic table stands in)."""
        if self.source is None:
            return True
        try:
            return self.source.need_profile(target, self.config, self.world_size)
        except self.source.stale_error as exc:
            if self.config.advanced.strict_cache:
                raise _strict_error(exc) from exc
            return True

    def load(self, model: Any, registry: Any, adapter: Any, **kwargs: Any) -> Any:
        """The run's table (see ``DCPManager.init_profiler``)."""
        if self.source is None:
            self.log.warning("no profiler was given to the manager (dcp.set_manager passes dcp.profiler's); "
                             "using an analytic profile table")
            from dcp.planner import analytic_table_for

            return analytic_table_for(self.config, self.world_size, sp_sizes=registry.sp_sizes)
        strict, cache_dir = self.config.advanced.strict_cache, self.config.profiling.cache_dir
        refresh = bool(kwargs.pop("refresh", False))
        reason = "refresh requested" if refresh else ""
        target = adapter if adapter is not None else model
        args = (model, self.config, self.world_size, registry)
        if _is_sharded(model) and (refresh or self.need_profile(target)):
            # the dual-layer profiler runs single layers of the model on their own, while fully_shard's layers
            # all-gather their parameters over every rank on each forward: it measures whole modules only
            # (set_manager profiles an fsdp2 run before its engine shards the model)
            raise ManagerError(
                "the model is already sharded by fully_shard, and the profiler measures unsharded layers: give "
                "set_manager the unsharded model with runtime.engine 'fsdp2' (it profiles before sharding), or pass "
                "set_manager(..., table=...) with dcp.planner.analytic_table_for(config, world_size) or a cached table"
            )
        try:
            if strict and not refresh and self.source.need_profile(target, self.config, self.world_size):
                raise ManagerError(
                    f"advanced.strict_cache (true) but {cache_dir} holds no cached profile table for this run's "
                    "key (model, adapter SP sizes, world size, hardware, dtype, profiling settings): set "
                    "advanced.strict_cache = false to profile inside this run, or profile this model first"
                )
            table, status = self.source.load_or_profile(*args, adapter=adapter, refresh=refresh, **kwargs)
        except self.source.stale_error as exc:
            if strict:
                raise _strict_error(exc) from exc
            if self.rank == 0:
                self.log.warning("%s; re-profiling inside this run (advanced.strict_cache = true refuses instead)",
                                 str(exc).split(": delete")[0])
            reason = "the cached table was stale"
            table, status = self.source.load_or_profile(*args, adapter=adapter, refresh=True, **kwargs)
        # a table cached under another engine counts that engine's state in M_C: this run's instead
        table = with_engine_state(table, self.config.model, self.config.runtime.engine, self.world_size)
        if self.rank == 0:
            if status == "hit":
                self.log.info("profile table: cached in %s (%d rows)", cache_dir, len(table))
            else:
                self.log.info("profile table: profiled inside this run (%s; %d rows, %.1f s), cached in %s",
                              reason or "no cached table for this run's key", len(table),
                              float(table.meta.extra.get("profile_wall_s", float("nan"))), cache_dir)
        return table


def _is_sharded(model: Any) -> bool:
    """True when ``fully_shard`` has replaced the model's (or a submodule's) parameters by shards."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, torch.nn.Module) and any(isinstance(m, FSDPModule) for m in model.modules())


def _strict_error(exc: Exception) -> ManagerError:
    return ManagerError(
        f"{exc}; advanced.strict_cache (true) forbids re-profiling inside the run: set it to false to "
        "re-profile here"
    )


class MicroBatchTimer:
    """``DCPManager.profile``'s context: the micro-batch's busy span (minus the gradient syncs inside it) into the
    step's tally, and its (seq_group, size, sp_size, recompute_layers) row into the measurements. A class with
    slots rather than a generator context: it runs once per micro-batch on the training thread. ``host``: the
    watch is the host clock (a CPU run): the span is read from ``time.perf_counter`` here and added to the
    tally's ``busy_host_s`` as a float, with no Span object or stopwatch call per micro-batch."""

    __slots__ = ("_watch", "_timings", "_tally", "_key", "_syncs", "_token", "_host")

    def __init__(self, watch: Any, timings: Measurements, tally: Any, key: tuple[int, int, int, int] | None, *,
                 host: bool = False) -> None:
        self._watch, self._timings, self._tally, self._key, self._host = watch, timings, tally, key, host

    def __enter__(self) -> None:
        self._syncs = len(self._tally.syncs)
        self._token = time.perf_counter() if self._host else self._watch.start()

    def __exit__(self, *exc: object) -> None:
        # busy = the micro-batch minus the gradient sync + update it contains (engine.step at the boundary).
        # On CUDA these are event spans, read only when the step's stats are exchanged: no sync here.
        tally = self._tally
        if self._host:
            seconds = time.perf_counter() - self._token
            busy = seconds
            if len(tally.syncs) > self._syncs:
                busy -= sum(s.seconds() for s in tally.syncs[self._syncs:])
            tally.busy_host_s += busy
            if self._key is not None:  # a host span is read now: straight into the rows
                self._timings.rows.append((*self._key, seconds))
            return
        span = self._watch.stop(self._token)
        tally.busy.append((1, span))
        if len(tally.syncs) > self._syncs:
            tally.busy.extend((-1, s) for s in tally.syncs[self._syncs:])
        if self._key is not None:
            timings = self._timings
            if timings.cuda:
                timings.add(self._key, span)
            else:  # a host span is read now: straight into the rows (Measurements.add would resolve it at once)
                timings.rows.append((*self._key, span.seconds()))


class Measurements:
    """(seq_group, micro_batch_size, sp_size, recompute_layers, seconds) of every profiled micro-batch.

    On CUDA a span is a pair of events, read only when a logged step's stats are exchanged (no sync in the
    step); at most ``max_unresolved`` spans wait that long."""

    def __init__(self, *, cuda: bool, maxlen: int = 100_000, max_unresolved: int = 4096) -> None:
        self.rows: deque[tuple[int, int, int, int, float]] = deque(maxlen=maxlen)
        self.cuda = cuda
        """True: spans are CUDA event pairs, resolved when read (``resolve``); False: host spans, read at once."""
        self._max_unresolved = max_unresolved
        self._unresolved: list[tuple[tuple[int, int, int, int], Span]] = []

    def add(self, key: tuple[int, int, int, int], span: Span) -> None:
        self._unresolved.append((key, span))
        if not self.cuda or len(self._unresolved) >= self._max_unresolved:
            self.resolve()

    def resolve(self) -> None:
        for key, span in self._unresolved:
            self.rows.append((*key, span.seconds()))
        self._unresolved.clear()
