"""Step assembly: an epoch's shuffled stream becomes a sequence of StepPlans (any planning.method).

``EpochPlanner`` iterates the StepPlans of one epoch. For the baselines it hands over to
``dcp.planner.baselines``; for DCP-inter and DCP-intra it prepares the epoch once (``dcp.planner.epoch``:
settings, micro-batches and their times as an ``EpochArrays``) and then plans one step per ``next()``
(``dcp.planner.step``), each starting at the first unconsumed micro-batch (the head):

1. Window (``dcp.planner.window``): unconsumed micro-batches from the head in release order, up to a GPU-work
   bound, never past ``lookahead_samples`` stream positions after the head.
2. Target (``window.target``): T* = k x T_long (the window's longest micro-batch, which the step takes; the
   largest k <= Gmax whose window work and fill allow it); the window is cut to WINDOW_WORK_FACTOR x W x T* of
   work. At the epoch's end what is left is spread over the last steps.
3. Packing (``dcp.planner.packing``; from 512 ranks ``dcp.planner.rounds``), then a small local search and
   re-packs of an idle step (``dcp.planner.improve``, ``dcp.planner.step``).
4. Placement, fillers on free ranks and the StepPlan (``dcp.planner.build``).

The tuned constants of all of these are in ``dcp.planner.tuning``. Every sample is in exactly one micro-batch
and every micro-batch is consumed once; each step takes the head, so the epoch ends. The plan depends only on
(lengths, table, config, world_size, epoch): numpy's seeded Generator, stable sorts and ordered containers,
never hash() or set iteration order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from dcp.config import PEER_METHODS, DCPConfig
from dcp.planner.baselines import baseline_plan
from dcp.planner.epoch import EpochArrays, EpochProgress, default_lookahead, lookahead_samples, prepare_epoch
from dcp.planner.group import Budget
from dcp.planner.intra import Setting
from dcp.planner.plan import StepPlan
from dcp.planner.slots import Lockstep
from dcp.planner.source import epoch_input
from dcp.planner.step import plan_step
from dcp.planner.step_tokens import micro_batch_tokens, step_budget
from dcp.planner.stream import PlanningError
from dcp.planner.syncend import SyncEnd
from dcp.planner.table import ProfileTable
from dcp.planner.tail import is_penultimate, plan_budgeted, plan_tail
from dcp.planner.tuning import BULK_MIN_RANKS

BASELINES = ("bucket", "packed", "bucket-search")
"""Methods planned by ``dcp.planner.baselines``; the others are DCP's."""


class EpochPlanner:
    """Iterates the StepPlans of one epoch (any planning.method). Deterministic for (seed, epoch)."""

    def __init__(
        self, lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, epoch: int = 0,
        *, shapes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """``shapes``: (frames, spatial tokens) per sample for 2D data, whose micro-batches pad T and S
        separately (``dcp.planner.stream``); None for 1D data."""
        inp = self.input = epoch_input(lengths, table, config, world_size, epoch, shapes=shapes)
        self.config, self.table, self.world_size, self.epoch = config, table, world_size, epoch
        self.method = config.planning.method
        self.lengths, self.groups, self.shapes, self.order = inp.lengths, inp.groups, inp.shapes, inp.order
        self.settings: dict[int, Setting] = {}
        """Primary setting per seq_group (DCP methods; empty for baselines)."""
        self.batch_sizes: dict[int, int] = {}
        """Bucket baselines only: micro-batch size per seq_group."""
        self.baseline_sp_size = 0
        """Bucket and packed baselines: the fixed SP size (0 for DCP)."""
        self.lookahead_samples = lookahead_samples(config, world_size)
        """Look-ahead window in stream positions (DCP methods; see default_lookahead for the 0 default)."""
        self.arrays: EpochArrays | None = None
        """DCP methods: the epoch's prepared arrays (None for baselines)."""
        if self.method in PEER_METHODS:  # the simulator's peers (dcp.planner.peers): planned, never run
            from dcp.planner.peers import plan_peer_epoch

            self._steps = iter(plan_peer_epoch(lengths, table, config, world_size, epoch, shapes=shapes))
        elif self.method in BASELINES:
            self._steps, self.baseline_sp_size, self.batch_sizes = baseline_plan(inp)
        else:
            ep = self.arrays = prepare_epoch(inp)
            self.settings, self.lookahead_samples = ep.settings, ep.lookahead_samples
            cfg = inp.config.planning  # its tokens_per_step resolved (step_tokens.batch_tokens)
            self._steps = _dcp_steps(ep, cfg.tokens_per_step, cfg.step_tokens_bounds, SyncEnd.of(inp, ep.times))
            lockstep = Lockstep.of(inp, ep.times)  # fsdp2-zero3: the ranks go through micro-batch slots together
            if lockstep is not None:
                self._steps = map(lockstep, self._steps)

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def unit_time_s(self, seq_group: int, sp_size: int) -> float:
        """Predicted time for an SP group of sp_size ranks to run one full micro-batch of seq_group (DCP)."""
        if self.arrays is None or sp_size not in self.arrays.by_sp.get(seq_group, {}):
            raise KeyError(f"no DCP setting for seq_group {seq_group} at sp_size {sp_size}")
        return self.arrays.unit_time[(seq_group, sp_size)]

    def __iter__(self) -> Iterator[StepPlan]:
        return self

    def __next__(self) -> StepPlan:
        return next(self._steps)


def _dcp_steps(ep: EpochArrays, tokens_per_step: int = 0, bounds: tuple[float, float] = (0.5, 2.0),
               sync_end: SyncEnd | None = None) -> Iterator[StepPlan]:
    """DCP's steps: each starts at the first micro-batch no earlier step consumed, until none is left. With
    ``tokens_per_step`` (planning.tokens_per_step), the epoch takes about total / target steps, each sized by
    ``step_tokens.step_budget`` (an equal share of what is left, within the bounds). ``sync_end``: each plan's
    groups end on a last micro-batch that hides the gradient sync where that ends the step earlier."""
    n = ep.num_micro_batches
    prog = EpochProgress(n)
    consumed = prog.consumed
    head, step, done = 0, 0, 0
    mb_tok = micro_batch_tokens(ep.flat_lens, ep.mb_flat, ep.mb_count) if tokens_per_step else None
    total = int(mb_tok.sum()) if mb_tok is not None else 0
    while True:
        head = consumed.find(0, head)  # the first unconsumed micro-batch (C speed: a step takes ~10^5)
        if head < 0:
            return
        budget = None
        if mb_tok is not None:
            want, fewest, most = step_budget(step, done, total, tokens_per_step, bounds)
            budget = Budget(want, most, mb_tok, fewest, tokens_per_step)
            if is_penultimate(step, done, total, tokens_per_step, bounds):
                # the last two steps planned together (``dcp.planner.tail``); from 512 ranks its other shares only
                # where the plain tail leaves the bounds (each try is two full numpy packings there: t1d-long at
                # 4096 ranks, 400k samples, all tries took an epoch's planning from 3.7 to 7.8 s)
                for plan in plan_tail(ep, prog, step, done, tokens_per_step, bounds, mb_tok,
                                      for_time=ep.world_size < BULK_MIN_RANKS):
                    done += plan.tokens
                    step += 1
                    yield sync_end(plan) if sync_end is not None else plan
                continue
        if budget is None:
            plan = plan_step(ep, prog, step, head)
        else:
            plan = plan_budgeted(ep, prog, step, head, budget, bounds[0] * tokens_per_step)
        if mb_tok is not None:  # (a sum over the step's samples: only a global batch needs it)
            done += plan.tokens
        yield sync_end(plan) if sync_end is not None else plan
        step += 1


def plan_epoch(
    lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, epoch: int = 0,
    *, shapes: Sequence[Sequence[int]] | None = None,
) -> list[StepPlan]:
    """All StepPlans of one epoch for config.planning.method (dcp-inter, dcp-intra, bucket, packed)."""
    return list(EpochPlanner(lengths, table, config, world_size, epoch, shapes=shapes))


__all__ = ["EpochPlanner", "PlanningError", "default_lookahead", "lookahead_samples", "plan_epoch"]
