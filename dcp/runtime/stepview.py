"""What one rank needs of a step plan, computed where the plan is handed over, not on the training thread.

A step plan at 4096 ranks holds 130,000-690,000 samples in 130,000-370,000 micro-batches (``dcp bench scale``'s
paper-scale plans). Before a step runs, a rank needs from it its digest (folded into the agreement exchange's
running digest), N_step (the loss weights' denominator), its own SP group, the step's tokens
(``runtime.lr_scaling``) and, once the step is done, the samples it trained (the epoch's position) and, on a
logged step, the predicted idle and the plan's summary; a resumed epoch's plan also has its sample ids mapped
back to the dataset's. Each of those reads the whole global plan: O(W) work per step. ``StepViews`` computes them for one
rank as each plan is made, on the plan-ahead thread (``dcp.planner.ahead.PlanAhead(prepare=...)``) or, with
``advanced.plan_ahead = "process"``, in the planner's child process (a ``StepViews`` pickles; at 4096 ranks its
5-40 ms a step would otherwise hold the training process's GIL), so the training thread does O(its own
micro-batches) per step. ``RankStep`` is the result: a value the step loop (``dcp.runtime.loop``) reads.

``StepViews`` also checks, plan by plan, that no sample is planned twice in the epoch's plan segment (the
samples of earlier steps, and those the segment started with, are not planned again): the check that
``EpochPosition.record`` makes as a step finishes, made here ahead of time, so the position only marks the
step's samples (``EpochPosition.record_checked``). A plan that fails it raises ``PositionError`` from the
``next()`` that would return it, before the step runs (not after it trained). Pure numpy.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp.planner.plan import GroupPlan, StepPlan
from dcp.runtime.position import PositionError, mark_new
from dcp.runtime.weighting import step_normaliser


@dataclass(frozen=True, slots=True)
class RankStep:
    """One step plan as one rank runs it (see the module docstring)."""

    plan: StepPlan
    """The plan, its sample ids the dataset's."""
    group: GroupPlan | None
    """This rank's SP group in the plan (None when the plan is for another world size: the loop refuses it)."""
    digest: str
    """``plan.digest()``."""
    n_step: int
    """N_step of the step (``dcp.runtime.weighting.step_normaliser``) under the run's loss weighting."""
    tokens: int
    """``plan.tokens``: the step's tokens (``runtime.lr_scaling``, the step's stats)."""
    trained: np.ndarray | None
    """The step's sample ids, ascending, checked to be new in the epoch's segment (None: not checked)."""
    idle_ratio: float
    """``plan.idle_ratio_gpu``: the idle fraction the planner predicts (a logged step's stats; 0.9-2.8 ms of the
    training thread at 4096 ranks when it was computed there)."""
    summary: str
    """``plan.summary()`` (a logged step's stats; 0.3-1 ms at 4096 ranks)."""

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @property
    def step(self) -> int:
        return self.plan.step

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def sample_id_array(self) -> np.ndarray:
        """The step's sample ids (ascending when checked; the plan's order otherwise): what a resume's skipped
        steps mark as trained."""
        return self.trained if self.trained is not None else self.plan.sample_id_array

    @classmethod
    def of(cls, plan: StepPlan, group: GroupPlan | None, *, n_step: int, trained: np.ndarray | None) -> RankStep:
        """The view of ``plan`` for the rank in ``group``: the whole-plan reads (digest, tokens, predicted idle,
        summary) made here, where the view is made."""
        return cls(plan=plan, group=group, digest=plan.digest(), n_step=n_step, tokens=plan.tokens, trained=trained,
                   idle_ratio=plan.idle_ratio_gpu, summary=plan.summary())


class StepViews:
    """Turns the step plans of one epoch segment into ``RankStep`` values for ``rank``, in order.

    ``ids``: the plans were made over the sub-dataset ``ids`` (sample k of a plan is dataset sample ``ids[k]``,
    the samples the segment has not trained); None: over the whole dataset, of which the samples in ``done``
    are already trained. Either way a plan may hold only samples not trained and not planned before."""

    def __init__(self, *, rank: int, world_size: int, target_counts: np.ndarray, loss_weighting: str,
                 ids: np.ndarray | None = None, done: np.ndarray | None = None) -> None:
        self.rank, self.world_size, self.loss_weighting = rank, world_size, loss_weighting
        self.target_counts = np.asarray(target_counts, dtype=np.int64)
        self.ids = None if ids is None else np.asarray(ids, dtype=np.int64)
        if self.ids is not None and done is None and _identity(self.ids, len(self.target_counts)):
            # the whole dataset in order (a fresh epoch): the plans' ids are the dataset's, so none is remapped (at
            # 4096 ranks a remap cost 3-23 ms a step of the thread that prepares the plans)
            self.ids = None
        if self.ids is not None:
            self._seen = np.zeros(len(self.ids), dtype=bool)  # in the sub-dataset's ids: none planned yet
        else:
            self._seen = np.zeros(len(self.target_counts), dtype=bool) if done is None else done.copy()

    def __call__(self, plan: StepPlan) -> RankStep:
        if plan.world_size != self.world_size:  # refused by the loop with its own message; nothing to look up
            return RankStep.of(plan, None, n_step=0, trained=None)
        self._check_new(plan)
        if self.ids is not None:
            plan = plan.with_sample_ids(self.ids[plan.sample_id_array])
        return RankStep.of(plan, plan.group_of(self.rank),
                           n_step=step_normaliser(plan, self.target_counts, self.loss_weighting),
                           trained=np.sort(plan.sample_id_array))

    def _check_new(self, plan: StepPlan) -> None:
        """Raise unless every sample of ``plan`` is in range, once in it, and in no earlier plan of the segment."""
        ids, seen = plan.sample_id_array, self._seen
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(seen)):
            raise PositionError(
                f"epoch {plan.epoch} step {plan.step} plans sample ids outside [0, {len(seen)}) (from "
                f"{int(ids.min())} to {int(ids.max())}): this is a bug in the plan source; report it with the plan")
        again = mark_new(seen, ids)
        if again is None:
            return
        if self.ids is not None and not isinstance(again, str):
            again = [int(self.ids[i]) for i in again]  # ascending ids map to ascending dataset ids
        raise PositionError(f"epoch {plan.epoch} step {plan.step} plans samples {again} a second time in this "
                            "epoch: this is a bug in the plan source; report it with the plan")


def _identity(ids: np.ndarray, n: int) -> bool:
    return len(ids) == n and bool((ids == np.arange(n)).all())


class PlanFeed:
    """The prepared plans of one epoch segment (a ``PlanAhead``), whose ``close()`` stops them at once and
    frees them on a helper thread instead of the training thread.

    When ``get_data_iter`` ends (the epoch's end, ``max_steps``, a break) the plan source still holds plans:
    those computed ahead and not run, the last ones taken. At 4096 ranks a plan holds ~20,000 micro-batches
    and freeing the few held took ~100 ms of the training thread's CPU (``dcp bench scale``'s ``host_ms_max``).
    ``close`` itself stops the source (``PlanAhead.close``: the planning thread joined, bounded by one plan's
    computation, and a planner child process ended), so nothing plans on after the loop; only the freeing
    runs on the helper thread."""

    __slots__ = ("_plans",)

    def __init__(self, plans: Iterator[Any]) -> None:
        self._plans: Iterator[Any] | None = plans

    def __iter__(self) -> PlanFeed:
        return self

    def __next__(self) -> Any:
        if self._plans is None:
            raise StopIteration
        return next(self._plans)

    def close(self) -> None:
        """Stop the plan source now, then drop it on a helper thread (idempotent)."""
        if self._plans is None:
            return
        # stopped here: when get_data_iter returns, no planning thread runs on and a planner child process
        # has exited (only the freeing of the plans it held is left to the helper)
        close = getattr(self._plans, "close", None)
        if close is not None:
            close()
        del close  # a bound method: a reference to the plans this thread must not keep
        # handed over in a box that the helper empties, so that this thread keeps no reference that could
        # be the last one dropped (the helper may finish before this call returns)
        box, self._plans = [self._plans], None
        if sys.is_finalizing():
            # a new thread never starts while the interpreter finalizes (start() would wait for it for ever)
            _drop(box)
            return
        threading.Thread(target=_drop, args=(box,), name="dcp-plan-free", daemon=True).start()


def _drop(box: list[Any]) -> None:
    plans = box.pop()
    del plans  # the last reference: the plans are freed here, on this thread


def rank_steps(plans: Iterable[Any], views: StepViews) -> Iterator[RankStep]:
    """``views`` applied to ``plans`` on the calling thread (a ``RankStep`` passes unchanged): for a plan source
    that is not prepared on the plan-ahead thread (a custom ``plans=`` source)."""
    it = iter(plans)
    try:
        for plan in it:
            yield plan if isinstance(plan, RankStep) else views(plan)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


__all__ = ["PlanFeed", "RankStep", "StepViews", "rank_steps"]
