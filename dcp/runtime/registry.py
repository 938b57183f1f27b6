"""SPGroupRegistry: the Ulysses groups of this rank, created once at start-up, in one order on every rank.

A rank only ever runs in the blocks that hold it: at most one block per SP size. How the registry creates
them depends on the world (``creation_mode``):

- ``"members"`` (the default group is not bound to a device: gloo, or NCCL initialised lazily): the rank
  creates just its own blocks, with ``new_group(..., use_local_synchronization=True)``: only the members of a
  block call it, so start-up costs each rank one ``new_group`` per SP size (instead of one per block of the
  whole world, about 1.9 x W calls at 4096 ranks), and a later switch of SP size is a look-up, free of
  communication.
- ``"split"`` (the default group is bound to a device, ``init_process_group(device_id=...)``, NCCL's eager
  mode): torch then makes every new group by splitting the world's communicator (``ncclCommSplit``), which
  every rank of the world must enter, members or not; ``new_group`` on a member with local synchronisation
  would wait for ranks that never come. The registry calls ``torch.distributed.split_group`` once per SP
  size, on every rank, with all the blocks of that size as the split (torch's contract: every rank of the
  parent enters, with the same split); each rank gets its own block's group back, or None where it holds
  no block of that size. Start-up is one call per SP size per rank, each one collective over the world
  (one ncclCommSplit: an all-gather of (color, key) over the world's bootstrap network), instead of one per
  block (about 1.9 x W world-wide splits at 4096 ranks). This is what torch's DeviceMesh does for a
  bound world (one split_group per mesh dimension).
- ``"world"`` (everything else): every rank creates every block, in the same order, with the default
  ``new_group`` (collective over the whole world, as torch requires without local synchronisation): a
  bound world where split_group cannot serve (a torch without it, or an explicit ``backend`` other than
  the world's), or a layout that local synchronisation cannot name (below).

torch names a locally synchronised group from its ranks and the number of groups the calling rank already
holds, so every member of a block must have created the same number of groups before it. Every rank creates
its blocks in one order (sizes ascending), and with the usual layouts (SP sizes that divide the ranks per
node, or multiples of it) the members of a block hold the same earlier blocks; ``local_sync_safe`` checks
that from the layout, and a layout where it fails (e.g. SP size 3 on 4 ranks per node beside size 4) falls
back to ``"world"``. (split_group names a group from its ranks alone, so it has no such condition.) Groups
a caller creates between registries must likewise be created by every rank (the default ``new_group``), or
by all members of every later block.

Blocks (contiguous rank ranges) for an SP size p, with W ranks and R ranks per node:
- p <= R: blocks start at node * R + k * p and lie inside one node (the last node may hold fewer than R
  ranks when W is not a multiple of R; blocks that would cross its end are not created);
- p > R: blocks start at multiples of p and end at or before W.

Context layouts (``dcp.planner.layout``): an SP size p whose layout is u x c with c > 1 (past a grouped-query
model's K/V heads) runs its Ulysses all-to-all in the size-u blocks inside its block (the registry adds size
u to the blocks it creates) and its K/V all-gather in the context groups: for block (first, p), the c ranks
``first + ui, first + u + ui, ...`` for each ui < u (``context_groups``). They are created after the blocks,
in the same mode (members only when every member holds the same earlier groups, else every rank; one more
``split_group`` per such size in a bound world), so a rank holds at most one context group per SP size:
groups per rank stay O(number of SP sizes).

Size 1 is always included: the planner gives idle ranks (and any p = 1 setting) a one-rank group, and
``mgr.group`` must then be a one-rank ProcessGroup, never ``None``, because ``group=None`` means the
whole world to torch.distributed: a user's ``all_to_all(..., group=mgr.group)`` would otherwise become a
world-wide collective on the ranks running at SP size 1. It is this rank's own group, made by this rank
alone (``"members"``) or split from the world with every other rank's (``"split"``).
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


def context_groups(blocks: list[tuple[int, int]], context_sizes: dict[int, int]) -> list[tuple[int, tuple[int, ...]]]:
    """(sp_size, ranks) of the context groups of every block whose SP size has a context axis (``context_sizes[p]`` = c > 1), in
    creation order (sizes ascending, then first rank, then Ulysses rank): for block (first, p) with
    u = p / c, ranks ``first + ui, first + u + ui, ..., first + (c-1) u + ui`` for each ui < u
    (dcp.planner.layout: Ulysses inside, context outside)."""
    out = []
    for first, p in sorted(blocks, key=lambda b: (b[1], b[0])):
        c = context_sizes.get(p, 1)
        if c > 1:
            u = p // c
            out.extend((p, tuple(first + ci * u + ui for ci in range(c))) for ui in range(u))
    return out


def context_sizes_for(model: Any, sp_sizes: Iterable[int]) -> dict[int, int]:
    """SP size -> context ranks of its layout for a model shape (``dcp.planner.layout.sp_layout``), for the
    sizes that have a context axis."""
    from dcp.planner.layout import sp_layout

    out = {p: sp_layout(p, model.num_heads, model.kv_heads)[1] for p in sp_sizes}
    return {p: c for p, c in out.items() if c > 1}


def local_sync_safe(blocks: list[tuple[int, int]], extra: list[tuple[int, ...]] = ()) -> bool:
    """True when every member of every group (the blocks, then the ``extra`` rank sets, in creation order)
    holds the same number of earlier groups: then each rank can create only its own groups and the members
    still agree on the groups' names."""
    held: dict[int, int] = {}
    for ranks in [tuple(range(first, first + p)) for first, p in blocks] + list(extra):
        counts = {held.get(r, 0) for r in ranks}
        if len(counts) > 1:
            return False
        for r in ranks:
            held[r] = held.get(r, 0) + 1
    return True


def creation_mode(blocks: list[tuple[int, int]], *, device_bound: bool, can_split: bool,
                  extra: list[tuple[int, ...]] = ()) -> str:
    """How the registry creates the groups of ``blocks`` (module docstring): ``"split"`` (one split_group per
    SP size, every rank), ``"members"`` (new_group with local synchronisation, members only) or ``"world"``
    (new_group for every block on every rank). ``device_bound``: new groups are split from the world's
    communicator (``splits_world_communicator``); ``can_split``: torch.distributed.split_group can serve
    (present, and the requested backend is the world's)."""
    if device_bound:
        return "split" if can_split else "world"
    return "members" if local_sync_safe(blocks, extra) else "world"


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
        """The registry every dcp entry point builds: the config's ranks_per_node, collective timeout and the
        model's layouts (a context axis for SP sizes past its K/V heads, dcp.planner.layout)."""
        sizes = tuple(sp_sizes)
        return cls(world_size, config.planning.ranks_per_node, sizes, timeout_s=config.runtime.collective_timeout_s,
                   context_sizes=context_sizes_for(config.model, sizes))

    def __init__(
        self, world_size: int, ranks_per_node: int, sp_sizes: Iterable[int], *, backend: str | None = None,
        timeout_s: float | None = None, context_sizes: dict[int, int] | None = None,
    ) -> None:
        """``timeout_s``: collective timeout of every SP group (runtime.collective_timeout_s; None: torch's
        default, 30 minutes for gloo). ``context_sizes``: SP size -> its layout's context ranks c (absent or 1:
        plain Ulysses); for c > 1 the registry also holds the Ulysses blocks of size p / c and the context
        groups (``context_groups``), so a rank holds at most one more group per SP size."""
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
        self.context_sizes = {p: c for p, c in (context_sizes or {}).items() if c > 1 and p in self.sp_sizes}
        """SP size -> context ranks of its layout, for the sizes with a context axis."""
        bad = {p: c for p, c in self.context_sizes.items() if p % c}
        if bad:
            raise ValueError(f"context_sizes ({bad}) must divide their SP sizes: take them from "
                             "dcp.planner.layout.sp_layout")
        ulysses = {p // c for p, c in self.context_sizes.items()}
        self.blocks = sp_blocks(world_size, ranks_per_node, set(self.sp_sizes) | ulysses)
        self.context_blocks = context_groups(self.blocks, self.context_sizes)
        """(sp_size, ranks) of every context group, in creation order."""
        self._groups: dict[tuple[int, int], Any] = {}
        self._context: dict[tuple[int, ...], Any] = {}
        self._known = set(self.blocks)
        if not dist.is_initialized():
            if any(p > 1 for _, p in self.blocks):
                raise ValueError(
                    f"sp_sizes ({list(self.sp_sizes)}) contain sizes > 1 but torch.distributed is not initialised: "
                    "call torch.distributed.init_process_group first"
                )
            self._groups = {b: None for b in self.blocks}  # one process, no torch.distributed: nothing to name
            self.creation = "members"
            return
        rank = dist.get_rank()
        can_split = hasattr(dist, "split_group") and (
            backend is None or str(backend).lower() == str(dist.get_backend()).lower())
        self.creation = creation_mode(self.blocks, device_bound=splits_world_communicator(), can_split=can_split,
                                      extra=[r for _, r in self.context_blocks])
        """'members', 'split' or 'world': how this registry's groups were created (module docstring)."""
        if self.creation == "split":
            self._split_by_size(dist, rank, timeout)
        else:
            self._new_groups(dist, rank, timeout, backend)

    def _new_groups(self, dist: Any, rank: int, timeout: Any, backend: str | None) -> None:
        """The blocks, then the context groups, with new_group: members only ("members"), or every rank
        ("world"); the same order on every rank."""
        local = self.creation == "members"
        for first, p in self.blocks:
            mine = first <= rank < first + p
            if local and not mine:
                continue
            ranks = list(range(first, first + p))
            group = dist.new_group(ranks, backend=backend, timeout=timeout, use_local_synchronization=local)
            if mine:
                self._groups[(first, p)] = group
        for _, ranks in self.context_blocks:
            if local and rank not in ranks:
                continue
            group = dist.new_group(list(ranks), backend=backend, timeout=timeout, use_local_synchronization=local)
            if rank in ranks:
                self._context[ranks] = group

    @property
    def local(self) -> bool:
        """True: only this rank's blocks were created, by their members alone (``creation == "members"``)."""
        return self.creation == "members"

    def _split_by_size(self, dist: Any, rank: int, timeout: Any) -> None:
        """One ``split_group`` per SP size, entered by every rank of the world with every block of that size:
        torch requires all ranks of the parent to call it with the same split (NCCL's ncclCommSplit is
        collective over the parent communicator), and hands each rank its own block's group (None to a rank
        in no block of that size, e.g. the short last node of a size that does not fit in it)."""
        for p in sorted({q for _, q in self.blocks}):
            firsts = [f for f, q in self.blocks if q == p]
            group = dist.split_group(split_ranks=[list(range(f, f + p)) for f in firsts], timeout=timeout,
                                     group_desc=f"dcp_sp{p}")
            mine = [f for f in firsts if f <= rank < f + p]
            if mine:
                if group is None:
                    raise RuntimeError(f"torch.distributed.split_group returned no group to rank {rank} for its SP "
                                       f"block (first_rank={mine[0]}, sp_size={p}): the ranks disagree on the "
                                       "split; build the registry with the same arguments on every rank")
                self._groups[(mine[0], p)] = group
        for p in sorted(self.context_sizes):  # one more split per SP size with a context axis
            sets = [r for q, r in self.context_blocks if q == p]
            group = dist.split_group(split_ranks=[list(r) for r in sets], timeout=timeout, group_desc=f"dcp_cp{p}")
            mine = [r for r in sets if rank in r]
            if mine:
                self._context[mine[0]] = group

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
        c = self.context_sizes.get(p, 1)
        layout: dict[str, Any] = {}
        if c > 1:  # Ulysses inside (contiguous u ranks), context outside (stride u): dcp.planner.layout
            u = p // c
            ci, ui = divmod(rank - first, u)
            layout = dict(context_size=c, ulysses_group=self.get(first + ci * u, u) if u > 1 else None,
                          context_group=self._context.get(tuple(first + k * u + ui for k in range(c))))
        return SPContext(group=self.get(first, p), sp_size=p, sp_rank=rank - first,
                         recompute_layers=group_plan.recompute_layers, attention=attention, **layout)

    def context_for_step(self, step_plan: Any, rank: int, attention: str = "auto") -> SPContext:
        """The SPContext of ``rank`` in a StepPlan."""
        return self.context(step_plan.group_of(rank), rank, attention)

    def __repr__(self) -> str:
        return (
            f"SPGroupRegistry(world_size={self.world_size}, ranks_per_node={self.ranks_per_node}, "
            f"sp_sizes={list(self.sp_sizes)}, groups={len(self._groups)} of {len(self.blocks)} blocks, "
            f"context groups={len(self._context)} of {len(self.context_blocks)})"
        )
