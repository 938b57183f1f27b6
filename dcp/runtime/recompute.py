"""The recompute switch (DCP-intra): checkpoint a layer's activations or keep them, per micro-batch.

The planner picks r per SP group; the model checkpoints its first r layers. Every rank of an SP group
gets the same r from the same plan, so the collectives replayed inside a recomputed layer (the Ulysses
all-to-alls) happen on all ranks of the group in the same order during backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def checkpoint_layer(layer: Callable[..., Any], *args: Any, enabled: bool) -> Any:
    """``layer(*args)``, recomputing its activations in backward when ``enabled``.

    Uses non-reentrant checkpointing, which accepts non-tensor arguments (the SPContext, aux values) and
    inputs that do not require grad.
    """
    if not enabled or not torch.is_grad_enabled():
        return layer(*args)
    return checkpoint(layer, *args, use_reentrant=False)
