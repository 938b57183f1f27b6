"""The DCP manager: the paper's public API (Figure 14).

    mgr = set_manager(model, dataset, config, optimizer=opt)
    engine = mgr.engine
    for epoch in range(epochs):
        if mgr.need_profile():
            mgr.init_profiler()
        for batch in mgr.get_data_iter():
            mgr.optimize_dynamics(batch, engine)
            with mgr.profile(batch, engine):
                loss = engine(batch); engine.backward(loss); engine.step()

Per step, every rank (1) checks that all ranks planned the same step (a digest all-gather on a gloo group
with a timeout, which also carries the previous step's loss, counts and busy time for the log), (2) runs
its SP group's ga_steps micro-batches with loss weight ``sync_divisor / N_step``, and (3) joins ONE
gradient sync over all W ranks (``engine.step()`` at its last micro-batch; a rank without micro-batches
this step joins it from inside the iterator with zero gradients).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp.config import ConfigError, DCPConfig, ModelShapeConfig, PlanningConfig
from dcp.distributed.device import Span, Stopwatch, module_device, move_batch, resolve_precision
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.context import SPContext
from dcp.runtime.data import check_dataset, target_counts
from dcp.runtime.engines import Engine, build_engine
from dcp.runtime.exchange import (
    KINDS,
    DataMismatchError,
    PlanMismatchError,
    check_agreement,
    digest_words,
    gathered_stats,
    step_row,
)
from dcp.runtime.log import StepStats, get_logger
from dcp.runtime.phases import PhaseBoard
from dcp.runtime.recompute import checkpoint_layer
from dcp.runtime.registry import SPGroupRegistry
from dcp.runtime.weighting import check_step_count, micro_batch_weight, step_normaliser

PlanSource = Callable[[int], Any]  # epoch -> iterable of StepPlans


class ManagerError(ValueError):
    """The manager was used out of order (e.g. a step without engine.step()); the message says the fix."""


def _default_forward(model: Any, batch: Any, ctx: SPContext) -> Any:
    return model(batch, ctx)


def _set_world_timeout(timeout_s: float) -> None:
    """The default (world) process group's collective timeout: the gradient sync runs on it."""
    try:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))
    except (AttributeError, RuntimeError, ValueError, AssertionError) as exc:  # private API: warn, never fail
        get_logger(dist.get_rank()).warning(
            "could not set the world group's timeout to runtime.collective_timeout_s (%s); it keeps the one "
            "init_process_group set", exc)


class DCPManager:
    """Runs DCP step plans on this rank; build it with :func:`set_manager`."""

    def __init__(self, model: torch.nn.Module, dataset: Any, config: DCPConfig, engine: Engine, *,
                 table: Any = None, plans: PlanSource | None = None, forward_fn: Callable[..., Any] | None = None,
                 registry: SPGroupRegistry | None = None, adapter: Any = None) -> None:
        self.model, self.dataset, self.config, self.engine = model, dataset, config, engine
        self.table, self._plans = table, plans
        self.forward_fn = forward_fn or _default_forward
        # checked at the first forward (a model only planned for, never run, needs no forward)
        self._forward_error = _forward_problem(model) if forward_fn is None else None
        self.adapter = adapter
        """The profiler's ModelAdapter (None: derived from the model); need_profile() and init_profiler()
        build their cache key from it (its SP sizes included), so they always agree."""
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.lengths = check_dataset(dataset)
        self.shapes = dataset.sample_shapes() if hasattr(dataset, "sample_shapes") else None
        """(T, S) per sample for 2D data (the dataset's optional sample_shapes()), else None."""
        self.target_counts = target_counts(dataset, self.lengths)
        self._target_counts_np = np.asarray(self.target_counts, dtype=np.int64)
        """The same as an array: a step's N_step is one gather (``step_normaliser``)."""
        self._data_words = digest_words(
            f"{self.lengths!r}|{self.target_counts!r}|{[tuple(x) for x in self.shapes] if self.shapes else None!r}")
        """Digest of what every rank must agree on besides the plans: lengths, target counts, shapes."""
        self.log = get_logger(self.rank)
        self.device = getattr(engine, "device", None) or module_device(model)
        """The run's device (where the engine's module computes): batches, loss and count accumulators live
        there; only the gloo plan-check collective copies its small row to the host."""
        self.precision = getattr(engine, "precision", None) or resolve_precision(config.runtime.precision, self.device)
        """runtime.precision resolved on ``device``: 'bf16' or 'fp32'."""
        timeout_s = config.runtime.collective_timeout_s
        if self.distributed and self.world_size > 1:
            _set_world_timeout(timeout_s)
        self._board = PhaseBoard.for_default_group()
        """Every rank's phase in the rendezvous store: a failed collective names the rank that stalled or died."""
        # Every rank creates the same groups in the same order (new_group is a world collective).
        self.registry = registry or SPGroupRegistry.for_config(
            config, self.world_size, [p for p in config.planning.sp_sizes if p <= self.world_size]
        )
        self._check_group = None
        if self.distributed and self.world_size > 1:
            # A separate gloo group with its own timeout: a rank that planned a different number of steps
            # makes the others fail after plan_check_timeout_s instead of hanging in the gradient sync.
            self._check_group = dist.new_group(
                backend="gloo", timeout=timedelta(seconds=config.runtime.plan_check_timeout_s)
            )
        engine.attach(self)
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.step_stats: list[StepStats] = []
        """One record per finished step (the same on every rank), filled one step late."""
        self.measurements: deque[tuple[int, int, int, int, float]] = deque(maxlen=100_000)
        """(seq_group, micro_batch_size, sp_size, recompute_layers, seconds) of every profiled micro-batch
        (on CUDA: GPU time between events, added when a logged step's stats are exchanged)."""
        self._watch = Stopwatch(self.device)
        self._unresolved: list[tuple[tuple[int, int, int, int], Span]] = []
        self._ctx = SPContext.single(attention=config.runtime.attention)
        self._ctx_cache: dict[tuple[int, int, int], SPContext] = {}
        self._plan: StepPlan | None = None
        self._group: GroupPlan | None = None
        self._pending: MicroBatch | None = None
        self._mb_index = -1
        self._applied = False
        self._step_open = False
        self._loss_weight = 0.0
        self._n_step = 0
        self._layer_counter = 0
        self._prev: dict[str, Any] | None = None
        self._reset_step_accumulators()

    # ----- profiling hooks (paper step 2) --------------------------------------------------------
    def need_profile(self) -> bool:
        """True when this run must profile: no table, no plan source, and no valid cached table for this
        run's key (model, adapter and its SP sizes, world size, hardware, dtype, profiling settings).

        A stale cached table answers True (``init_profiler`` re-profiles it, and says so) unless
        ``profiling.strict_cache``; a corrupt one raises ``CorruptCacheError``. Collective.
        """
        if self.table is not None or self._plans is not None:
            return False
        try:
            from dcp.profiler.cache import StaleCacheError
            from dcp.profiler.dual_layer import need_profile
        except ImportError:
            return True
        try:
            return need_profile(self._profile_target(), self.config, self.world_size)
        except StaleCacheError as exc:
            if self.config.profiling.strict_cache:
                raise self._strict_error(exc) from exc
            return True

    def init_profiler(self, **profiler_kwargs: Any) -> None:
        """Load the cached profile table or profile inside this run (dcp.profiler, collective on all ranks).

        ``profiler_kwargs`` go to ``dcp.profiler.dual_layer.load_or_profile`` (e.g. ``refresh=True``); an
        ``adapter=`` given here replaces the manager's (``need_profile`` then uses it too). A missing or
        stale table is profiled in this run, with a log line saying which and why, unless
        ``profiling.strict_cache`` (then it raises); a corrupt table is always refused. Without the
        profiler package an analytic table is used, with a warning.
        """
        adapter = profiler_kwargs.pop("adapter", None)
        if adapter is not None:
            self.adapter = adapter
        try:
            from dcp.profiler.cache import StaleCacheError
            from dcp.profiler.dual_layer import load_or_profile, need_profile
        except ImportError as exc:
            self.log.warning("dcp.profiler unavailable (%s); using an analytic profile table", exc)
            self.table = self._analytic_table()
            return
        strict, cache_dir = self.config.profiling.strict_cache, self.config.profiling.cache_dir
        refresh = bool(profiler_kwargs.pop("refresh", False))
        reason = "refresh requested" if refresh else ""
        try:
            if strict and not refresh and need_profile(self._profile_target(), self.config, self.world_size):
                raise ManagerError(
                    f"profiling.strict_cache (true) but {cache_dir} holds no cached profile table for this run's "
                    "key (model, adapter SP sizes, world size, hardware, dtype, profiling settings): set "
                    "profiling.strict_cache = false to profile inside this run, or profile this model first"
                )
            self.table, status = load_or_profile(self.model, self.config, self.world_size, self.registry,
                                                 adapter=self.adapter, refresh=refresh, **profiler_kwargs)
        except StaleCacheError as exc:
            if strict:
                raise self._strict_error(exc) from exc
            if self.rank == 0:
                self.log.warning("%s; re-profiling inside this run (profiling.strict_cache = true refuses instead)",
                                 str(exc).split(": delete")[0])
            reason = "the cached table was stale"
            self.table, status = load_or_profile(self.model, self.config, self.world_size, self.registry,
                                                 adapter=self.adapter, refresh=True, **profiler_kwargs)
        if self.rank == 0:
            if status == "hit":
                self.log.info("profile table: cached in %s (%d rows)", cache_dir, len(self.table))
            else:
                self.log.info("profile table: profiled inside this run (%s; %d rows, %.1f s), cached in %s",
                              reason or "no cached table for this run's key", len(self.table),
                              float(self.table.meta.extra.get("profile_wall_s", float("nan"))), cache_dir)

    def _profile_target(self) -> Any:
        return self.adapter if self.adapter is not None else self.model

    def _strict_error(self, exc: Exception) -> ManagerError:
        return ManagerError(
            f"{exc}; profiling.strict_cache (true) forbids re-profiling inside the run: set it to false to "
            "re-profile here"
        )

    def _analytic_table(self) -> Any:
        from dcp.planner import analytic_table_for

        return analytic_table_for(self.config, self.world_size, sp_sizes=self.registry.sp_sizes)

    # ----- data (paper step 2) -------------------------------------------------------------------
    def epoch_plans(self, epoch: int) -> Iterator[StepPlan]:
        """The StepPlans of ``epoch`` (deterministic: the same on every rank and on every replay)."""
        if self._plans is not None:
            return iter(self._plans(epoch))
        if self.table is None:
            self.init_profiler()
        from dcp.planner.ahead import planned_ahead

        # planned a few steps ahead on a background thread, or in a child process that the thread reads
        # (same plans, same order: dcp.planner.ahead)
        kwargs = dict(lengths=self.lengths, table=self.table, config=self.config, world_size=self.world_size,
                      epoch=epoch, shapes=self.shapes)
        return planned_ahead(kwargs, self.config.planning.plan_ahead)

    def get_data_iter(self, max_steps: int | None = None) -> Iterator[Any]:
        """This rank's micro-batches (Batch objects) of the current epoch, resuming mid-epoch if restored.

        Every rank of an SP group yields the same full micro-batches; a rank idle in a step yields nothing
        for it but joins the step's gradient sync here. The epoch counter advances when it is exhausted.
        ``max_steps`` stops after that many steps (all ranks at the same step boundary: the safe point to
        save a checkpoint; breaking out of the loop yourself would leave a rank that is idle in the last
        step waiting in the next step's collective).
        """
        epoch, skip = self.epoch, self.step_in_epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        if self.config.runtime.check_plan_hash:
            # One all-gather per epoch of a digest over ALL the epoch's step plans and of the dataset (lengths,
            # target counts, shapes): a rank that planned differently (any step, or a different number of
            # steps) or holds other data fails here, before the epoch's first collective, and steps carry no
            # extra synchronisation point (the planner is deterministic and fast, so the plans are simply
            # computed twice).
            self._exchange(self._epoch_digest(epoch), None, None, where=f"epoch {epoch} (its step plans)",
                           kind=0, step=-1)
            if self._board is not None:
                self._board.note = ""  # every rank is back in step
        finished = False
        try:
            yield from self._epoch_batches(epoch, skip, max_steps)
            finished = True
        finally:
            if not finished and self._board is not None:
                # a break (or an exception) in the user's loop: the other ranks will wait for this one
                at = f"epoch {epoch} step {self._plan.step}" if self._plan is not None else f"epoch {epoch}"
                self._board.note = f"after leaving get_data_iter() early at {at}"
                self._board.enter("outside get_data_iter()")

    def _phase(self, what: str) -> str:
        plan = self._plan
        return f"{what} of epoch {self.epoch} step {plan.step}" if plan is not None else f"{what} of epoch {self.epoch}"

    def _collective(self, what: str, timeout_s: float | None = None) -> Any:
        """Context of a collective in phase ``what`` (this step): a failure names the rank that is elsewhere."""
        if self._board is None:
            return nullcontext()
        return self._board.collective(self._phase(what), timeout_s=timeout_s or self.config.runtime.collective_timeout_s)

    def _epoch_batches(self, epoch: int, skip: int, max_steps: int | None) -> Iterator[Any]:
        plans = self.epoch_plans(epoch)
        try:
            yield from self._run_plans(plans, epoch, skip, max_steps)
        finally:
            # left early (max_steps, a break, an error): stop the planning thread or process now
            close = getattr(plans, "close", None)
            if close is not None:
                close()

    def _run_plans(self, plans: Iterator[StepPlan], epoch: int, skip: int, max_steps: int | None) -> Iterator[Any]:
        done = 0
        for plan in plans:
            if plan.step < skip:
                continue  # replaying the deterministic planner: consumed steps are skipped, order unchanged
            if max_steps is not None and done >= max_steps:
                self._begin_step(None, marker=f"pause {epoch}:{plan.step}", pause_step=plan.step)  # flush stats here
                return
            done += 1
            if plan.world_size != self.world_size:
                raise PlanMismatchError(
                    f"plan world_size ({plan.world_size}) != torch.distributed world size ({self.world_size}): "
                    "plan with the world size of the job"
                )
            self._begin_step(plan)
            group = self._group
            if not group.micro_batches:
                self.engine.idle_step()
                self._step_done(0.0)
                continue
            n = len(group.micro_batches)
            for i, mb in enumerate(group.micro_batches):
                self._mb_index, self._pending, self._applied = i, mb, False
                if self._board is not None:
                    self._board.enter(self._phase(f"micro-batch {i + 1}/{n}"))
                yield move_batch(self.dataset.collate([self.dataset[j] for j in mb.sample_ids]), self.device)
            if self._step_open:
                raise ManagerError(
                    f"epoch {epoch} step {plan.step}: engine.step() was not called after the last micro-batch "
                    "(the step's gradient sync never ran): call model.step() after every model.backward(loss)"
                )
        self._begin_step(None)  # flush the last step's stats; all ranks must end the epoch together
        self.epoch, self.step_in_epoch = epoch + 1, 0

    # ----- per micro-batch (paper steps 3-6) -----------------------------------------------------
    def optimize_dynamics(self, batch: Any, model: Any = None) -> SPContext:
        """Switch to this micro-batch's SP group and recompute setting and set its loss weight."""
        mb = self._pending
        if mb is None:
            raise ManagerError("optimize_dynamics called outside get_data_iter(): iterate the manager's batches")
        ids = tuple(getattr(batch, "sample_ids", mb.sample_ids))
        if ids != mb.sample_ids:
            raise ManagerError(
                f"batch sample_ids {ids} are not the planned micro-batch {mb.sample_ids}: pass the batch that "
                "get_data_iter() yielded, unchanged"
            )
        group = self._group
        key = (group.first_rank, group.sp_size, group.recompute_layers)
        if key not in self._ctx_cache:
            self._ctx_cache[key] = self.registry.context(group, self.rank, attention=self.config.runtime.attention)
        self._ctx = self._ctx_cache[key]
        self._loss_weight = micro_batch_weight(
            mb, self._n_step, self.target_counts, self.config.runtime.loss_weighting, self.engine.sync_divisor
        )
        self._applied = True
        return self._ctx

    @contextmanager
    def profile(self, batch: Any = None, model: Any = None, gas: Any = None) -> Iterator[None]:
        """Time one micro-batch (forward, backward, step). ``gas`` is accepted for the paper's signature;
        DCP takes ga_steps from the plan (``mgr.gas``)."""
        mb, group = self._pending, self._group
        sync_before = len(self._sync_spans)
        token = self._watch.start()
        try:
            yield
        finally:
            # busy = the micro-batch minus the gradient sync + update it contains (engine.step at the boundary).
            # On CUDA these are event spans, read only when the step's stats are exchanged: no sync here.
            span = self._watch.stop(token)
            self._busy_spans.append((1, span))
            self._busy_spans.extend((-1, s) for s in self._sync_spans[sync_before:])
            if mb is not None and group is not None:
                self._unresolved.append(((mb.seq_group, mb.size, group.sp_size, group.recompute_layers), span))
                if not self._watch.cuda or len(self._unresolved) >= 4096:  # bound the events held between logs
                    self._resolve_measurements()

    def recompute(self, layer: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``layer(*args)``, checkpointed when its index (layer.layer_index, else call order within this
        forward) is below the current group's recompute_layers."""
        index = getattr(layer, "layer_index", None)
        if index is None:
            index = self._layer_counter
            self._layer_counter += 1
        enabled = index < self._ctx.recompute_layers
        if kwargs and enabled and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(layer, *args, use_reentrant=False, **kwargs)
        if kwargs:
            return layer(*args, **kwargs)
        return checkpoint_layer(layer, *args, enabled=enabled)

    def wrap_layers(self, layers: Any) -> None:
        """Route every layer of ``layers`` (e.g. an HF model's ``model.model.layers``) through the recompute
        switch: layer i is checkpointed when i < the current group's recompute_layers. Parameter names
        and state dicts are unchanged (the layer's forward is wrapped, not the module)."""
        for index, layer in enumerate(layers):
            inner = layer.forward

            def forward(*args: Any, _inner: Any = inner, _index: int = index, **kwargs: Any) -> Any:
                enabled = _index < self._ctx.recompute_layers and torch.is_grad_enabled()
                if not enabled:
                    return _inner(*args, **kwargs)
                from torch.utils.checkpoint import checkpoint

                return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

            layer.forward = forward

    @property
    def ctx(self) -> SPContext:
        """SPContext of the current micro-batch (single-rank context before the first one)."""
        return self._ctx

    @property
    def group(self) -> Any:
        """torch ProcessGroup of the current SP group (None when sp_size is 1)."""
        return self._ctx.group

    @property
    def gas(self) -> int:
        """ga_steps of this rank's SP group in the current step."""
        return self._group.ga_steps if self._group is not None else 0

    @property
    def plan(self) -> StepPlan | None:
        """The step plan being run."""
        return self._plan

    def train_micro_batch(self, batch: Any) -> float:
        """The paper's loop body in one call; returns this rank's unweighted loss_sum of the micro-batch."""
        self.optimize_dynamics(batch)
        with self.profile(batch):
            loss = self.engine(batch)
            self.engine.backward(loss)
            self.engine.step()
        return float(loss.detach())

    # ----- checkpointing ---------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        text = self.config.to_json() + repr(self.lengths) + f"w{self.world_size}"
        if self.shapes is not None:
            text += repr([tuple(s) for s in self.shapes])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        """Position in the data (epoch, finished steps of it) plus a fingerprint of config and lengths.
        Model, optimizer and scheduler states are saved by the caller (or the DeepSpeed engine)."""
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "fingerprint": self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self._fingerprint():
            raise ManagerError(
                f"checkpoint fingerprint ({state.get('fingerprint')!r}) differs from this run's "
                f"({self._fingerprint()!r}): resume with the same config, dataset lengths and world size, "
                "or the remaining data order would differ"
            )
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])

    # ----- internals used by the engine ------------------------------------------------------------
    def _before_forward(self, batch: Any) -> SPContext:
        if self._forward_error is not None:
            raise self._forward_error
        if not self._applied:
            self.optimize_dynamics(batch)
        self._layer_counter = 0
        return self._ctx

    def _after_forward(self, out: Any) -> torch.Tensor:
        loss, count = (out[0], out[1]) if isinstance(out, tuple | list) else (out, None)
        # Accumulated on the run's device in fp64 / int64 whatever the compute precision, without reading
        # anything back to the host (the step's values are copied out once, in the stats exchange).
        self._loss_local += loss.detach().to(self._loss_local.device, torch.float64)
        if count is not None:
            self._count_local += torch.as_tensor(count).detach().to(self._count_local.device, torch.int64).sum()
            self._has_count = True
        return loss

    def _in_last_micro_batch(self) -> bool:
        """True from the forward to the step() of this rank's last micro-batch of the open step: its backward
        gives the parameters their final gradients of the step (the ddp engine starts their sync then)."""
        return self._step_open and self._mb_index == self._group.ga_steps - 1

    def _at_boundary(self) -> bool:
        return self._applied and self._in_last_micro_batch()

    def _resolve_measurements(self) -> None:
        for key, span in self._unresolved:
            self.measurements.append((*key, span.seconds()))
        self._unresolved.clear()

    def _step_done(self, sync: Span | float) -> None:
        self._sync_spans.append(sync if isinstance(sync, Span) else Span(seconds=float(sync)))
        self._step_open = False
        self.step_in_epoch = self._plan.step + 1
        self.global_step += 1

    def _reset_step_accumulators(self) -> None:
        self._loss_local = torch.zeros((), dtype=torch.float64, device=self.device)
        self._count_local = torch.zeros((), dtype=torch.int64, device=self.device)
        self._has_count = False
        self._busy_spans: list[tuple[int, Span]] = []
        self._sync_spans: list[Span] = []

    def _begin_step(self, plan: StepPlan | None, marker: str | None = None, pause_step: int | None = None) -> None:
        now = time.perf_counter()
        prev = self._prev
        if prev is not None:
            prev["step_time_s"] = now - prev["t0"]
            # a rank that ran no forward this step (idle) counted 0 tokens; -1 marks "model gave no count"
            prev.update(loss=self._loss_local.clone(), count=self._count_local.clone(), busy=self._busy_spans,
                        has_count=self._has_count or not self._group.micro_batches)
        if marker is None:
            marker = plan.digest() if plan is not None else f"end-of-epoch {self.epoch}"
        # Stats of the finished step (loss, count, busy time) are gathered only for logged steps; every
        # rank computes the same global_step, so all ranks agree on whether to gather.
        rt = self.config.runtime
        if prev is not None and (prev["global_step"] % rt.log_every == 0
                                 or (rt.stats_every and prev["global_step"] % rt.stats_every == 0)):
            where = f"epoch {self.epoch} step {plan.step}" if plan is not None else f"end of epoch {self.epoch}"
            # position in the loop: 1 a step, 2 the end of the epoch, 3 a pause (get_data_iter left early)
            kind = 1 if plan is not None else (3 if pause_step is not None else 2)
            step = plan.step if plan is not None else (pause_step if pause_step is not None else -1)
            self._exchange(marker, prev, plan, where=where, kind=kind, step=step)
        self._prev = None
        self._reset_step_accumulators()
        self._plan, self._pending, self._mb_index, self._applied = plan, None, -1, False
        if plan is None:
            self._group = None
            return
        self._group = plan.group_of(self.rank)
        self._n_step = step_normaliser(plan, self._target_counts_np, self.config.runtime.loss_weighting)
        self._step_open = True
        self._prev = {"plan": plan, "t0": now, "global_step": self.global_step + 1}

    def _epoch_digest(self, epoch: int) -> str:
        h = hashlib.sha256()
        n = 0
        for plan in self.epoch_plans(epoch):
            h.update(plan.digest().encode())
            n += 1
        return f"epoch {epoch}: {n} plans {h.hexdigest()}"

    def _exchange(self, marker: str, prev: dict[str, Any] | None, plan: StepPlan | None, *, where: str,
                  kind: int, step: int) -> None:
        """All-gather [plan digest, previous step's loss_sum, count, busy ns, position (kind, epoch, step),
        data digest] from every rank; check position, data and plans (in that order, the same on every rank).

        The check group is gloo (CPU tensors) on purpose: the step's device accumulators are copied to the
        host here, once per logged step, which is also the only host-device synchronisation they cost.
        """
        stats = None
        if prev is not None:
            busy_s = sum(sign * span.seconds() for sign, span in prev["busy"])
            stats = (prev["loss"].cpu(), prev["count"].cpu() if prev["has_count"] else None, busy_s)
            self._resolve_measurements()
        row = step_row(marker, stats, kind=kind, epoch=self.epoch, step=step, data_words=self._data_words)
        if self._check_group is not None:
            rows = [torch.zeros_like(row) for _ in range(self.world_size)]
            phase = KINDS[kind].format(e=self.epoch, s=step)
            ctx = (self._board.collective(phase, timeout_s=self.config.runtime.plan_check_timeout_s)
                   if self._board is not None else nullcontext())
            with ctx:
                dist.all_gather(rows, row, group=self._check_group)
            table = torch.stack(rows)
        else:
            table = row[None]
        check_agreement(table, where)
        if prev is not None:
            self._record_stats(prev, table)

    def _record_stats(self, prev: dict[str, Any], table: torch.Tensor) -> None:
        plan: StepPlan = prev["plan"]
        loss_sum, count, busy_s = gathered_stats(table)
        if count >= 0 and self.config.runtime.loss_weighting == "tokens":
            check_step_count(plan.step, step_normaliser(plan, self._target_counts_np, "tokens"), count)
        stats = StepStats(
            epoch=plan.epoch, step=plan.step, global_step=prev["global_step"],
            loss=loss_sum / count if count > 0 else float("nan"), count=max(count, 0),
            tokens=plan.tokens, step_time_s=prev["step_time_s"],
            busy_s=busy_s, predicted_idle=plan.idle_ratio_gpu,
            summary=plan.summary(),
        )
        self.step_stats.append(stats)
        if self.rank == 0 and stats.global_step % self.config.runtime.log_every == 0:
            self.log.info(stats.line())


def _check_arguments(model: Any, config: Any, table: Any) -> None:
    """set_manager's argument types, each refused with the fix (instead of an AttributeError later)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model ({type(model).__name__}) must be a torch.nn.Module: pass the model to train")
    if config is not None and not isinstance(config, DCPConfig):
        hint = ("build it with dcp.config.config_from_dict(...)" if isinstance(config, dict)
                else "load a TOML file with dcp.config.load_config(path)")
        raise TypeError(f"config ({type(config).__name__}) must be a dcp.DCPConfig: {hint}")
    if table is not None and not hasattr(table, "seq_group_edges"):
        hint = ("load it with dcp.planner.table.ProfileTable.load(path)" if isinstance(table, str | bytes)
                or hasattr(table, "__fspath__") else "pass a ProfileTable, or None to profile in this run")
        raise TypeError(f"table ({type(table).__name__}) must be a ProfileTable: {hint}")


def _forward_problem(model: Any) -> ManagerError | None:
    """Without forward_fn the model must take ``model(batch, ctx)`` (the reference models do)."""
    import inspect

    try:
        inspect.signature(model.forward).bind(None, None)
        return None
    except (TypeError, ValueError, AttributeError):
        pass
    return ManagerError(
        f"forward_fn (None) but {type(model).__name__}.forward cannot be called as model(batch, ctx): pass "
        "set_manager(..., forward_fn=fn) with fn(model, batch, ctx) -> (loss_sum, labelled_token_count) over "
        "this rank's chunk of the batch (a Llama / Qwen2 / Mistral transformers causal LM needs none: DCP "
        "prepares it through dcp.integrations.hf)"
    )


def set_manager(model: torch.nn.Module, dataset: Any, config: DCPConfig | None = None, *, optimizer: Any = None,
                lr_scheduler: Any = None, engine: str | Engine | None = None, table: Any = None,
                plans: PlanSource | None = None, forward_fn: Callable[..., Any] | None = None,
                deepspeed_config: dict[str, Any] | None = None, adapter: Any = None) -> DCPManager:
    """Build the DCP manager for ``model`` on ``dataset`` (call on every rank after init_process_group).

    ``set_manager(model, dataset)`` works with defaults for the reference models and for Hugging Face
    Llama / Qwen2 / Mistral causal LMs (prepared by :func:`dcp.integrations.hf.prepare`: Ulysses attention,
    forward, profiler adapter, model shape).

    config: the DCPConfig; its ``model`` section, when left at the default, is derived from the model
    (``model.config.shape()`` for the reference models, the HF config for HF models). optimizer: default
    ``torch.optim.AdamW(model.parameters())`` (torch's defaults). engine: 'ddp' / 'deepspeed' (default
    config.runtime.engine) or a ready Engine. table: a ProfileTable (None: ``init_profiler`` loads the cached
    one or profiles in this run). plans: optional ``epoch -> iterable of StepPlan`` replacing the planner
    (tests, replays). forward_fn: ``(model, batch, ctx) -> (loss_sum, count)`` (default ``model(batch, ctx)``,
    or the HF integration's). adapter: the profiler's ModelAdapter (default: derived from the model; the HF
    integration's for HF models); the profile cache key is built from it.
    """
    _check_arguments(model, config, table)
    integration = None
    if forward_fn is None:
        from dcp.integrations import hf

        if hf.is_hf_model(model):
            integration = hf.prepare(model)  # raises, naming forward_fn=, for a family it cannot drive
            forward_fn = integration.forward
            adapter = adapter if adapter is not None else integration.adapter()
    derived = integration.shape() if integration is not None else None
    if derived is None:
        shape = getattr(getattr(model, "config", None), "shape", None)
        derived = shape() if callable(shape) else None
    if config is None:
        if derived is None:
            raise ConfigError(
                "config (None) cannot be derived from this model (it has no config.shape()): pass "
                "dcp.DCPConfig(model=ModelShapeConfig(num_layers=..., hidden_size=..., num_heads=...))"
            )
        # default SP sizes that divide the model's heads (Ulysses shards heads)
        sizes = tuple(p for p in PlanningConfig().sp_sizes if derived.num_heads % p == 0)
        config = DCPConfig(model=derived, planning=PlanningConfig(sp_sizes=sizes))
    elif derived is not None and config.model == ModelShapeConfig():
        config = dataclasses.replace(config, model=derived)  # [model] left at its default: the model's own
    model_config = getattr(model, "config", None)
    heads = getattr(model_config, "num_heads", None) or getattr(model_config, "num_attention_heads", None)
    if isinstance(heads, int) and heads != config.model.num_heads:
        raise ConfigError(
            f"model.num_heads ({config.model.num_heads}) differs from the model's head count ({heads}): "
            "build the config from the model (model.config.shape()) so SP sizes are checked against its heads"
        )
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if optimizer is None and not isinstance(engine, Engine):
        optimizer = torch.optim.AdamW(model.parameters())
        get_logger(dist.get_rank() if world > 1 else 0).info(
            "set_manager: no optimizer given, using torch.optim.AdamW(model.parameters()) with torch's defaults")
    if isinstance(engine, Engine):
        eng = engine
        device = getattr(eng, "device", None) or module_device(model)
        want = resolve_precision(config.runtime.precision, device)
        if getattr(eng, "precision", want) != want:
            raise ConfigError(
                f"runtime.precision ({config.runtime.precision!r}, i.e. {want!r} on {device}) differs from the "
                f"engine's ({eng.precision!r}): build the engine with precision=config.runtime.precision"
            )
    else:
        eng = build_engine(engine or config.runtime.engine, model, optimizer, lr_scheduler, world_size=world,
                           deepspeed_config=deepspeed_config, precision=config.runtime.precision)
    mgr = DCPManager(model, dataset, config, eng, table=table, plans=plans, forward_fn=forward_fn, adapter=adapter)
    if integration is not None:
        integration.attach(mgr)
    return mgr


__all__ = ["DCPManager", "DataMismatchError", "ManagerError", "PlanMismatchError", "set_manager"]
