"""The state of the step this rank is running, as values instead of loose manager attributes.

``OpenStep`` is the step between its start (``DCPManager`` begins it when ``get_data_iter`` reaches its
plan) and the start of the next one; ``FinishedStep`` is what is left of it for the stats exchange. The
``StepTally`` they carry keeps the forwards' losses and counts (summed on the run's device, fp64 / int64, when a
logged step's stats are exchanged: nothing is computed or read back before) and the step's timer spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dcp.distributed.device import Span
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.stepview import RankStep


class ManagerError(ValueError):
    """The manager was used out of order (e.g. a step without engine.step()); the message says the fix."""


@dataclass(slots=True)
class StepTally:
    """What this rank's forwards and timers add up during one step.

    The forwards' losses and counts are kept as given (the loss detached) and summed only when read, which is
    when a logged step's stats are exchanged: an unlogged step (most of them, ``runtime.log_every``) runs no
    tensor op per micro-batch for them on the training thread."""

    device: torch.device
    """The run's device: where the sums are computed."""
    losses: list[torch.Tensor] = field(default_factory=list)
    """Each forward's loss_sum, detached (one element, any floating dtype, on the run's device or another)."""
    counts: list[Any] = field(default_factory=list)
    """Each forward's labelled-token count: an int, or an integer tensor whose elements are summed."""
    has_count: bool = False
    """True once a forward reported a count (a model may report none)."""
    busy: list[tuple[int, Span]] = field(default_factory=list)
    """(+1 / -1, span): time inside ``mgr.profile`` blocks (+1) minus the gradient syncs inside them (-1)."""
    syncs: list[Span] = field(default_factory=list)
    """The step's gradient sync + update spans (engine.step at the boundary)."""
    busy_host_s: float = 0.0
    """Busy seconds read from the host clock (a CPU run's ``mgr.profile`` blocks, their syncs taken out), added
    as floats: what ``busy`` would hold as spans on a host clock (``dcp.runtime.profiling.MicroBatchTimer``)."""

    @classmethod
    def zeros(cls, device: torch.device | str) -> StepTally:
        return cls(device=torch.device(device))

    def add(self, loss: torch.Tensor, count: object | None) -> None:
        """Add one forward's (loss_sum, count); nothing is computed or read back to the host here."""
        self.losses.append(loss.detach())
        if count is not None:
            self.counts.append(count)
            self.has_count = True

    @property
    def loss(self) -> torch.Tensor:
        """Sum of the forwards' loss_sum, float64 on the run's device (each converted to fp64 before adding)."""
        if not self.losses:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return torch.stack([x.reshape(()).to(self.device, torch.float64) for x in self.losses]).sum()

    @property
    def count(self) -> torch.Tensor:
        """Sum of the forwards' labelled-token counts, int64 on the run's device."""
        ints = sum(c for c in self.counts if not isinstance(c, torch.Tensor))
        total = torch.full((), ints, dtype=torch.int64, device=self.device)
        tensors = [c.detach().to(self.device, torch.int64).sum() for c in self.counts if isinstance(c, torch.Tensor)]
        return total + torch.stack(tensors).sum() if tensors else total

    def busy_s(self) -> float:
        """Busy seconds of the step (reads CUDA events: call only when the step's stats are exchanged)."""
        return self.busy_host_s + sum(sign * span.seconds() for sign, span in self.busy)


@dataclass(slots=True)
class OpenStep:
    """The step being run: its plan (as this rank's view), this rank's group, the micro-batch in flight and the
    step's tally."""

    view: RankStep
    """The step's plan as this rank runs it (dcp.runtime.stepview): what the loop reads of the plan."""
    group: GroupPlan
    """This rank's SP group in the plan: ``view.group``, kept as a field because it is read per micro-batch."""
    global_step: int
    """The optimizer step this step will be once done (the manager's global_step + 1 at its start)."""
    t0: float
    """perf_counter() at the step's start."""
    tally: StepTally
    mb_index: int = -1
    """Index of the micro-batch in flight among ``group.micro_batches`` (-1 before the first)."""
    mb_t: float = 0.0
    """time.time() when the micro-batch in flight was handed out (its phase's start, ``micro_batch_phase``)."""
    pending: MicroBatch | None = None
    """The micro-batch get_data_iter() yielded last (None before the first)."""
    applied: bool = False
    """True once optimize_dynamics() set up ``pending`` (SP context, loss weight)."""
    open: bool = True
    """False once the step's gradient sync ran (engine.step at the boundary, or the idle rank's)."""
    loss_weight: float = 0.0
    """The weight engine.backward applies to the pending micro-batch's loss_sum."""
    forwards: int = 0
    """Forwards with gradients this rank ran in the step so far."""
    mb_forwards: int = 0
    """Forwards with gradients of the pending micro-batch (one is the contract)."""
    where: str = ""
    """" of epoch E step S": the end of the step's phase names (the loop builds it once, not per micro-batch)."""
    last_index: int = -1
    """``group.ga_steps - 1``: the index of this rank's last micro-batch of the step."""
    ctx: Any = None
    """The SPContext of ``group`` (set by the manager at the step's first optimize_dynamics; one per step)."""
    weight: float | None = None
    """The loss weight of every micro-batch of the step when it is the same for all (tokens weighting:
    ``sync_divisor / N_step``), computed once; None: computed per micro-batch."""

    def __post_init__(self) -> None:
        self.last_index = self.group.ga_steps - 1

    def micro_batch_phase(self) -> tuple[str, float]:
        """(phase, time entered) of the micro-batch in flight, formatted when read: the phase board follows it
        (``PhaseBoard.follow``), from the heartbeat thread too (two attribute reads: a pair read as the loop
        moves on is at most one micro-batch off, and the next read is right)."""
        t, i = self.mb_t, self.mb_index
        return f"micro-batch {i + 1}/{self.last_index + 1}{self.where}", t

    @property
    def n_step(self) -> int:
        """Labelled tokens (or samples) of the whole step: the loss weights' denominator."""
        return self.view.n_step

    @property
    def trained(self) -> Any:
        """The step's sample ids, ascending, checked new in the epoch when the plan was prepared
        (``RankStep.trained``); None: the position checks them as the step finishes."""
        return self.view.trained

    @property
    def plan(self) -> StepPlan:
        """The whole step plan (``view.plan``)."""
        return self.view.plan

    def count_forward(self) -> None:
        """A forward with gradients ran on the pending micro-batch; a second one raises (its loss and tokens
        would count twice in the step, and its backward twice in the gradients). The loop counts the first
        one inline (``dcp.runtime.loop``, per micro-batch) and calls this for a second."""
        self.forwards += 1
        self.mb_forwards += 1
        if self.mb_forwards > 1:
            raise ManagerError(
                f"micro-batch {self.mb_index + 1}/{len(self.group.micro_batches)}{self.where} ran its forward twice "
                "with gradients: DCP counts every forward's loss_sum and tokens into the step (and its backward "
                "into the gradients); run one forward and one backward per micro-batch (an extra forward for "
                "logging belongs under torch.no_grad(), which is not counted)")

    def in_last_micro_batch(self) -> bool:
        """True from the forward to the step() of this rank's last micro-batch of the step: its backward
        gives the parameters their final gradients of the step (the ddp engine starts their sync then)."""
        return self.open and self.mb_index == self.last_index

    def finish(self, now: float) -> FinishedStep:
        # a rank that ran no forward this step (idle) counted 0 tokens; -1 marks "model gave no count"
        return FinishedStep(view=self.view, global_step=self.global_step, step_time_s=now - self.t0,
                            tally=self.tally, has_count=self.tally.has_count or not self.group.micro_batches)


@dataclass(frozen=True, slots=True)
class FinishedStep:
    """A step whose successor started: what the stats exchange reads of it."""

    view: RankStep
    """The step's plan as this rank ran it (its epoch, step, tokens, predicted idle and summary are read)."""
    global_step: int
    step_time_s: float
    """Wall time from this step's start to the next step's start on this rank."""
    tally: StepTally
    has_count: bool
    """False when this rank's model ran forwards but reported no count."""

    def host_stats(self) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """(loss sum, count or None, busy seconds) on the host: the step's one device-to-host copy."""
        return self.tally.loss.cpu(), self.tally.count.cpu() if self.has_count else None, self.tally.busy_s()
