"""Settings shared by every tier of the test suite.

DeepSpeed picks its accelerator once, at its first import: the CPU/gloo tests (unit and dist) need its CPU
accelerator even on a machine with a GPU, or DeepSpeed places rank r's model on cuda:r. Processes spawned by
``dcp.distributed.launch.run_distributed`` with the gloo backend set the same default themselves; the GPU tests run
DeepSpeed in processes of their own with ``DS_ACCELERATOR=cuda``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture()
def load_script():
    """``load_script("plan_hash")``: a fresh module of ``scripts/plan_hash.py`` (the scripts are not a package)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
