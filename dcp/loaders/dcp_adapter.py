"""Loaders choose *which* samples form a step; the DCP planner chooses *how* the step runs.

A loader's step (one rank's batches, every rank's batches from ``lockstep_steps``, a ``VarStep``, or
any iterable of ``Batch``) becomes the ``(sample id, length)`` list the planner consumes; the planner
then assigns SP sizes, micro-batch sizes, ga_steps and recompute to exactly those samples, and the
returned StepPlans name the loader's own sample ids.

    samples = step_samples(lockstep_step)                    # [(id, length), ...]
    plans = plan_samples(samples, table, config, world_size)  # StepPlans over those ids

Planning is pure (no torch), so every rank computes the same plans from the same loader step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dcp.loaders._common import Batch, fail_arg


def _walk(item: Any) -> Iterable[Batch]:
    if isinstance(item, Batch):
        yield item
    elif hasattr(item, "micro_batches"):  # VarStep
        for per_rank in item.micro_batches:
            yield from per_rank
    else:
        for sub in item:
            yield from _walk(sub)


def step_samples(step: Any) -> list[tuple[int, int]]:
    """Flatten a loader step (Batch, nested tuples of Batch, or VarStep) into (sample id, length) pairs."""
    out = [pair for batch in _walk(step) for pair in batch.samples()]
    seen: set[int] = set()
    for i, _ in out:
        if i in seen:
            fail_arg("sample id", i, "appears twice in one loader step", "pass each rank's batches once")
        seen.add(i)
    return out


def plan_samples(
    samples: Sequence[tuple[int, int]], table: Any, config: Any, world_size: int, epoch: int = 0
) -> list[Any]:
    """Run ``dcp.planner.plan_epoch`` over exactly ``samples`` and return plans naming their original ids.

    The planner indexes samples 0..n-1 of the list it is given; the plans are rewritten so that every
    MicroBatch carries the loader's sample ids instead.
    """
    from dcp.planner import plan_epoch  # imported here: loaders do not need the planner to load

    if not samples:
        fail_arg("samples", [], "is empty", "pass at least one (sample id, length) pair")
    ids = [i for i, _ in samples]
    plans = plan_epoch([n for _, n in samples], table, config, world_size, epoch)
    ids_np = np.asarray(ids, dtype=np.int64)
    return [plan.with_sample_ids(ids_np[plan.sample_id_array]) for plan in plans]
