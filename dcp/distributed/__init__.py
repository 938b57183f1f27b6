"""Low-level pieces shared by the runtime and the profiler: devices, precision, collectives.

Layering (imports go downward only): ``dcp.distributed`` imports nothing from dcp;
the runtime's SP primitives (``dcp.runtime.context``, ``registry``, ``ulysses``, ``attention``,
``recompute``) import it; the profiler imports those; the manager receives the profiler by injection
(``dcp.api.set_manager``), never by import.
``tests/unit/test_distributed_device.py`` checks that no module import cycle exists in the package.
"""

from dcp.distributed.comm import (
    all_reduce_grads_flat,
    all_reduce_values,
    backend_device,
    copy_flat_into_grads,
    device_for_backend,
)
from dcp.distributed.device import (
    PRECISIONS,
    autocast,
    compute_dtype,
    module_device,
    move_batch,
    resolve_precision,
)

__all__ = [
    "PRECISIONS",
    "all_reduce_grads_flat",
    "all_reduce_values",
    "autocast",
    "backend_device",
    "compute_dtype",
    "copy_flat_into_grads",
    "device_for_backend",
    "module_device",
    "move_batch",
    "resolve_precision",
]
