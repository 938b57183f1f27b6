"""The dual-layer profiler: per (seq_group, b, p) it runs two layers of the real model, records the
second layer's forward/backward time and memory plus the model's constant time and memory, and caches
the resulting :class:`~dcp.planner.table.ProfileTable`.

Heavy names are imported lazily so ``import dcp.profiler`` stays cheap (the ``dcp`` CLI imports every
subcommand module at start-up)::

    from dcp.profiler import set_manager          # the paper's Figure 14 entry point
    from dcp.profiler import profile_table        # profile a model inside a distributed run
    from dcp.profiler import need_profile, load_or_profile   # the cache-aware pair a manager calls
    from dcp.profiler import cache                # lookup / store of cached tables
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["set_manager", "profile_table", "load_or_profile", "need_profile", "cache_key_for", "get_adapter", "cache"]

# name -> (module, attribute); attribute None means the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "set_manager": ("dcp.api", "set_manager"),
    "profile_table": ("dcp.profiler.dual_layer", "profile_table"),
    "load_or_profile": ("dcp.profiler.dual_layer", "load_or_profile"),
    "need_profile": ("dcp.profiler.dual_layer", "need_profile"),
    "cache_key_for": ("dcp.profiler.dual_layer", "cache_key_for"),
    "get_adapter": ("dcp.profiler.adapters", "get_adapter"),
    "cache": ("dcp.profiler.cache", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dcp.profiler' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)
