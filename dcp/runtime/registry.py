"""SPGroupRegistry: the Ulysses groups of this rank, created once at start-up, in one order on every rank.

A rank only ever runs in the blocks that hold it: at most one block per SP size. The registry creates
just those, with ``new_group(..., use_local_synchronization=True)``: only the members of a block call it,
so start-up costs each rank one ``new_group`` per SP size (instead of one per block of the whole world,
about 1.9 x W calls at 4096 ranks), and a later switch of SP size is a look-up, free of communication.

torch names such a group from its ranks and the number of groups the calling rank already holds, so every
member of a block must have created the same number of groups before it. Every rank creates its blocks
in one order (sizes ascending), and with the usual layouts (SP sizes that divide the ranks per node, or
multiples of it) the members of a block hold the same earlier blocks; ``local_sync_safe`` checks that
from the layout, and a layout where it fails (e.g. SP size 3 on 4 ranks per node beside size 4) falls back
to creating every block on every rank in the same order (collective over the whole world, as torch
requires without local synchronisation). Groups a caller creates between registries must likewise be
created by every rank (the default ``new_group``), or by all members of every later block.

Blocks (contiguous rank ranges) for an SP size p, with W ranks and R ranks per node:
- p <= R: blocks start at node * R + k * p and lie inside one node (the last node may hold fewer than R
  ranks when W is not a multiple of R; blocks that would cross its end are not created);
- p > R: blocks start at multiples of p and end at or before W.

Size 1 is always included: the planner gives idle ranks (and any p = 1 setting) a one-rank group, and
``mgr.group`` must then be a one-rank ProcessGroup, never ``None``, because ``group=None`` means the
whole world to torch.distributed: a user's ``all_to_all(..., group=mgr.group)`` would otherwise become a
world-wide collective on the ranks running at SP size 1. It is this rank's own group, made by this rank
alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dcp.runtime.context import SPContext


class UnknownSPGroupError(KeyError, ValueError):
    """The requested (first_rank, sp_size) block was not created by the registry."""

    def __str__(self) -> str:  # KeyError would otherwise print the message with quotes
        return str(self.args[0])


def sp_blocks(world_size: int, ranks_per_node: int, sp_sizes: Iterable[int]) -> list[tuple[int, int]]:
    """The (first_rank, sp_size) blocks for every size, in creation order (sizes ascending, then rank)."""
    if world_size < 1:
        raise ValueError(f"world_size ({world_size}) must be >= 1: pass torch.distributed.get_world_size()")
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node ({ranks_per_node}) must be >= 1: pass the GPUs per node, e.g. 8")
    sizes = sorted(set(sp_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sp_sizes ({list(sp_sizes)}) must be positive integers: e.g. [1, 2, 4, 8]")
    sizes = sorted(set(sizes) | {1})
    blocks: list[tuple[int, int]] = []
    for p in sizes:
        if p <= ranks_per_node:
            for node_start in range(0, world_size, ranks_per_node):
                node_end = min(node_start + ranks_per_node, world_size)
                blocks.extend((first, p) for first in range(node_start, node_end - p + 1, p))
        else:
            blocks.extend((first, p) for first in range(0, world_size - p + 1, p))
    return blocks


def local_sync_safe(blocks: list[tuple[int, int]]) -> bool:
    """True when every member of every block holds the same number of earlier blocks (in creation order):
    then each rank can create only its own blocks and the members still agree on the groups' names."""
    held: dict[int, int] = {}
    for first, p in blocks:
        counts = {held.get(r, 0) for r in range(first, first + p)}
        if len(counts) > 1:
            return False
        for r in range(first, first + p):
            held[r] = held.get(r, 0) + 1
    return True


def splits_world_communicator() -> bool:
    """True when new groups are split from the world's communicator (a default group bound to a device, as
    ``init_process_group(device_id=...)`` makes): every rank must then take part in every group's creation."""
    import torch.distributed as dist

    group = dist.distributed_c10d._get_default_group()
    return getattr(group, "bound_device_id", None) is not None


class SPGroupRegistry:
    """This rank's SP process groups; construct it on all ranks after ``init_process_group``."""

    @classmethod
    def for_config(cls, config: Any, world_size: int, sp_sizes: Iterable[int]) -> SPGroupRegistry:
        """The registry every dcp entry point builds: the config's ranks_per_node and collective timeout."""
        return cls(world_size, config.planning.ranks_per_node, sp_sizes, timeout_s=config.runtime.collective_timeout_s)

    def __init__(
        self, world_size: int, ranks_per_node: int, sp_sizes: Iterable[int], *, backend: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """``timeout_s``: collective timeout of every SP group (runtime.collective_timeout_s; None: torch's
        default, 30 minutes for gloo)."""
        import math
        from datetime import timedelta

        import torch.distributed as dist

        if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s ({timeout_s!r}) must be a finite number of seconds > 0: e.g. 300")
        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
        self.timeout_s = timeout_s
        if dist.is_initialized() and dist.get_world_size() != world_size:
            raise ValueError(
                f"world_size ({world_size}) differs from torch.distributed's ({dist.get_world_size()}): "
                "pass torch.distributed.get_world_size()"
            )
        self.world_size = world_size
        self.ranks_per_node = ranks_per_node
        self.sp_sizes = tuple(sorted(set(sp_sizes)))
        self.blocks = sp_blocks(world_size, ranks_per_node, self.sp_sizes)
        self._groups: dict[tuple[int, int], Any] = {}
        self._known = set(self.blocks)
        if not dist.is_initialized():
            if any(p > 1 for _, p in self.blocks):
                raise ValueError(
                    f"sp_sizes ({list(self.sp_sizes)}) contain sizes > 1 but torch.distributed is not initialised: "
                    "call torch.distributed.init_process_group first"
                )
            self._groups = {b: None for b in self.blocks}  # one process, no torch.distributed: nothing to name
            self.local = True
            return
        rank = dist.get_rank()
        self.local = local_sync_safe(self.blocks) and not splits_world_communicator()
        """True: only this rank's blocks were created (members only); False: every block, on every rank."""
        for first, p in self.blocks:
            mine = first <= rank < first + p
            if self.local and not mine:
                continue
            ranks = list(range(first, first + p))
            group = dist.new_group(ranks, backend=backend, timeout=timeout, use_local_synchronization=self.local)
            if mine:
                self._groups[(first, p)] = group

    def get(self, first_rank: int, sp_size: int) -> Any:
        """ProcessGroup of ranks first_rank .. first_rank + sp_size - 1 (a one-rank group for sp_size 1;
        None only without torch.distributed; ``GroupMember.NON_GROUP_MEMBER`` for a block not holding this
        rank, as torch's new_group returns to non-members)."""
        key = (first_rank, sp_size)
        if key not in self._known:
            valid = sorted({f for f, p in self.blocks if p == sp_size})
            raise UnknownSPGroupError(
                f"SP block (first_rank={first_rank}, sp_size={sp_size}) was not created by the registry "
                f"(world_size {self.world_size}, ranks_per_node {self.ranks_per_node}, sp_sizes "
                f"{list(self.sp_sizes)}); valid first ranks for sp_size {sp_size}: {valid}: make the planner "
                "use the same world_size, ranks_per_node and sp_sizes"
            )
        if key not in self._groups:  # a block of other ranks: torch's marker, as new_group returns to non-members
            import torch.distributed as dist

            return dist.GroupMember.NON_GROUP_MEMBER
        return self._groups[key]

    def context(self, group_plan: Any, rank: int, attention: str = "auto") -> SPContext:
        """The SPContext of ``rank`` for a GroupPlan (dcp.planner.plan) that contains it."""
        first, p = group_plan.first_rank, group_plan.sp_size
        if not first <= rank < first + p:
            raise ValueError(
                f"rank ({rank}) is not in the GroupPlan's ranks [{first}, {first + p}): pass the group of this rank "
                "(StepPlan.group_of(rank))"
            )
        return SPContext(
            group=self.get(first, p),
            sp_size=p,
            sp_rank=rank - first,
            recompute_layers=group_plan.recompute_layers,
            attention=attention,
        )

    def context_for_step(self, step_plan: Any, rank: int, attention: str = "auto") -> SPContext:
        """The SPContext of ``rank`` in a StepPlan."""
        return self.context(step_plan.group_of(rank), rank, attention)

    def __repr__(self) -> str:
        return (
            f"SPGroupRegistry(world_size={self.world_size}, ranks_per_node={self.ranks_per_node}, "
            f"sp_sizes={list(self.sp_sizes)}, groups={len(self._groups)} of {len(self.blocks)} blocks)"
        )
