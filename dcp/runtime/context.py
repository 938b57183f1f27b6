"""SPContext: what one micro-batch's forward needs to know about its sequence-parallel group.

A context is a value: the manager builds one per micro-batch (``SPGroupRegistry.context``) and passes it
explicitly to the model; nothing here is global. The sharding helpers define the one layout every
component agrees on: a sequence of ``length`` tokens is padded to a multiple of ``sp_size`` and rank
``sp_rank`` of the group holds the contiguous chunk ``shard_range(padded, sp_size, sp_rank)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ATTENTION_BACKENDS = ("auto", "sdpa", "flash")


class SPContextError(ValueError):
    """An SPContext or a sharding request breaks a rule; the message names field, value, rule and fix."""


def pad_to_multiple(length: int, p: int) -> int:
    """Smallest multiple of ``p`` that is >= ``length`` (the padded sequence length of an SP group)."""
    if p < 1:
        raise SPContextError(f"sp_size ({p}) must be >= 1: pass the number of ranks sharing the sequence")
    if length < 0:
        raise SPContextError(f"length ({length}) must be >= 0: pass a token count")
    return -(-length // p) * p


def shard_range(padded_len: int, p: int, sp_rank: int) -> tuple[int, int]:
    """Half-open [start, end) of the padded sequence held by ``sp_rank``: one contiguous chunk per rank.

    Contiguous chunks in rank order are what makes Ulysses correct: the all-to-all gathers the chunks of
    ranks 0..p-1 in order, which rebuilds the full sequence without any index shuffling.
    """
    if p < 1:
        raise SPContextError(f"sp_size ({p}) must be >= 1: pass the number of ranks sharing the sequence")
    if padded_len % p:
        raise SPContextError(
            f"padded_len ({padded_len}) is not a multiple of sp_size ({p}): pad it with pad_to_multiple first"
        )
    if not 0 <= sp_rank < p:
        raise SPContextError(f"sp_rank ({sp_rank}) must be in [0, {p}): pass this rank's index inside its SP group")
    chunk = padded_len // p
    return sp_rank * chunk, (sp_rank + 1) * chunk


@dataclass(kw_only=True, slots=True, frozen=True)
class SPContext:
    """The SP group, this rank's place in it, and per-micro-batch runtime switches."""

    group: Any = None
    """torch ProcessGroup of the SP group; None when sp_size == 1 (no communication at all)."""
    sp_size: int = 1
    """p: ranks sharing each sequence of the micro-batch."""
    sp_rank: int = 0
    """This rank's index inside the SP group (0 .. sp_size - 1); decides which sequence chunk it holds."""
    recompute_layers: int = 0
    """r: the first r layers are checkpointed (activations recomputed in backward)."""
    attention: str = "auto"
    """Local attention kernel: 'sdpa', 'flash', or 'auto' (flash-attn on CUDA when installed, else SDPA)."""

    def __post_init__(self) -> None:
        if self.sp_size < 1:
            raise SPContextError(f"SPContext.sp_size ({self.sp_size}) must be >= 1: use 1 for no sequence parallelism")
        if not 0 <= self.sp_rank < self.sp_size:
            raise SPContextError(
                f"SPContext.sp_rank ({self.sp_rank}) must be in [0, sp_size={self.sp_size}): "
                "pass rank - first_rank of the SP group"
            )
        if self.sp_size > 1 and self.group is None:
            raise SPContextError(
                f"SPContext.group (None) is required when sp_size ({self.sp_size}) > 1: "
                "take the group from SPGroupRegistry.get(first_rank, sp_size)"
            )
        if self.recompute_layers < 0:
            raise SPContextError(
                f"SPContext.recompute_layers ({self.recompute_layers}) must be >= 0: use 0 for no recompute"
            )
        if self.attention not in ATTENTION_BACKENDS:
            raise SPContextError(
                f"SPContext.attention ({self.attention!r}) is not one of {list(ATTENTION_BACKENDS)}: pick one of those"
            )

    @classmethod
    def single(cls, recompute_layers: int = 0, attention: str = "auto") -> SPContext:
        """Context of one process holding whole sequences (sp_size 1, no group)."""
        return cls(recompute_layers=recompute_layers, attention=attention)

    def replace(self, **changes: Any) -> SPContext:
        """A copy with some fields changed (e.g. ``ctx.replace(recompute_layers=4)``)."""
        return dataclasses.replace(self, **changes)

    def padded_len(self, length: int) -> int:
        """Length of a sequence of ``length`` tokens once padded for this SP group."""
        return pad_to_multiple(length, self.sp_size)

    def shard(self, length: int) -> tuple[int, int]:
        """[start, end) of this rank's chunk of a sequence of ``length`` tokens (before padding)."""
        return shard_range(pad_to_multiple(length, self.sp_size), self.sp_size, self.sp_rank)
