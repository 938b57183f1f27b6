"""The recompute switch (DCP-intra): checkpoint a layer's activations or keep them, per micro-batch.

The planner picks r per micro-batch (its own minimal r at its group's p: ``StepPlan.mb_recompute_layers``,
else its group's); the model checkpoints its first r layers. Every rank of an SP group gets the same r for the
same micro-batch from the same plan, so the collectives replayed inside a recomputed layer (the Ulysses
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


def run_layer(layer: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, enabled: bool) -> Any:
    """``layer(*args, **kwargs)``, checkpointed when ``enabled`` (keyword arguments pass through)."""
    if not kwargs:
        return checkpoint_layer(layer, *args, enabled=enabled)
    if enabled and torch.is_grad_enabled():
        return checkpoint(layer, *args, use_reentrant=False, **kwargs)
    return layer(*args, **kwargs)


def wrap_layers(layers: Any, recompute_layers: Callable[[], int]) -> None:
    """Route every layer of ``layers`` (e.g. an HF model's ``model.model.layers``) through the switch: layer
    i is checkpointed when i < ``recompute_layers()`` (read at each call: the current micro-batch's r).
    Parameter names and state dicts are unchanged (the layer's forward is wrapped, not the module)."""
    for index, layer in enumerate(layers):
        inner = layer.forward

        def forward(*args: Any, _inner: Any = inner, _index: int = index, **kwargs: Any) -> Any:
            return run_layer(_inner, args, kwargs, enabled=_index < recompute_layers())

        layer.forward = forward
