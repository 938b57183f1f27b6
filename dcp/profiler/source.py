"""The profile source ``dcp.set_manager`` gives the manager (``dcp.runtime.profiling.ProfileSource``).

The runtime never imports the profiler (the profiler measures the runtime's layers, so it sits above
it); this adapter is how the manager's ``need_profile`` / ``init_profiler`` reach the cache-aware pair.
"""

from __future__ import annotations

from typing import Any

from dcp.config import DCPConfig
from dcp.profiler import dual_layer
from dcp.profiler.cache import StaleCacheError


class CachedProfiler:
    """``dcp.profiler.dual_layer``'s need_profile / load_or_profile behind the ProfileSource protocol."""

    stale_error: type[Exception] = StaleCacheError

    def need_profile(self, target: Any, config: DCPConfig, world_size: int) -> bool:
        return dual_layer.need_profile(target, config, world_size)

    def load_or_profile(self, model: Any, config: DCPConfig, world_size: int, registry: Any, *, adapter: Any,
                        refresh: bool, **kwargs: Any) -> tuple[Any, str]:
        return dual_layer.load_or_profile(model, config, world_size, registry, adapter=adapter, refresh=refresh, **kwargs)
