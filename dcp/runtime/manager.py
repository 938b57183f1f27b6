"""The DCP manager: runs step plans on this rank behind the paper's public API (Figure 14).

    mgr = dcp.set_manager(model, dataset, config, optimizer=opt)
    engine = mgr.engine
    for epoch in range(epochs):
        if mgr.need_profile():
            mgr.init_profiler()
        for batch in mgr.get_data_iter():
            mgr.optimize_dynamics(batch, engine)
            with mgr.profile(batch, engine):
                loss = engine(batch); engine.backward(loss); engine.step()

Per step, every rank (1) folds the step plan's digest into a running digest that the agreement exchange
(``dcp.runtime.exchange``) compares across ranks at the first step, on logged steps and at the epoch's end
(an all-gather with a timeout that also carries the finished step's loss, counts and busy time for the
log; unlogged steps run none), (2) runs its SP group's ga_steps micro-batches, collated one ahead on a
background thread, with loss weight ``sync_divisor / N_step``, and (3) joins ONE gradient sync over all W
ranks (``engine.step()`` at its last micro-batch; a rank without micro-batches this step joins it from
inside the iterator with zero gradients).

The pieces live beside it: the open step's state (``step``), the agreement exchange (``exchange``), the
profiling hooks (``profiling``), checkpoint state (``checkpoint``) and the protocol the engines drive it
through (``hooks.EngineHooks``). ``dcp.set_manager`` (``dcp.api``) builds it and injects the profiler and
the Hugging Face integration, which sit above the runtime.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dcp.config import DCPConfig
from dcp.distributed.device import Span, Stopwatch, module_device, resolve_precision
from dcp.planner.batch_settings import check_batch_settings
from dcp.planner.plan import StepPlan
from dcp.planner.step_tokens import batch_tokens, with_batch
from dcp.runtime import checkpoint as ckpt
from dcp.runtime import weight_casts
from dcp.runtime.context import SPContext
from dcp.runtime.data import check_dataset, target_counts
from dcp.runtime.engines import Engine
from dcp.runtime.exchange import (
    AgreementExchange,
    DataMismatchError,
    PlanMismatchError,
    digest_words,
)
from dcp.runtime.log import StepStats, get_logger
from dcp.runtime.loop import StepLoop
from dcp.runtime.lr import step_lr
from dcp.runtime.phases import PhaseBoard
from dcp.runtime.position import KeptEpoch, remapped
from dcp.runtime.profiling import Measurements, MicroBatchTimer, ProfileSource, TableLoader
from dcp.runtime.recompute import run_layer, wrap_layers
from dcp.runtime.registry import SPGroupRegistry
from dcp.runtime.step import ManagerError, OpenStep, StepTally
from dcp.runtime.stepview import StepViews
from dcp.runtime.weighting import micro_batch_weight

PlanSource = Callable[[int], Any]  # epoch -> iterable of StepPlans


def _default_forward(model: Any, batch: Any, ctx: SPContext) -> Any:
    return model(batch, ctx)


def _set_world_timeout(timeout_s: float) -> None:
    """The default (world) process group's collective timeout: the gradient sync runs on it."""
    if dist.get_backend() == "fake":  # PyTorch's fake group (dcp bench scale, dry runs): nothing waits, and torch warns
        return
    try:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))
    except (AttributeError, RuntimeError, ValueError, AssertionError) as exc:  # private API: warn, never fail
        get_logger(dist.get_rank()).warning(
            "could not set the world group's timeout to runtime.collective_timeout_s (%s); it keeps the one "
            "init_process_group set", exc)


def _state_batch(manager: DCPManager, config: DCPConfig) -> None:
    """Refuse batch settings the data cannot hold (before any work); rank 0 logs the warnings, then the global
    batch every epoch is planned at with the config line that changes it."""
    warnings = check_batch_settings(manager.lengths, config)
    if manager.rank == 0:
        for line in warnings:
            manager.log.warning(line)
        manager.log.info(batch_tokens(config, manager.lengths, manager.world_size)[1])


class DCPManager:
    """Runs DCP step plans on this rank; build it with ``dcp.set_manager``. Implements ``EngineHooks``."""

    def __init__(self, model: torch.nn.Module, dataset: Any, config: DCPConfig, engine: Engine, *,
                 table: Any = None, plans: PlanSource | None = None, forward_fn: Callable[..., Any] | None = None,
                 registry: SPGroupRegistry | None = None, adapter: Any = None,
                 profiler: ProfileSource | None = None) -> None:
        self.model, self.dataset, self.config, self.engine = model, dataset, config, engine
        self.table, self._plans = table, plans
        self.forward_fn = forward_fn or _default_forward
        # checked at the first forward (a model only planned for, never run, needs no forward)
        self._forward_error = _forward_problem(model) if forward_fn is None else None
        self.adapter = adapter
        """The profiler's ModelAdapter (None: derived from the model); need_profile() and init_profiler()
        build their cache key from it (its SP sizes included), so they always agree."""
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        self.lengths = check_dataset(dataset)
        self.shapes = dataset.sample_shapes() if hasattr(dataset, "sample_shapes") else None
        """(T, S) per sample for 2D data (the dataset's optional sample_shapes()), else None."""
        self.target_counts = target_counts(dataset, self.lengths)
        self._target_counts_np = np.asarray(self.target_counts, dtype=np.int64)
        """The same as an array: a step's N_step is one gather (``step_normaliser``)."""
        self.log = get_logger(self.rank)
        _state_batch(self, config)
        self.device = getattr(engine, "device", None) or module_device(model)
        """The run's device (where the engine's module computes): batches, loss and count accumulators live
        there; only the agreement exchange copies its small row to the host."""
        self.precision = getattr(engine, "precision", None) or resolve_precision(config.runtime.precision, self.device)
        """runtime.precision resolved on ``device``: 'bf16' or 'fp32'."""
        if self.world_size > 1:
            _set_world_timeout(config.runtime.collective_timeout_s)
        self._board = PhaseBoard.for_default_group()
        """Every rank's phase in the rendezvous store: a failed collective names the rank that stalled or died."""
        self._iters: weakref.WeakSet[Iterator[Any]] = weakref.WeakSet()
        """The get_data_iter() iterators still referenced: a new one closes those left suspended (their threads)."""
        weakref.finalize(self, _close_suspended, self._iters)  # at exit too, while threads still run
        # Every rank creates the same groups in the same order (new_group is a world collective).
        self.registry = registry or SPGroupRegistry.for_config(
            config, self.world_size, [p for p in config.planning.sp_sizes if p <= self.world_size]
        )
        self._data = ckpt.data_digest(dataset, self.lengths, self.target_counts, self.shapes)  # ranks and resumes check it
        data_words = digest_words(self._data)
        self._exchange = AgreementExchange(config.runtime, config.advanced, rank=self.rank, world_size=self.world_size,
                                           data_words=data_words, board=self._board, log=self.log)
        self._tables = TableLoader(profiler, config, self.world_size, self.rank, self.log)
        self._watch = Stopwatch(self.device)
        self._timings = Measurements(cuda=self._watch.cuda)
        self._loop = StepLoop(config, rank=self.rank, world_size=self.world_size, dataset=dataset,
                              device=self.device, target_counts=self._target_counts_np, exchange=self._exchange,
                              board=self._board, timings=self._timings)
        if engine is not None:
            self.bind_engine(engine)
        self._ctx = SPContext.single(attention=config.runtime.attention)
        self._ctx_cache: dict[tuple[int, int, int], SPContext] = {}
        self._idle_tally = StepTally.zeros(self.device)
        """Where a forward outside any step would count (none does in the paper's loop)."""
        self._layer_counter = 0
        self._kept = KeptEpoch()

    def bind_engine(self, engine: Engine) -> None:
        """Run the plans with ``engine`` (its hooks, weight casts and LR scaling: runtime.lr_scaling, applied as a
        step opens); ``set_manager`` profiles an fsdp2 model whole, then binds the engine that shards it."""
        config, self.engine = self.config, engine
        engine.attach(self)
        engine.keep_weight_casts = weight_casts.wanted(config.runtime, config.advanced, engine, self.log)
        self._lr = self._loop.lr = step_lr(with_batch(config, self.lengths, self.world_size), engine)

    # ----- position (dcp.runtime.loop) -------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch get_data_iter() runs next (advanced when an epoch is exhausted)."""
        return self._loop.epoch

    @property
    def step_in_epoch(self) -> int:
        """Steps of ``epoch`` already done (a resumed run skips them)."""
        return self._loop.step_in_epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken since the manager was created (or since the checkpoint it resumed from)."""
        return self._loop.global_step

    @property
    def skipped_samples(self) -> dict[int, list[int]]:
        """epoch -> sample ids of the steps the non-finite guard skipped (runtime.nonfinite = 'skip') since this
        manager was created; the current epoch's are also in ``state_dict()['position']['skipped']``."""
        return {e: list(ids) for e, ids in self._loop.skipped.items()}

    @property
    def step_stats(self) -> list[StepStats]:
        """One record per exchanged step (the same on every rank), filled one step late."""
        return self._loop.step_stats

    @property
    def _step(self) -> OpenStep | None:
        return self._loop.step

    # ----- profiling hooks (paper step 2) --------------------------------------------------------
    @property
    def measurements(self) -> Any:
        """(seq_group, micro_batch_size, sp_size, recompute_layers, seconds) of every profiled micro-batch
        (on CUDA: GPU time between events, added when a logged step's stats are exchanged); a step's last row
        includes its gradient sync and update when engine.step() runs inside ``profile``, as in the paper's loop."""
        return self._timings.rows

    def need_profile(self) -> bool:
        """True when this run must profile: no table, no plan source, and no valid cached table for this
        run's key (model, adapter and its SP sizes, world size, hardware, dtype, profiling settings). A stale
        cached table answers True (``init_profiler`` re-profiles it, and says so) unless
        ``advanced.strict_cache``; a corrupt one raises ``CorruptCacheError``. Collective."""
        if self.table is not None or self._plans is not None:
            return False
        return self._tables.need_profile(self.adapter if self.adapter is not None else self.model)

    def init_profiler(self, **profiler_kwargs: Any) -> None:
        """Load the cached profile table or profile inside this run (collective on all ranks).

        ``profiler_kwargs`` go to the profiler's ``load_or_profile`` (e.g. ``refresh=True``); an
        ``adapter=`` given here replaces the manager's (``need_profile`` then uses it too). A missing or
        stale table is profiled in this run, with a log line saying which and why, unless
        ``advanced.strict_cache`` (then it raises); a corrupt table is always refused. Without a profiler
        (a manager built without ``dcp.set_manager``) an analytic table is used, with a warning.
        """
        adapter = profiler_kwargs.pop("adapter", None)
        if adapter is not None:
            self.adapter = adapter
        self.table = self._tables.load(self.model, self.registry, self.adapter, **profiler_kwargs)

    def profile(self, batch: Any = None, model: Any = None, gas: Any = None) -> MicroBatchTimer:
        """Time one micro-batch (forward, backward, step): a context manager (``MicroBatchTimer``). ``gas`` is
        accepted for the paper's signature; DCP takes ga_steps from the plan (``mgr.gas``)."""
        step = self._step
        if step is None:
            return MicroBatchTimer(self._watch, self._timings, self._idle_tally, None, host=not self._watch.cuda)
        mb, group = step.pending, step.group
        key = (mb.seq_group, len(mb.sample_ids), group.sp_size, group.recompute_of(mb)) if mb is not None else None
        return MicroBatchTimer(self._watch, self._timings, step.tally, key, host=not self._watch.cuda)

    # ----- data (paper step 2) -------------------------------------------------------------------
    def epoch_plans(self, epoch: int, ids: Any = None, *, per_rank: bool = False, keep: bool = False) -> Iterator[Any]:
        """The StepPlans of ``epoch`` over sample ids ``ids`` (None: all; deterministic: the same on every rank
        and on every replay); a custom plan source takes no ids (it cannot re-plan a resumed epoch's rest).
        ``per_rank``: each as this rank's ``RankStep`` (dcp.runtime.stepview), prepared on the plan-ahead thread
        (get_data_iter's; a custom source's plans are prepared by the step loop). ``keep``: plans iterated in full
        are held for the run's next iteration of the epoch (for a caller that counts steps first: DCPTrainer)."""
        if self._plans is not None:
            return iter(self._plans(epoch)) if ids is None or len(ids) == len(self.lengths) else _no_replan(epoch)
        if self.table is None:
            self.init_profiler()
        from dcp.planner.ahead import PlanAhead, planned_ahead

        # planned a few steps ahead on a background thread (same plans, same order: dcp.planner.ahead); a resumed
        # epoch's rest is planned as a smaller dataset
        ids = np.arange(len(self.lengths)) if ids is None else np.asarray(ids, dtype=np.int64)
        kwargs = dict(lengths=[self.lengths[i] for i in ids], table=self.table, config=self.config, epoch=epoch,
                      world_size=self.world_size, shapes=[self.shapes[i] for i in ids] if self.shapes else None)
        key = (epoch, hashlib.blake2b(ids.tobytes(), digest_size=16).digest())
        if not per_rank:
            plans = planned_ahead(kwargs)
            return remapped(self._kept.record(key, self.table, plans) if keep else plans, ids)
        views = StepViews(rank=self.rank, world_size=self.world_size, target_counts=self._target_counts_np,
                          loss_weighting=self.config.runtime.loss_weighting, ids=ids)
        kept = self._kept.take(key, self.table)  # the epoch counted by the caller (DCPTrainer): not planned again
        return planned_ahead(kwargs, prepare=views) if kept is None else PlanAhead(kept, prepare=views)

    def get_data_iter(self, max_steps: int | None = None) -> Iterator[Any]:
        """This rank's micro-batches (Batch objects) of the current epoch's untrained samples (see state_dict).
        Every rank of an SP group yields the same full micro-batches; a rank idle in a step yields nothing
        for it but joins the step's gradient sync here. The epoch counter advances when it is exhausted.
        ``max_steps`` stops after that many steps (all ranks at the same step boundary: the safe point to
        save a checkpoint; breaking out of the loop yourself would leave a rank that is idle in the last
        step waiting in the next step's collective).
        """
        batches = _batches(self, max_steps)
        self._iters.add(batches)
        return batches

    # ----- per micro-batch (paper steps 3-6) -----------------------------------------------------
    def optimize_dynamics(self, batch: Any, model: Any = None) -> SPContext:
        """Switch to this micro-batch's SP group and recompute setting and set its loss weight."""
        step = self._loop.step
        mb = step.pending if step is not None else None
        if mb is None:
            raise ManagerError("optimize_dynamics called outside get_data_iter(): iterate the manager's batches")
        ids = getattr(batch, "sample_ids", mb.sample_ids)
        if ids is not mb.sample_ids and tuple(ids) != mb.sample_ids:
            raise ManagerError(
                f"batch sample_ids {tuple(ids)} are not the planned micro-batch {mb.sample_ids}: pass the batch that "
                "get_data_iter() yielded, unchanged, and let dataset.collate(samples) give each sample's id "
                "(collate_tokens(tokens, sample_ids), the ids __getitem__ returned with the samples)"
            )
        if step.ctx is None:  # the step's first micro-batch: its group's context and (tokens) weight, once
            _open_step(self, step)
        ctx = step.ctx
        if mb.recompute_layers >= 0 and mb.recompute_layers != ctx.recompute_layers:
            ctx = _own_recompute(self, step.group, ctx, mb.recompute_layers)
        self._ctx = ctx
        weight = step.weight
        step.loss_weight = weight if weight is not None else micro_batch_weight(
            mb, step.n_step, self.target_counts, self.config.runtime.loss_weighting, self.engine.sync_divisor)
        step.applied = True
        return self._ctx

    def recompute(self, layer: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``layer(*args)``, checkpointed when its index (layer.layer_index, else call order within this
        forward) is below the current micro-batch's recompute_layers."""
        index = getattr(layer, "layer_index", None)
        if index is None:
            index = self._layer_counter
            self._layer_counter += 1
        return run_layer(layer, args, kwargs, enabled=index < self._ctx.recompute_layers)

    def wrap_layers(self, layers: Any) -> None:
        """Route every layer of ``layers`` (e.g. an HF model's ``model.model.layers``) through the recompute
        switch: layer i is checkpointed when i < the current micro-batch's recompute_layers. Parameter names
        and state dicts are unchanged (the layer's forward is wrapped, not the module)."""
        wrap_layers(layers, lambda: self._ctx.recompute_layers)

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
        return self._step.group.ga_steps if self._step is not None else 0

    @property
    def plan(self) -> StepPlan | None:
        """The step plan being run."""
        return self._step.plan if self._step is not None else None

    def train_micro_batch(self, batch: Any) -> float:
        """The paper's loop body in one call; returns this rank's unweighted loss_sum of the micro-batch."""
        self.optimize_dynamics(batch)
        with self.profile(batch):
            loss = self.engine(batch)
            self.engine.backward(loss)
            self.engine.step()
        return float(loss.detach())

    # ----- checkpointing (dcp.runtime.checkpoint) --------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position in the data: the epoch and which of its samples are trained (dcp.runtime.checkpoint), valid
        under another table or world size. Model, optimizer and scheduler states are the caller's to save."""
        return ckpt.state_dict(self._loop.position, self.global_step, self._data)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        legacy = ckpt.legacy_fingerprint(self.config, self.lengths, self.world_size, self.shapes)
        self._loop.position, self._loop.global_step = ckpt.load_state_dict(
            state, data=self._data, num_samples=len(self.lengths), legacy_fp=legacy)

    # ----- EngineHooks: what the engines call (dcp.runtime.hooks) ----------------------------------
    def before_forward(self, batch: Any) -> SPContext:
        if self._forward_error is not None:
            raise self._forward_error
        step = self._loop.step
        if step is None or not step.applied:
            self.optimize_dynamics(batch)
        self._layer_counter = 0
        return self._ctx

    def after_forward(self, out: Any) -> torch.Tensor:
        # (loss_sum, token_count) counted into the step, or a one-line refusal with the fix (StepLoop.forward_out)
        return self._loop.forward_out(out, idle=self._idle_tally)

    def loss_weight(self) -> float:
        step = self._loop.step
        return step.loss_weight if step is not None else 0.0

    def in_last_micro_batch(self) -> bool:
        step = self._loop.step
        return step is not None and step.open and step.mb_index == step.last_index

    def at_boundary(self) -> bool:
        step = self._loop.step
        return step is not None and step.applied and step.open and step.mb_index == step.last_index

    def watch(self) -> Stopwatch:
        return self._watch

    def step_done(self, sync: Span | float) -> None:
        self._loop.step_done(sync)

    def finite_step(self, grads: list[torch.Tensor]) -> bool:
        return self._loop.finite_step(grads)

    def collective(self, what: str, timeout_s: float | None = None) -> AbstractContextManager[Any]:
        if self._board is None:
            return nullcontext()
        return self._board.collective(self._loop.phase(what), timeout_s=timeout_s or self.config.runtime.collective_timeout_s)



def _close_suspended(iters: weakref.WeakSet[Iterator[Any]]) -> None:
    """Close the get_data_iter() iterators left at a micro-batch (at exit, or when the manager is dropped).

    A loop left by a break or an exception leaves its iterator suspended, referenced from the user's frames or a
    traceback. Left to the interpreter's last garbage collection, its clean-up (stopping the plan and prefetch
    threads) ran after threads could no longer start or be joined and blocked the exit for ever; weakref.finalize
    runs this at exit, before that."""
    for it in list(iters):
        if inspect.getgeneratorstate(it) == inspect.GEN_SUSPENDED:
            try:
                it.close()
            except Exception as exc:  # noqa: BLE001 - at exit: say what failed, never block or mask the exit
                logging.getLogger("dcp").warning("closing a get_data_iter() left early failed: %s: %s", type(exc).__name__, exc)


def _batches(mgr: DCPManager, max_steps: int | None) -> Iterator[Any]:
    """DCPManager.get_data_iter's generator."""
    step = mgr._loop.step
    if step is None or not step.open or step.forwards == 0:  # else run_epoch refuses to start (mid-step)
        for old in list(mgr._iters):
            if inspect.getgeneratorstate(old) == inspect.GEN_SUSPENDED:
                # an earlier get_data_iter() still referenced, left at a micro-batch: closed before this one
                # reads the dataset, so its prefetch and planning threads stop and its clean-up runs now, not
                # in the middle of this loop
                old.close()
    epoch = mgr.epoch
    if hasattr(mgr.dataset, "set_epoch"):
        mgr.dataset.set_epoch(epoch)
    if mgr.table is None and mgr._plans is None:
        mgr.init_profiler()
    plans = ckpt.resume(mgr._loop.position, mgr._data, mgr.table, mgr.config, mgr.world_size,
                        lambda ids: mgr.epoch_plans(epoch, ids, per_rank=True), mgr.log if mgr.rank == 0 else None)
    finished = False
    try:
        yield from mgr._loop.run_epoch(plans, mgr.engine, max_steps)
        finished = True
    finally:
        close = getattr(plans, "close", None)
        if close is not None:
            close()  # left early (max_steps, a break, an error): stop the planning thread or process now
        if not finished and mgr._board is not None:
            # a break (or an exception) in the user's loop: the other ranks will wait for this one
            step = mgr._step
            at = f"epoch {epoch} step {step.view.step}" if step is not None else f"epoch {epoch}"
            mgr._board.note = f"after leaving get_data_iter() early at {at}"
            mgr._board.enter("outside get_data_iter()")
        mgr.engine.release_casts()  # weight copies held across a step's micro-batches (advanced.cache_weight_casts)


def _open_step(mgr: DCPManager, step: OpenStep) -> None:
    """What every micro-batch of ``step`` shares, set at its first optimize_dynamics: its group's SPContext
    (cached per group) and, under tokens weighting, the loss weight ``sync_divisor / N_step``."""
    group = step.group
    key = (group.first_rank, group.sp_size, group.recompute_layers)
    if key not in mgr._ctx_cache:
        mgr._ctx_cache[key] = mgr.registry.context(group, mgr.rank, attention=mgr.config.runtime.attention)
    step.ctx = mgr._ctx_cache[key]
    if mgr.config.runtime.loss_weighting == "tokens":  # the same for every micro-batch of the step
        step.weight = micro_batch_weight(step.pending, step.n_step, mgr.target_counts, "tokens",
                                         mgr.engine.sync_divisor)


def _own_recompute(mgr: DCPManager, group: Any, ctx: SPContext, r: int) -> SPContext:
    """The group's context at another recompute depth: a micro-batch that runs its own r
    (``StepPlan.mb_recompute_layers``; memory is per micro-batch). Cached per (group, r) like the group's."""
    key = (group.first_rank, group.sp_size, r)
    out = mgr._ctx_cache.get(key)
    if out is None:
        out = mgr._ctx_cache[key] = ctx.replace(recompute_layers=r)
    return out


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
        "this rank's chunk of the batch (a transformers causal LM needs none: DCP prepares it through "
        "dcp.integrations.hf)"
    )


def _no_replan(epoch: int) -> Iterator[StepPlan]:
    raise ManagerError(f"epoch {epoch}: the checkpoint's position needs the epoch's untrained samples planned again "
                       "(another world size, or a custom plan source), which a custom plans= source cannot do: "
                       "resume with the world size the checkpoint was saved at, or without plans=")
    yield  # a generator: raises when the loop asks for its first plan


__all__ = ["DCPManager", "DataMismatchError", "ManagerError", "PlanMismatchError"]
