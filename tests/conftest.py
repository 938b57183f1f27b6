"""Test-session settings shared by every tier.

DeepSpeed picks its accelerator once, at its first import: the CPU/gloo tests (unit and dist) need its CPU
accelerator even on a machine with a GPU, or DeepSpeed places rank r's model on cuda:r. Processes spawned by
``dcp.distributed.launch.run_distributed`` with the gloo backend set the same default themselves; the GPU tests run
DeepSpeed in processes of their own with ``DS_ACCELERATOR=cuda``.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
