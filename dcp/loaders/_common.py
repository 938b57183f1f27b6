"""Values shared by the loaders: the batch they emit, input checks and the per-epoch shuffle.

Pure Python (numpy only): every loader here can be planned, tested and benchmarked without torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dcp.config import fail


class LoaderError(ValueError):
    """An argument given to a loader breaks a rule; the message names it, its value, the rule and a fix."""


fail_config = fail
"""A loader config error (ConfigError): ``path (value) rule: fix``."""

fail_arg = functools.partial(fail, error=LoaderError)
"""A loader argument error (LoaderError): ``name (value) rule: fix``."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One micro-batch: the samples one rank runs in one forward/backward, and the shape it runs at."""

    sample_ids: tuple[int, ...]
    """Dataset indices in the order the loader chose them. Empty for a dummy (fully padded) micro-batch."""
    seq_lens: tuple[int, ...]
    """Token count of every sample, same order."""
    padded_len: int
    """Sequence dim of the tensor the batch becomes: the longest sample (padded batch), the sum of the
    lengths (packed batch) or a bucket boundary (static shapes)."""
    rows: int
    """Batch dim of that tensor: the number of samples (padded), 1 (packed), or a fixed row count that
    includes padding rows (same-shape and static-shape micro-batches)."""
    epoch: int = 0
    """Loader epoch when the batch was formed (at an epoch boundary the pool still holds earlier samples)."""

    @property
    def size(self) -> int:
        return len(self.sample_ids)

    @property
    def tokens(self) -> int:
        """Real (non-padding) tokens."""
        return sum(self.seq_lens)

    @property
    def padded_tokens(self) -> int:
        """Tokens of the tensor actually computed on: rows * padded_len."""
        return self.rows * self.padded_len

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.padded_len)

    def samples(self) -> list[tuple[int, int]]:
        """(sample id, length) pairs: the form the DCP planner consumes."""
        return list(zip(self.sample_ids, self.seq_lens, strict=True))


def padded_batch(pairs: Sequence[tuple[int, int]], epoch: int = 0) -> Batch:
    ids = tuple(i for i, _ in pairs)
    lens = tuple(n for _, n in pairs)
    return Batch(ids, lens, max(lens, default=0), len(ids), epoch)


def packed_batch(pairs: Sequence[tuple[int, int]], epoch: int = 0) -> Batch:
    ids = tuple(i for i, _ in pairs)
    lens = tuple(n for _, n in pairs)
    return Batch(ids, lens, sum(lens), 1 if ids else 0, epoch)


def check_lengths(lengths: Sequence[int], name: str = "lengths") -> list[int]:
    """Return the lengths as a list of positive ints, or raise LoaderError naming the first bad one (a float
    such as 5.7 is refused, never truncated: dcp.planner.lengths.check_lengths, the planner's own rule)."""
    from dcp.config import MAX_TOKENS
    from dcp.planner.lengths import check_lengths as check_token_counts

    # whole numbers within int64 first (the planner's rule and message); the >= 1 rule keeps its loader message
    out = check_token_counts(lengths, what=name, error=LoaderError, low=-MAX_TOKENS, allow_empty=True)
    if not out:
        fail_arg(name, [], "is empty", "pass one token count per dataset sample")
    bad = next((i for i, n in enumerate(out) if n < 1), None)
    if bad is not None:
        fail_arg(f"{name}[{bad}]", out[bad], "must be >= 1", "drop empty samples before batching")
    return out


def check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        fail_arg("world_size", world_size, "must be >= 1", "pass the number of data-parallel ranks")
    if not 0 <= rank < world_size:
        fail_arg("rank", rank, f"must be in [0, {world_size})", "pass this process's data-parallel rank")


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The same permutation on every rank for a given (seed, epoch), different for every epoch."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)
