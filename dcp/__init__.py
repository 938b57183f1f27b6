"""DCP (Data-Centric Parallel): each batch's length chooses its SP size, micro-batch size,
gradient-accumulation steps and recompute layers.

The planner (``dcp.planner``) is pure Python; the runtime (``dcp.runtime``) needs torch.
``set_manager`` is imported lazily so that ``import dcp`` stays cheap and torch-free.
"""

from __future__ import annotations

from typing import Any

from dcp.config import ConfigError, DCPConfig, load_config

__version__ = "0.1.0"

__all__ = ["ConfigError", "DCPConfig", "load_config", "set_manager", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "set_manager":
        from dcp.api import set_manager

        return set_manager
    raise AttributeError(f"module 'dcp' has no attribute {name!r}")
