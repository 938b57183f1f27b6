"""What an epoch is planned from: the lengths, their seq_groups, the shuffled order and the settings that
every planning method (DCP and the baselines) reads. Both ``dcp.planner.assemble`` and
``dcp.planner.baselines`` import it; it imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dcp.config import DCPConfig
from dcp.planner.step_tokens import with_batch
from dcp.planner.stream import PlanningError, check_shapes, seq_groups_of, shuffled_order
from dcp.planner.table import ProfileTable


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochInput:
    """The inputs of one epoch's plans (the plans depend on nothing else)."""

    lengths: np.ndarray
    """Tokens of every sample (int64), by sample id."""
    groups: np.ndarray
    """seq_group of every sample (int64), by sample id."""
    shapes: np.ndarray | None
    """(frames, spatial tokens) of every sample for 2D data, else None."""
    order: np.ndarray
    """The epoch's shuffled stream of sample ids (seeded by planning.seed and the epoch)."""
    table: ProfileTable
    """The profile table every time comes from."""
    config: DCPConfig
    """The run config; its planning section decides the method and its limits."""
    world_size: int
    """W: ranks of the job."""
    epoch: int
    """The epoch index (changes the shuffle)."""

    @property
    def method(self) -> str:
        return self.config.planning.method

    @property
    def num_samples(self) -> int:
        return len(self.lengths)


def epoch_input(
    lengths: Sequence[int], table: ProfileTable, config: DCPConfig, world_size: int, epoch: int = 0,
    *, shapes: Sequence[Sequence[int]] | None = None,
) -> EpochInput:
    """Checks the inputs and derives the seq_groups, the shuffled order and the global batch in tokens
    (``planning.tokens_per_step`` of the config it holds, resolved by ``step_tokens.batch_tokens``)."""
    if world_size < 1:
        raise PlanningError(f"world_size ({world_size}) must be >= 1: pass the number of ranks")
    lens, groups = seq_groups_of(lengths, table)
    config = with_batch(config, lens, world_size)  # the global batch as tokens, the same for every method
    return EpochInput(lengths=lens, groups=groups, shapes=check_shapes(shapes, lens),
                      order=shuffled_order(len(lens), config.planning.seed, epoch), table=table, config=config,
                      world_size=world_size, epoch=epoch)
