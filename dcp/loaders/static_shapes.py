"""Static shapes for compiled models: few distinct shapes, and every rank meets every shape first.

``torch.compile(dynamic=False)`` builds one graph per input shape. With variable lengths two things go
wrong: the number of shapes (and of cached graphs, each holding memory) grows with the number of
distinct lengths, and under data parallelism a rank may meet a new shape late in training and recompile
while the others wait for it in the gradient all-reduce. This module

* pads every sample up to a bucket boundary, so at most ``max_shapes`` padded lengths exist, and gives
  each bucket one row count (``max_tokens_per_batch // boundary``): one shape per bucket;
* orders the epoch so that steps ``0 .. K-1`` (the warm-up) give every rank one micro-batch of shape
  ``k`` at step ``k``: all graphs are compiled at the start, by all ranks at the same step;
* then runs the remaining micro-batches in seeded random order, W of one shape per step where possible.

A bucket with fewer than W micro-batches fills the warm-up with *dummy* micro-batches (no samples, all
padding): run them with loss weight 0, they only trigger compilation. No sample is dropped or repeated.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dcp.loaders._common import Batch, check_lengths, epoch_permutation, fail_arg, fail_config


@dataclass(kw_only=True, slots=True, frozen=True)
class StaticShapeConfig:
    """How lengths are bucketed into a bounded set of static shapes."""

    max_shapes: int = 8
    """Most distinct (rows, padded_len) shapes, i.e. compiled graphs, an epoch may use."""
    bucket_boundaries: tuple[int, ...] = ()
    """Padded lengths, strictly increasing; empty derives max_shapes boundaries from length quantiles."""
    max_tokens_per_batch: int = 32768
    """Token budget of a micro-batch: a bucket of boundary T runs max_tokens_per_batch // T rows."""
    pad_to_multiple_of: int = 8
    """Derived boundaries are rounded up to a multiple of this; explicit ones must be multiples of it."""
    seed: int = 0
    """Seed of the per-epoch shuffle."""

    def __post_init__(self) -> None:
        edges = tuple(self.bucket_boundaries)
        object.__setattr__(self, "bucket_boundaries", edges)
        for name in ("max_shapes", "max_tokens_per_batch", "pad_to_multiple_of"):
            if getattr(self, name) < 1:
                fail_config(f"static_shapes.{name}", getattr(self, name), "must be >= 1", f"set {name} to a positive integer")
        if self.seed < 0:
            fail_config("static_shapes.seed", self.seed, "must be >= 0", "use a non-negative seed")
        if any(e < 1 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            fail_config("static_shapes.bucket_boundaries", list(edges), "must be positive and strictly increasing",
                        "sort the boundaries and remove duplicates")
        if len(edges) > self.max_shapes:
            fail_config("static_shapes.bucket_boundaries", list(edges),
                        f"has {len(edges)} boundaries, more than static_shapes.max_shapes ({self.max_shapes})",
                        "remove boundaries or raise max_shapes")
        bad = [e for e in edges if e % self.pad_to_multiple_of or e > self.max_tokens_per_batch]
        if bad:
            fail_config("static_shapes.bucket_boundaries", list(edges),
                        f"contains {bad}, not multiples of pad_to_multiple_of ({self.pad_to_multiple_of}) "
                        f"or above max_tokens_per_batch ({self.max_tokens_per_batch})",
                        "use multiples of the padding granule that fit the budget")


@dataclass(frozen=True, slots=True)
class StaticShapePlan:
    """An epoch in static shapes: ``steps[k][r]`` is rank r's micro-batch at step k."""

    boundaries: tuple[int, ...]
    """Bucket boundaries (padded lengths) in use."""
    steps: tuple[tuple[Batch, ...], ...]
    """Per step, one micro-batch per rank."""
    warmup_steps: int
    """Steps 0 .. warmup_steps-1 show every rank every shape, one shape per step."""

    @property
    def shapes(self) -> set[tuple[int, int]]:
        return {b.shape for step in self.steps for b in step}

    def for_rank(self, rank: int) -> list[Batch]:
        return [step[rank] for step in self.steps]


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def choose_boundaries(lengths: Sequence[int], config: StaticShapeConfig) -> tuple[int, ...]:
    """The configured boundaries, or the at most ``max_shapes`` boundaries that minimise padding tokens."""
    lengths = check_lengths(lengths)
    longest = max(lengths)
    if config.bucket_boundaries:
        if longest > config.bucket_boundaries[-1]:
            fail_arg("max(lengths)", longest,
                     f"exceeds the last static_shapes.bucket_boundaries ({config.bucket_boundaries[-1]})",
                     "add a larger boundary or truncate long samples")
        return config.bucket_boundaries
    if _round_up(longest, config.pad_to_multiple_of) > config.max_tokens_per_batch:
        fail_arg("max(lengths)", longest, f"exceeds static_shapes.max_tokens_per_batch ({config.max_tokens_per_batch})",
                 "raise the budget or truncate long samples")
    return min_padding_boundaries(lengths, config.max_shapes, config.pad_to_multiple_of)


def min_padding_boundaries(
    lengths: Sequence[int], max_shapes: int, granule: int = 1, max_candidates: int = 512
) -> tuple[int, ...]:
    """At most ``max_shapes`` boundaries (multiples of ``granule``, the last >= every length) minimising the
    total padding ``sum(boundary(s) - s)``, by dynamic programming over candidate boundaries.

    Candidates are the distinct rounded lengths; past ``max_candidates`` of them, evenly spaced quantiles
    of the rounded lengths (then the result is optimal among those candidates). O(max_shapes * C^2).
    """
    vals = -(-np.asarray(lengths, dtype=np.int64) // granule) * granule
    cand = np.unique(vals)
    if len(cand) > max_candidates:
        qs = np.quantile(vals, np.linspace(0, 1, max_candidates + 1)[1:], method="higher")
        cand = np.unique(qs.astype(np.int64))
    slot = np.searchsorted(cand, vals)  # every sample maps to the first candidate >= its rounded length
    count = np.bincount(slot, minlength=len(cand)).astype(float)
    total = np.bincount(slot, weights=np.asarray(lengths, dtype=float), minlength=len(cand))
    pc, ps = np.concatenate([[0.0], np.cumsum(count)]), np.concatenate([[0.0], np.cumsum(total)])
    n = len(cand)
    q = cand.astype(float)
    a_idx, b_idx = np.arange(n)[:, None], np.arange(n)[None, :]
    # cost[a, b]: padding of one bucket holding candidates a..b, padded to cand[b]
    cost = q[None, :] * (pc[None, 1:] - pc[:n, None]) - (ps[None, 1:] - ps[:n, None])
    cost = np.where(a_idx <= b_idx, cost, np.inf)
    best = cost[0].copy()  # one bucket covering candidates 0..b
    back = []
    for _ in range(1, min(max_shapes, n)):
        # last bucket a..b, earlier buckets cover 0..a-1 optimally
        prev = np.concatenate([[np.inf], best[:-1]])
        total_cost = prev[:, None] + cost
        arg = np.argmin(total_cost, axis=0)
        new = total_cost[arg, np.arange(n)]
        keep = best <= new  # fewer buckets can be as good: keep the shorter solution
        back.append(np.where(keep, -1, arg))
        best = np.where(keep, best, new)
    edges, b = [int(cand[-1])], n - 1
    for arg in reversed(back):
        a = int(arg[b])
        if a > 0:
            edges.append(int(cand[a - 1]))
            b = a - 1
    return tuple(sorted(edges))


def plan_static_shapes(
    lengths: Sequence[int], config: StaticShapeConfig, world_size: int, epoch: int = 0
) -> StaticShapePlan:
    """Bucket, batch and order one epoch for ``world_size`` ranks (the same plan on every rank)."""
    lengths = check_lengths(lengths)
    if world_size < 1:
        fail_arg("world_size", world_size, "must be >= 1", "pass the number of data-parallel ranks")
    edges = choose_boundaries(lengths, config)
    buckets: list[list[int]] = [[] for _ in edges]
    for i in epoch_permutation(len(lengths), config.seed, epoch).tolist():
        buckets[bisect.bisect_left(edges, lengths[i])].append(i)
    # one row count per bucket, hence one shape per bucket
    per_bucket: list[list[Batch]] = []
    for b, ids in enumerate(buckets):
        rows = max(1, config.max_tokens_per_batch // edges[b])
        chunks = [ids[s : s + rows] for s in range(0, len(ids), rows)]
        per_bucket.append([Batch(tuple(c), tuple(lengths[i] for i in c), edges[b], rows, epoch) for c in chunks])
    used = [b for b, mbs in enumerate(per_bucket) if mbs]

    def dummy(b: int) -> Batch:
        return Batch((), (), edges[b], max(1, config.max_tokens_per_batch // edges[b]), epoch)

    # Warm-up: at step k every rank runs bucket used[k]. All ranks compile the same graph in the same
    # step, so no rank waits in the all-reduce for another rank's compilation later on.
    steps: list[tuple[Batch, ...]] = []
    for b in used:
        take, per_bucket[b] = per_bucket[b][:world_size], per_bucket[b][world_size:]
        steps.append(tuple(take + [dummy(b)] * (world_size - len(take))))
    warmup = len(steps)
    # Main phase: groups of W same-shape micro-batches (equal work per rank in a step) in random order,
    # then the per-bucket leftovers (< W each) mixed into the final steps.
    rng = np.random.default_rng([config.seed, epoch, 1])
    groups, leftovers = [], []
    for b in used:
        mbs = per_bucket[b]
        full = len(mbs) - len(mbs) % world_size
        groups += [tuple(mbs[s : s + world_size]) for s in range(0, full, world_size)]
        leftovers += mbs[full:]
    steps += [groups[g] for g in rng.permutation(len(groups)).tolist()]
    for s in range(0, len(leftovers), world_size):
        part = leftovers[s : s + world_size]
        # a dummy of an already-compiled shape fills the last step; it compiles nothing new
        steps.append(tuple(part + [dummy(used[0])] * (world_size - len(part))))
    return StaticShapePlan(boundaries=edges, steps=tuple(steps), warmup_steps=warmup)
