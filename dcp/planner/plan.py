"""StepPlan: the value that says, for one optimizer step, which ranks form which SP groups and what each runs.

Every rank computes the same plans from the same inputs; ``StepPlan.digest()`` is what ranks compare.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple


class MicroBatch(NamedTuple):
    """What one SP group runs in one forward/backward: samples of one seq_group (or a packed set).

    A NamedTuple rather than a frozen dataclass: the planner builds ~5 of these per rank and step, and a
    tuple is created several times faster (20k per step at W = 4096).
    """

    sample_ids: tuple[int, ...]
    """Dataset indices of the samples, in stream order."""
    seq_lens: tuple[int, ...]
    """Token count of each sample (same order)."""
    seq_group: int
    """seq_group index of the samples; -1 for a packed micro-batch of mixed lengths."""
    time_s: float = 0.0
    """Predicted time of this micro-batch on its SP group."""

    @property
    def tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def size(self) -> int:
        return len(self.sample_ids)


class GroupPlan(NamedTuple):
    """One SP group of a step: a contiguous block of ranks and the micro-batches it accumulates.

    A NamedTuple for the same reason as MicroBatch: a step at W = 4096 holds thousands of groups.
    """

    first_rank: int
    """Lowest rank of the block; the group is ranks first_rank .. first_rank + sp_size - 1."""
    sp_size: int
    """p: ranks sharing each sequence of this group."""
    recompute_layers: int
    """r: layers that recompute activations in backward (r = L: full recompute)."""
    micro_batches: tuple[MicroBatch, ...]
    """The group's micro-batches; len() is its ga_steps. Empty: the ranks idle this step."""

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(range(self.first_rank, self.first_rank + self.sp_size))

    @property
    def ga_steps(self) -> int:
        return len(self.micro_batches)

    @property
    def time_s(self) -> float:
        return sum(mb.time_s for mb in self.micro_batches)

    @property
    def tokens(self) -> int:
        return sum(mb.tokens for mb in self.micro_batches)

    @property
    def samples(self) -> int:
        return sum(mb.size for mb in self.micro_batches)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One optimizer step: SP groups that together cover ranks 0 .. world_size - 1 exactly once."""

    epoch: int
    """Epoch the step belongs to."""
    step: int
    """Step index within the epoch (0-based)."""
    world_size: int
    """W: all ranks of the job."""
    method: str
    """bucket, packed, dcp-inter or dcp-intra."""
    groups: tuple[GroupPlan, ...]
    """SP groups sorted by first rank."""
    _rank_to_group: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = [-1] * self.world_size
        for gi, g in enumerate(self.groups):
            first, p = g.first_rank, g.sp_size
            # slice assignment: one C-level check and write per group, not one Python step per rank
            if first < 0 or first + p > self.world_size or owner[first : first + p].count(-1) != p:
                bad = next((r for r in range(first, first + p) if not 0 <= r < self.world_size or owner[r] != -1),
                           first)
                raise ValueError(
                    f"StepPlan groups overlap or leave the world: rank {bad} of group {gi} "
                    f"(world_size {self.world_size}); the assembler must place each rank once"
                )
            owner[first : first + p] = [gi] * p
        if -1 in owner:
            raise ValueError(f"StepPlan leaves rank {owner.index(-1)} without a group: cover all ranks")
        object.__setattr__(self, "_rank_to_group", tuple(owner))

    # ----- lookups -------------------------------------------------------------------------------
    def group_of(self, rank: int) -> GroupPlan:
        return self.groups[self._rank_to_group[rank]]

    def group_index_of(self, rank: int) -> int:
        return self._rank_to_group[rank]

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(i for g in self.groups for mb in g.micro_batches for i in mb.sample_ids)

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.groups)

    @property
    def samples(self) -> int:
        return sum(g.samples for g in self.groups)

    # ----- predicted cost ----------------------------------------------------------------------
    @property
    def step_time_s(self) -> float:
        """Predicted step time: the slowest group's accumulated time."""
        return max((g.time_s for g in self.groups), default=0.0)

    @property
    def idle_ratio_batch(self) -> float:
        """Paper's per-batch form: Eq. 3 counts every batch (SP group) once, whatever its GPUs; as a ratio of
        the step time, the mean over busy groups of (T* - g_i T_i) / T*."""
        busy = [g for g in self.groups if g.micro_batches]
        t = self.step_time_s
        if not busy or t <= 0:
            return 0.0
        return sum(t - g.time_s for g in busy) / (len(busy) * t)

    @property
    def idle_ratio_gpu(self) -> float:
        """GPU-weighted idle fraction: sum_i p_i (T* - g_i T_i) / (W T*); idle ranks count as fully idle."""
        t = self.step_time_s
        if t <= 0:
            return 0.0
        return sum(g.sp_size * (t - g.time_s) for g in self.groups) / (self.world_size * t)

    # ----- identity ------------------------------------------------------------------------------
    def canonical(self) -> str:
        parts = [f"e{self.epoch}s{self.step}w{self.world_size}{self.method}"]
        for g in self.groups:
            mbs = ";".join(",".join(map(str, mb.sample_ids)) for mb in g.micro_batches)
            parts.append(f"{g.first_rank}:{g.sp_size}:{g.recompute_layers}[{mbs}]")
        return "|".join(parts)

    def digest(self) -> str:
        """sha256 of the plan's decisions (ranks, sizes, recompute, sample ids); equal on every rank."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def summary(self) -> str:
        sps = ",".join(str(g.sp_size) for g in self.groups)
        gas = ",".join(str(g.ga_steps) for g in self.groups)
        rc = ",".join(str(g.recompute_layers) for g in self.groups)
        return f"sp=[{sps}] ga=[{gas}] recompute=[{rc}]"
