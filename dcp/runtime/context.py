"""SPContext: what one micro-batch's forward needs to know about its sequence-parallel group.

A context is a value: the manager builds one per micro-batch (``SPGroupRegistry.context``) and passes it
explicitly to the model; nothing here is global. The sharding helpers define the one layout every
component agrees on: with plain Ulysses (``context_size`` 1) a sequence of ``length`` tokens is padded to
a multiple of ``sp_size`` and rank ``sp_rank`` of the group holds the contiguous chunk
``shard_range(padded, sp_size, sp_rank)``. With a context axis (layout ``ulysses x context``,
``dcp.planner.layout``) it is padded to a multiple of ``2 * sp_size`` and a rank holds the ranges
``layout_shard_ranges`` gives: its Ulysses piece of its context rank's front and back chunks
(``dcp.runtime.context_parallel``).
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


def balanced_chunks(padded: int, context: int, context_rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two [start, end) chunks of the padded sequence held by ``context_rank``: i and 2c-1-i of 2c (causal
    load balance: every context rank's queries then see the same number of keys)."""
    if context < 1 or padded % (2 * context):
        raise SPContextError(f"padded length ({padded}) is not a multiple of 2 * context ({2 * context}): pad it "
                             "with SPContext.padded_len first")
    if not 0 <= context_rank < context:
        raise SPContextError(f"context_rank ({context_rank}) must be in [0, {context}): pass sp_rank // ulysses")
    chunk, back = padded // (2 * context), 2 * context - 1 - context_rank
    return (context_rank * chunk, (context_rank + 1) * chunk), (back * chunk, (back + 1) * chunk)


def layout_shard_ranges(padded: int, ulysses: int, context: int, sp_rank: int) -> tuple[tuple[int, int], ...]:
    """[start, end) ranges of the padded sequence held by ``sp_rank`` = context_rank * ulysses + ulysses_rank:
    the ulysses_rank-th of u equal pieces of its context rank's front chunk then back chunk (one range when
    context is 1: ``shard_range``). The Ulysses all-to-all gathers the pieces in rank order, which rebuilds
    exactly the context rank's two chunks."""
    if context == 1:
        return (shard_range(padded, ulysses, sp_rank),)
    ci, ui = divmod(sp_rank, ulysses)
    chunks = balanced_chunks(padded, context, ci)
    chunk, piece = padded // (2 * context), padded // (context * ulysses)
    lo, hi = ui * piece, (ui + 1) * piece  # offsets into the context rank's 2L tokens
    out = []
    for k, (start, _) in enumerate(chunks):
        a, b = max(lo, k * chunk), min(hi, (k + 1) * chunk)
        if a < b:
            out.append((start + a - k * chunk, start + b - k * chunk))
    if len(out) == 2 and out[0][1] == out[1][0]:  # the two chunks meet (context rank c-1): one range
        out = [(out[0][0], out[1][1])]
    return tuple(out)


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
    context_size: int = 1
    """c: context-parallel ranks of the layout ``(sp_size / c) x c``; 1 is plain Ulysses over the group."""
    ulysses_group: Any = None
    """ProcessGroup of this rank's sp_size / c Ulysses ranks (contiguous) when context_size > 1."""
    context_group: Any = None
    """ProcessGroup of this rank's c context ranks (stride sp_size / c) when context_size > 1."""

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
        c = self.context_size
        if c < 1 or self.sp_size % c:
            raise SPContextError(f"SPContext.context_size ({c}) must be >= 1 and divide sp_size ({self.sp_size}): "
                                 "take the layout from dcp.planner.layout.sp_layout")
        if c > 1 and (self.context_group is None or (self.ulysses_size > 1 and self.ulysses_group is None)):
            raise SPContextError(f"SPContext.context_group / ulysses_group are required when context_size ({c}) > 1: "
                                 "take them from SPGroupRegistry.context")
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

    @property
    def ulysses_size(self) -> int:
        """u: ranks of this rank's Ulysses group (sp_size when there is no context axis)."""
        return self.sp_size // self.context_size

    @property
    def context_rank(self) -> int:
        """This rank's index in its context group (0 without a context axis)."""
        return self.sp_rank // self.ulysses_size

    @property
    def a2a_group(self) -> Any:
        """The group of the Ulysses all-to-all: the whole SP group, or the Ulysses group of a context layout."""
        return self.group if self.context_size == 1 else self.ulysses_group

    def padded_len(self, length: int) -> int:
        """Length of a sequence of ``length`` tokens once padded for this SP group (2c chunks with a context axis)."""
        return pad_to_multiple(length, self.sp_size * (2 if self.context_size > 1 else 1))

    def shard(self, length: int) -> tuple[int, int]:
        """[start, end) of this rank's chunk of a sequence of ``length`` tokens (before padding); plain Ulysses
        only: a context layout holds two chunks (``shard_ranges``)."""
        if self.context_size > 1:
            raise SPContextError(f"SPContext.shard: a context layout (context_size {self.context_size}) holds two "
                                 "chunks per rank, not one range: use SPContext.shard_ranges")
        return shard_range(pad_to_multiple(length, self.sp_size), self.sp_size, self.sp_rank)

    def shard_ranges(self, length: int) -> tuple[tuple[int, int], ...]:
        """[start, end) ranges of the padded sequence this rank holds, in the order its tokens are laid out."""
        return layout_shard_ranges(self.padded_len(length), self.ulysses_size, self.context_size, self.sp_rank)
