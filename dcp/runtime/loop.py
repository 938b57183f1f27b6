"""Plan iteration and collation on one rank: opens and closes steps, runs the agreement exchange.

For each step plan of the epoch the loop closes the previous step (exchanging its stats when it is a
logged step), opens the new one (``OpenStep``: this rank's group, N_step), and yields this rank's
micro-batches collated on the run's device; a rank without micro-batches in a step joins the step's
gradient sync from here (``engine.idle_step``). Each finished step marks its samples trained in the epoch's
``EpochPosition`` (dcp.runtime.position), which is what a checkpoint saves, with the optimizer steps. While an
epoch runs the rank's heartbeat beats (dcp.runtime.phases), so a rank killed in a collective is named.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from dcp.config import DCPConfig
from dcp.distributed.device import Span
from dcp.planner.plan import StepPlan
from dcp.runtime import guard
from dcp.runtime.contracts import forward_pair
from dcp.runtime.exchange import AgreementExchange, DataMismatchError, PlanMismatchError
from dcp.runtime.log import StepStats, get_logger
from dcp.runtime.phases import PhaseBoard
from dcp.runtime.position import EpochPosition
from dcp.runtime.prefetch import BatchPrefetcher
from dcp.runtime.profiling import Measurements
from dcp.runtime.step import FinishedStep, ManagerError, OpenStep, StepTally
from dcp.runtime.stepview import RankStep, StepViews, rank_steps

_NOT_PULLED = object()
"""run_epoch's marker: the next plan was not pulled ahead for prefetching."""


class StepLoop:
    """The step state machine behind ``get_data_iter`` (one per manager)."""

    def __init__(self, config: DCPConfig, *, rank: int, world_size: int, dataset: Any, device: torch.device,
                 target_counts: np.ndarray, exchange: AgreementExchange, board: PhaseBoard | None,
                 timings: Measurements) -> None:
        self.config, self.rank, self.world_size, self.dataset, self.device = config, rank, world_size, dataset, device
        self.target_counts, self.exchange, self.board, self.timings = target_counts, exchange, board, timings
        self.position = EpochPosition.start(0, len(target_counts))
        """Which samples of the current epoch are trained, and the plan segment (dcp.runtime.position)."""
        self.global_step = 0
        """Optimizer steps taken since the manager was created (or since the checkpoint it resumed from)."""
        self.step: OpenStep | None = None
        """The step being run (None before the first, at the end of an epoch and after a pause)."""
        self.step_stats: list[StepStats] = []
        """One record per exchanged step (the same on every rank), filled one step late."""
        self.prefetched = 0
        """Micro-batches that were collated on the prefetch thread while the previous one trained."""
        self.skipped: dict[int, list[int]] = {}
        """epoch -> sample ids of its steps the non-finite guard skipped since the manager was created."""
        self.skipped_steps = 0
        """Steps the non-finite guard skipped (runtime.nonfinite = 'skip') since the manager was created."""
        self.lr: Any = None
        """runtime.lr_scaling: scales the LR of each step by its tokens as it opens (dcp.runtime.lr), or None."""

    @property
    def epoch(self) -> int:
        return self.position.epoch

    @property
    def step_in_epoch(self) -> int:
        """Finished steps of the current plan segment (of the epoch, unless a resume re-planned its rest)."""
        return self.position.steps

    def phase(self, what: str) -> str:
        step = self.step
        return f"{what} of epoch {self.epoch} step {step.view.step}" if step is not None else f"{what} of epoch {self.epoch}"

    def run_epoch(self, plans: Iterator[RankStep | StepPlan], engine: Any, max_steps: int | None) -> Iterator[Any]:
        """This rank's micro-batches of ``plans``, the epoch's steps not yet done (EpochPosition.resume).

        Plans are pulled one at a time: the first is checked across ranks before it runs, and the next
        one only when this rank's last micro-batch of a step is yielded (its micro-batches are then
        collated on the prefetch thread, a chunk at a time, while that one trains: dcp.runtime.prefetch). ``plans`` are RankSteps prepared on the
        plan-ahead thread (``DCPManager.epoch_plans(..., per_rank=True)``); a plain StepPlan is prepared here (dcp.runtime.stepview)."""
        self._check_not_left_mid_step()
        views = StepViews(rank=self.rank, world_size=self.world_size, target_counts=self.target_counts,
                          loss_weighting=self.config.runtime.loss_weighting, done=self.position.done)
        watch_s = self.config.advanced.peer_timeout_s
        with self.board.heartbeat(watch_s=watch_s) if self.board is not None else nullcontext():
            yield from self._run(rank_steps(plans, views), engine, max_steps)

    def _check_not_left_mid_step(self) -> None:
        """A get_data_iter() left inside a step whose forward ran (a break) cannot be restarted: that step's
        gradients are partly accumulated, and the new iterator would run the step again from its start."""
        step = self.step
        if step is None or not step.open:
            return
        if step.forwards == 0:
            self.step = None  # left before any forward of the step: nothing was accumulated, start it again
            return
        n = len(step.group.micro_batches)
        raise ManagerError(
            f"get_data_iter() was called again after the previous one was left inside epoch {self.epoch} step "
            f"{step.view.step} (after micro-batch {step.mb_index + 1}/{n}, before the step's engine.step()): that "
            "step's gradients are partly accumulated and it would run again from its first micro-batch; leave the "
            "loop at a step boundary (get_data_iter(max_steps=N)), or build a new manager and restore the model "
            "and optimizer from a checkpoint")

    def _run(self, todo: Iterator[RankStep], engine: Any, max_steps: int | None) -> Iterator[Any]:
        epoch, done = self.epoch, 0
        mode = self.config.advanced.prefetch
        fetch = BatchPrefetcher(self.dataset, self.device,
                                enabled=mode == "on" or (mode == "auto" and self.device.type == "cuda"))
        try:
            view, first, wanted = next(todo, None), True, False
            while view is not None:
                if max_steps is not None and done >= max_steps:
                    self.begin_step(None, pause_step=view.step)  # flush stats here
                    return
                done += 1
                if view.group is None:
                    raise PlanMismatchError(
                        f"plan world_size ({view.world_size}) != torch.distributed world size "
                        f"({self.world_size}): plan with the world size of the job"
                    )
                step = self.begin_step(view, first=first)
                first, upcoming, refused = False, _NOT_PULLED, None
                if not step.group.micro_batches:
                    engine.idle_step()
                    self.step_done(0.0)
                mbs, board = step.group.micro_batches, self.board
                n = len(mbs)
                ahead, wanted = wanted, False  # ahead: the step's micro-batches are wanted (at the last step's end)
                for i, mb in enumerate(mbs):
                    batch = fetch.take(mb.sample_ids)
                    if getattr(batch, "seq_lens", mb.seq_lens) != mb.seq_lens:
                        raise _lengths_differ(batch, mb, epoch, view.step)
                    if not ahead:  # collated here; the step's later ones are collated ahead on the prefetch thread
                        fetch.want([m.sample_ids for m in mbs[1:]])
                        ahead = True
                    if i + 1 == n and fetch.enabled and (max_steps is None or done < max_steps):
                        upcoming, refused = _pull_ahead(todo)
                        if upcoming is not None and upcoming.group is not None:
                            fetch.want([m.sample_ids for m in upcoming.group.micro_batches])  # collated as this trains
                            wanted = True
                    step.mb_index, step.pending, step.applied, step.mb_forwards = i, mb, False, 0
                    step.mb_t = time.time()
                    if board is not None and (i == 0 or not board.following):
                        # the step's first micro-batch is written to the store now (a rank that dies in it is named
                        # there); the board then follows the step, and the heartbeat writes later ones at its beats
                        # (followed again after a collective entered inside the step)
                        board.follow(step.micro_batch_phase)
                    yield batch
                if step.open:
                    raise ManagerError(
                        f"epoch {epoch} step {view.step}: engine.step() was not called after the last "
                        "micro-batch (the step's gradient sync never ran): call model.step() after every "
                        "model.backward(loss)"
                    )
                if refused is not None:
                    raise refused
                view = next(todo, None) if upcoming is _NOT_PULLED else upcoming
        finally:
            self.prefetched += fetch.prefetched
            fetch.close()
        self.begin_step(None)  # flush the last step's stats; all ranks must end the epoch together
        self.position = EpochPosition.start(epoch + 1, self.position.num_samples)

    def begin_step(self, view: RankStep | None, *, pause_step: int | None = None,
                   first: bool = False) -> OpenStep | None:
        """Close the previous step and open ``view``'s (None: the end of the epoch, or a pause when
        ``pause_step`` is given); ``first``: the first step of this get_data_iter() call. O(this rank's
        micro-batches): what reads the whole plan was computed with ``view`` (dcp.runtime.stepview).

        The agreement exchange runs when the finished step is a logged one, at the end of the epoch and at a
        pause, and (``check_plan_hash``) at the first step; never on other steps."""
        now = time.perf_counter()
        done = self.step.finish(now) if self.step is not None else None
        self.step = None
        if view is not None:  # folded into the running digest: compared at the next exchange
            self.exchange.note_plan(view.epoch, view.step, view.digest)
        # a logged step's stats are exchanged, and the last step's at the end of the epoch or a pause
        logged = done is not None and (view is None or self.exchange.wants_stats(done.global_step))
        if logged or (self.config.advanced.check_plan_hash and (first or view is None)):
            # position in the loop: 0 the first step, 1 a step, 2 the end of the epoch, 3 a pause
            kind = (0 if first else 1) if view is not None else (3 if pause_step is not None else 2)
            step = view.step if view is not None else (pause_step if pause_step is not None else -1)
            where = {0: f"epoch {self.epoch} (its step plans)", 1: f"epoch {self.epoch} step {step}",
                     2: f"end of epoch {self.epoch}", 3: f"epoch {self.epoch} step {step}"}[kind]
            self._exchange_stats(done if logged else None, where=where, kind=kind, step=-1 if kind == 0 else step)
            if first and self.board is not None:
                self.board.note = ""  # every rank is back in step
        if view is None:
            return None
        self.step = OpenStep(view=view, group=view.group, global_step=self.global_step + 1, t0=now,
                             tally=StepTally.zeros(self.device), where=f" of epoch {self.epoch} step {view.step}")
        if self.lr is not None:
            self.lr.apply(view.tokens)
        return self.step

    def _exchange_stats(self, done: FinishedStep | None, *, where: str, kind: int, step: int) -> None:
        stats = done.host_stats() if done is not None else None  # the step's one device-to-host copy
        self.timings.resolve()
        table = self.exchange.run(stats, where=where, kind=kind, epoch=self.epoch, step=step)
        if done is not None:
            self.step_stats.append(self.exchange.step_stats(done, table))

    def forward_out(self, out: Any, *, idle: StepTally) -> torch.Tensor:
        """A forward returned ``out``: its (loss_sum, token_count) checked (``forward_pair``: its fast path for the
        usual pair, else the full check and a one-line refusal with the fix) and counted into the step (one
        forward with gradients per micro-batch; a no-grad forward, e.g. for logging, is not counted), outside
        any step into ``idle``; returns the loss."""
        loss, count = forward_pair(out)
        step = self.step
        if step is None:
            idle.add(loss, count)
        elif torch.is_grad_enabled():
            if step.mb_forwards:
                step.count_forward()  # a second forward of the micro-batch: raises
            step.forwards += 1  # StepOpen.count_forward and StepTally.add inlined: this runs per micro-batch
            step.mb_forwards = 1
            tally = step.tally
            tally.losses.append(loss.detach())
            if count is not None:
                tally.counts.append(count)
                tally.has_count = True
        return loss

    def finite_step(self, grads: list[torch.Tensor]) -> bool:
        """The non-finite guard of the open step (dcp.runtime.guard), inside its gradient sync: True to apply it."""
        step = self.step
        losses = step.tally.losses
        flag = guard.local_flags(losses, grads, self.device)
        verdict = guard.agree(flag, rank=self.rank, world_size=self.world_size, group=None, losses=losses,
                              sample_ids=[mb.sample_ids for mb in step.group.micro_batches],
                              where=f"epoch {self.epoch} step {step.view.step} (optimizer step {step.global_step})")
        if verdict.finite:
            return True
        if self.config.runtime.nonfinite == "stop":
            raise guard.NonFiniteError(
                f"{verdict.message}: the step was not applied (runtime.nonfinite = 'stop'); fix the data or the "
                "model (e.g. a lower learning rate), resume from the last checkpoint, or set runtime.nonfinite = "
                "'skip' to drop such steps")
        ids = np.asarray(step.view.sample_id_array, dtype=np.int64)
        self.position.skipped.extend(int(i) for i in ids)  # this epoch's, in its checkpoint
        self.skipped.setdefault(self.epoch, []).extend(int(i) for i in ids)
        self.skipped_steps += 1
        if self.rank == 0:
            get_logger(self.rank).warning(
                f"{verdict.message}: step skipped (runtime.nonfinite = 'skip'), its {len(ids)} samples recorded as "
                f"skipped; {self.skipped_steps} step{'s' if self.skipped_steps > 1 else ''} skipped so far")
        return False

    def step_done(self, sync: Span | float) -> None:
        """The open step's gradient sync + update ran: close it and count it."""
        step = self.step
        step.tally.syncs.append(sync if isinstance(sync, Span) else Span(seconds=float(sync)))
        step.open = False
        if step.trained is not None:  # checked new in the epoch when the plan was prepared (dcp.runtime.stepview)
            self.position.record_checked(step.trained)
        else:
            self.position.record(step.view.sample_id_array, step.view.step)  # every sample once per epoch
        self.global_step += 1


def _lengths_differ(batch: Any, mb: Any, epoch: int, step: int) -> DataMismatchError:
    """The refusal of a collated micro-batch whose tokens differ from the lengths it was planned with."""
    got, ids = tuple(batch.seq_lens), tuple(getattr(batch, "sample_ids", ()) or mb.sample_ids)
    k = next((k for k, (a, b) in enumerate(zip(got, mb.seq_lens, strict=False)) if a != b), min(len(got), len(mb.seq_lens)))
    if k < len(got) and k < len(mb.seq_lens):
        what = f"sample {ids[k] if k < len(ids) else mb.sample_ids[k]} collated to {got[k]} tokens, lengths() said {mb.seq_lens[k]}"
    else:
        what = f"samples {list(mb.sample_ids)} collated to {len(got)} sequences, not {len(mb.seq_lens)}"
    return DataMismatchError(
        f"epoch {epoch} step {step}: {what}: the plan's memory and time figures come from dataset.lengths(); make "
        "lengths() return each sample's collated token count (after truncation and special tokens)")


def _pull_ahead(todo: Iterator[RankStep]) -> tuple[RankStep | None, Exception | None]:
    """(the next step's view or None at the epoch's end, the error that pulling it raised). A refused plan (a
    planner error, a PositionError) is raised by the loop where it would meet it without prefetching: after the
    current step's sync, which the ranks idle in that step already wait in; raised while the step's last
    micro-batch is handed out, the step would never finish."""
    try:
        return next(todo, None), None
    except Exception as exc:
        return None, exc
