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

MODEL_NAMES = {
    "t1d-tiny": (T1DConfig.tiny, Transformer1D),
    "t1d-5b": (T1DConfig.paper_5b, Transformer1D),
    "t2d-tiny": (T2DConfig.tiny, Transformer2D),
    "t2d-1.2b": (T2DConfig.paper_1_2b, Transformer2D),
}


def build_config(name: str, **overrides: Any) -> T1DConfig | T2DConfig:
    """The named config (t1d-tiny, t1d-5b, t2d-tiny, t2d-1.2b) with field overrides."""
    if name not in MODEL_NAMES:
        raise ValueError(f"model name ({name!r}) is not one of {sorted(MODEL_NAMES)}: pick one of those")
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
