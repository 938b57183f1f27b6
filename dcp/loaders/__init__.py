"""Variable-length data loaders: they decide which samples form a batch; DCP decides how each batch runs.

- ``balanced``: load-balanced dynamic batching (per-rank pool, best-fit under a token budget, packing,
  batches per optimizer step, step-based infinite looping, exact resume).
- ``varbatch``: token-budget micro-batches with a variable number of samples per step (optionally one
  shape per step for pipeline parallelism); ``lr_scaling`` scales the LR by the realised batch size.
- ``curriculum``: length curriculum by distributed sample sort and interleaved reassignment (torch.distributed).
- ``static_shapes``: bounded shapes and a warm-up order for statically compiled models.
- ``dcp_adapter``: a loader step as the (sample id, length) list the DCP planner plans.

Pure-Python parts import without torch; ``curriculum`` and ``lr_scaling`` names load torch on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from dcp.loaders._common import Batch, LoaderError
from dcp.loaders.balanced import LoadBalancedBatcher, LoadBalancedConfig, lockstep_steps
from dcp.loaders.dcp_adapter import plan_samples, step_samples
from dcp.loaders.static_shapes import (
    StaticShapeConfig,
    StaticShapePlan,
    choose_boundaries,
    plan_static_shapes,
)
from dcp.loaders.varbatch import VariableBatchConfig, VarStep, plan_variable_batches, shuffled_order

_LAZY = {
    "BatchSizeScaledLR": "dcp.loaders.lr_scaling",
    "scale_lr": "dcp.loaders.lr_scaling",
    "SortedSlice": "dcp.loaders.curriculum",
    "curriculum_order": "dcp.loaders.curriculum",
    "distributed_sort": "dcp.loaders.curriculum",
    "gather_order": "dcp.loaders.curriculum",
    "interleave": "dcp.loaders.curriculum",
}

__all__ = [
    "Batch",
    "BatchSizeScaledLR",
    "LoadBalancedBatcher",
    "LoadBalancedConfig",
    "LoaderError",
    "SortedSlice",
    "StaticShapeConfig",
    "StaticShapePlan",
    "VarStep",
    "VariableBatchConfig",
    "choose_boundaries",
    "curriculum_order",
    "distributed_sort",
    "gather_order",
    "interleave",
    "lockstep_steps",
    "plan_samples",
    "plan_static_shapes",
    "plan_variable_batches",
    "scale_lr",
    "shuffled_order",
    "step_samples",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dcp.loaders' has no attribute {name!r}")
