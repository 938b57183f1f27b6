"""Reference models: Transformer-1D (LLM-like) and Transformer-2D (spatial + temporal attention).

Both follow the protocol the manager and the profiler use: ``layers``, ``embed``, ``prepare_aux``,
``layer_inputs``, ``run_layer``, ``head_loss``, ``forward(batch, ctx) -> (loss_sum, count)``,
``synthetic_batch``, ``valid_count`` and ``config`` (see docs/models.md).
"""

from __future__ import annotations

from typing import Any

from dcp.data import Batch, collate_tokens, collate_video
from dcp.models.t1d import T1DConfig, Transformer1D
from dcp.models.t2d import T2DConfig, Transformer2D
from dcp.named_models import MODELS, named_model

_FAMILIES = {"t1d": (T1DConfig, Transformer1D), "t2d": (T2DConfig, Transformer2D)}
"""Config and model class of each family of dcp.named_models."""

MODEL_NAMES = {name: (getattr(_FAMILIES[m.family][0], m.preset), _FAMILIES[m.family][1]) for name, m in MODELS.items()}
"""Every name of dcp.named_models.MODELS -> (config constructor, model class)."""


def build_config(name: str, **overrides: Any) -> T1DConfig | T2DConfig:
    """The named config (a name of dcp.named_models: t1d-tiny, t1d-5b, t2d-tiny, t2d-1.2b) with field overrides."""
    named_model(name)  # ValueError naming the valid names
    return MODEL_NAMES[name][0](**overrides)


def build_model(name_or_config: str | T1DConfig | T2DConfig, **overrides: Any) -> Transformer1D | Transformer2D:
    """A model from a name (with config overrides, e.g. ``seed=1``) or from a config object."""
    if isinstance(name_or_config, T1DConfig):
        return Transformer1D(name_or_config.replace(**overrides))
    if isinstance(name_or_config, T2DConfig):
        return Transformer2D(name_or_config.replace(**overrides))
    config = build_config(name_or_config, **overrides)
    return Transformer1D(config) if isinstance(config, T1DConfig) else Transformer2D(config)


__all__ = [
    "Batch",
    "MODEL_NAMES",
    "T1DConfig",
    "T2DConfig",
    "Transformer1D",
    "Transformer2D",
    "build_config",
    "build_model",
    "collate_tokens",
    "collate_video",
]
