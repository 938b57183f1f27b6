"""DeepSpeed ZeRO-1 engine: exact gradients with mixed SP sizes, unequal ga_steps and idle ranks (W=4, Transformer-1D)."""

from __future__ import annotations

import pytest

from dcp.distributed.launch import run_distributed
from tests.dist.test_manager_grads import check_exact

pytestmark = pytest.mark.dist
pytest.importorskip("deepspeed")


def _both(rank: int, world: int) -> dict:
    # Transformer-1D only: the engine never looks at the model kind (test_manager_grads runs t2d under ddp)
    return {kind: check_exact(rank, world, kind, "deepspeed") for kind in ("t1d",)}


def test_exact_gradients_deepspeed_zero1():
    results = run_distributed(_both, 4, timeout_s=280, env={"DS_ACCELERATOR": "cpu"})
    for kind in ("t1d",):
        out = [r[kind] for r in results]
        assert [o["micro"] for o in out] == [5, 5, 5, 3]
        # DeepSpeed stepped its optimizer and the client LR scheduler once per DCP step on every rank
        assert all(o["opt_steps"] == 3 and o["sched"] == 3 for o in out)
        assert out[0]["loss"] == out[2]["loss"]
