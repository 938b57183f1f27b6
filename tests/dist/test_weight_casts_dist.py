"""advanced.cache_weight_casts on 2 gloo ranks (bf16 autocast on CPU, the ddp engine): an SP-2 group of three
micro-batches, then two SP-1 groups with unequal ga_steps, and a group with a recomputed layer, update the
weights bit for bit as without it, on every rank (the copies are held per rank, on its training thread)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.api import set_manager
from dcp.distributed.launch import run_distributed
from tests.dist._runtime_cases import build, config_for, group, step

pytestmark = pytest.mark.dist


def _train(kind: str, keep: bool) -> list[torch.Tensor]:
    model, data = build(kind)
    plans = [step(0, 2, group(data, 0, 2, 0, [0], [1], [2])),
             step(1, 2, group(data, 0, 1, 0, [3], [4]), group(data, 1, 1, 0, [5])),
             step(2, 2, group(data, 0, 2, 1, [6], [7]))]
    base = config_for(model)
    cfg = base.replace(runtime=dataclasses.replace(base.runtime, precision="bf16"),
                       advanced=dataclasses.replace(base.advanced, cache_weight_casts=keep))
    mgr = set_manager(model, data, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                      plans=lambda e: [plans[e]])
    for epoch in range(len(plans)):
        data.set_epoch(epoch)
        for batch in mgr.get_data_iter():
            mgr.train_micro_batch(batch)
    return [p.detach().clone() for p in model.parameters()]


def _compare(rank: int, world: int, kind: str) -> dict:
    start = [p.detach().clone() for p in build(kind)[0].parameters()]
    off, on = _train(kind, False), _train(kind, True)
    level = torch.autocast_increment_nesting() - 1  # the thread's autocast nesting: nothing left held
    torch.autocast_decrement_nesting()
    return {"equal": all(torch.equal(a, b) for a, b in zip(off, on, strict=True)), "nesting": level,
            "moved": sum(not torch.equal(a, b) for a, b in zip(start, off, strict=True))}


@pytest.mark.parametrize("kind", ["t1d", "t2d"])
def test_cached_weight_casts_give_the_same_updates_on_every_rank(kind):
    for out in run_distributed(_compare, 2, kind, timeout_s=240):
        assert out["equal"] and out["nesting"] == 0 and out["moved"] > 0
