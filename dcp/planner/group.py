"""The SP group a step is packed into, while it is being packed (``packing``, ``rounds``, ``improve``,
``balance``, ``build``): mutable, since the local search, the head's join and the balance move micro-batches
between groups. Placement turns the kept groups into the StepPlan's ``GroupPlan`` values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np


@dataclass(slots=True)
class Group:
    """One SP group of a step being packed."""

    p: int
    """Its SP size (ranks)."""
    r: int
    """Its recompute depth (layers); each micro-batch in it still runs at its own depth (the memory rule)."""
    load: float
    """The sum of its micro-batches' times at this group's p, each at its own depth (seconds)."""
    items: list[int] = field(default_factory=list)
    """Its micro-batches (epoch indices), in the order they joined."""

    def copy(self) -> Group:
        """The same group with its own list of micro-batches (a packing kept aside while another is tried)."""
        return Group(self.p, self.r, self.load, list(self.items))


def held_tokens(groups: list[Group], mb_tok: np.ndarray) -> int:
    """Tokens of the ``groups``' micro-batches (``mb_tok``: every micro-batch's, integers), in one sum: a step at
    4096 ranks has thousands of groups, and a sum per group was 12 ms of its planning."""
    items = [k for gr in groups for k in gr.items]
    return int(mb_tok[items].sum()) if items else 0


class Budget(NamedTuple):
    """A step's share of the global batch (``planning.tokens_per_step``), as ``step_tokens.step_budget`` sets it."""

    want: float
    """The tokens the step wants."""
    most: float
    """The most tokens it may hold (the upper bound, or less near the epoch's end)."""
    mb_tok: object
    """The tokens of every micro-batch of the epoch (an int64 array, by epoch index)."""
    fewest: float
    """The fewest tokens it should hold (at least the lower bound)."""
    target: float
    """The global batch in tokens (``planning.tokens_per_step``)."""


class Packed(NamedTuple):
    """A packing of one step, as the re-packs compare them (``dcp.planner.step``)."""

    groups: list[Group]
    """The step's groups."""
    idle: float
    """Their GPU-weighted idle share (``improve.idle``)."""
    win: object
    """The window they were packed from (an index array)."""
    head_t: tuple[int, float] | None
    """Where the head joined another group's p: (that group's index, the head's time there); None when the
    head runs in a group of its own kind."""


class Balanced(NamedTuple):
    """A step at a global batch, packed and balanced (``dcp.planner.step``), as its re-packs compare them."""

    t_star: float
    """Its target time T* (seconds)."""
    win: object
    """The window it was packed from (an index array)."""
    groups: list[Group]
    """Its groups (none empty)."""
    head_t: tuple[int, float] | None
    """Where the head joined another group's p (as ``Packed.head_t``)."""
    joined: dict[int, float]
    """The times of the micro-batches that the balance moved to another setting (seconds)."""


class Shed(NamedTuple):
    """A step balanced by shedding micro-batches between its groups (``dcp.planner.balance``)."""

    time: float
    """Its time: its longest group's load (seconds)."""
    groups: list[Group]
    """Its groups."""
    fixed: dict[int, float]
    """The times of the micro-batches moved to another setting (seconds)."""
