"""The multi-process test helper itself: results by rank, child tracebacks, timeouts, clean teardown."""

from __future__ import annotations

import time

import pytest

from dcp.distributed.launch import DistributedFailure, run_distributed

pytestmark = pytest.mark.dist


def _sum_ranks(rank: int, world_size: int, scale: int) -> tuple[int, int]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank * scale])
    dist.all_reduce(t)
    return rank, int(t.item())


def _fail_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise RuntimeError("boom from rank one")
    import torch.distributed as dist

    dist.barrier()  # rank 0 blocks here; the helper must not wait for it forever


def _hang(rank: int, world_size: int) -> None:
    time.sleep(60)


def test_results_in_rank_order_and_collectives_work():
    out = run_distributed(_sum_ranks, 2, 10)
    assert out == [(0, 10), (1, 10)]


def test_child_traceback_is_shown():
    start = time.monotonic()
    with pytest.raises(DistributedFailure) as exc:
        run_distributed(_fail_on_rank_one, 2, pg_timeout_s=20)
    assert "rank 1 of 2 failed" in str(exc.value)
    assert "boom from rank one" in str(exc.value) and "Traceback" in str(exc.value)
    assert time.monotonic() - start < 30


def test_timeout_kills_hanging_children():
    start = time.monotonic()
    with pytest.raises(DistributedFailure, match=r"did not finish within 5"):
        run_distributed(_hang, 2, timeout_s=5)
    assert time.monotonic() - start < 25


def test_bad_world_size():
    with pytest.raises(ValueError, match=r"world_size \(0\) must be >= 1"):
        run_distributed(_hang, 0)
