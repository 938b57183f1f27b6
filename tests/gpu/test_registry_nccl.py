"""SPGroupRegistry on a real NCCL world bound to its devices (``init_process_group(device_id=...)``): the
registry takes torch's ``split_group`` path (one ncclCommSplit per SP size, every rank) and the groups it
hands back hold the right ranks and reduce. One process per GPU, on 1, 2 or 4 GPUs (on one GPU: a one-rank world,
size 1 only, which still runs torch's split_group and NCCL's split). Skipped without CUDA."""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _child(rank: int, world: int, port: int, results) -> None:
    import torch.distributed as dist

    from dcp.runtime.registry import SPGroupRegistry

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device,
                                timeout=timedelta(seconds=60))
        reg = SPGroupRegistry(world, world, [p for p in (1, 2, 4) if p <= world], timeout_s=60)
        sums = {}
        for first, p in reg.blocks:
            if first <= rank < first + p:
                group = reg.get(first, p)
                assert dist.get_process_group_ranks(group) == list(range(first, first + p))
                t = torch.ones(1, device=device)
                dist.all_reduce(t, group=group)
                sums[p] = t.item()
        results.put((rank, "ok", (reg.creation, sums)))
    except BaseException:  # noqa: BLE001 - the parent needs the traceback
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_registry_splits_a_device_bound_nccl_world():
    import torch.multiprocessing as mp

    from dcp.distributed.launch import free_port

    world = max(w for w in (1, 2, 4) if w <= torch.cuda.device_count())  # every rank in a block of each size
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world, port, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    out = dict((rank, (status, value)) for rank, status, value in (results.get(timeout=180) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    errors = [v for s, v in out.values() if s != "ok"]
    assert not errors, errors[0]
    sizes = [p for p in (1, 2, 4) if p <= world]
    assert all(v == ("split", {p: float(p) for p in sizes}) for _, v in out.values())
