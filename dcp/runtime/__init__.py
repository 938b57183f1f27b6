"""Runtime: the manager (public API), SP group registry, Ulysses attention, recompute switch.

Kept light on purpose: nothing heavy (torch, the manager) is imported until a name is used, so that
``import dcp.runtime`` stays cheap for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SPContext": "dcp.runtime.context",
    "pad_to_multiple": "dcp.runtime.context",
    "shard_range": "dcp.runtime.context",
    "SPGroupRegistry": "dcp.runtime.registry",
    "all_to_all_sp": "dcp.runtime.ulysses",
    "ulysses_attention": "dcp.runtime.ulysses",
    "local_attention": "dcp.runtime.attention",
    "checkpoint_layer": "dcp.runtime.recompute",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dcp.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
