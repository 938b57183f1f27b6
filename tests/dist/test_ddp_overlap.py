"""The ddp engine overlaps the step's gradient all-reduce with the backward of the rank's last micro-batch:
buckets start inside that backward, in bucket order on every rank (a busy rank beside an idle one, which
starts them all at its step), and the update equals the one of a plain all-reduce after backward."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist


class _Manager:
    """The EngineHooks (dcp.runtime.hooks) the engine calls here."""

    last = False

    def loss_weight(self) -> float:
        return 1.0

    def in_last_micro_batch(self) -> bool:
        return self.last

    def collective(self, name: str, timeout_s: float | None = None):
        return contextlib.nullcontext()

    def finite_step(self, grads) -> bool:
        return True  # the non-finite guard's decision: apply the step


def _overlap(rank: int, world: int, idle_rank: int) -> dict:
    from dcp.data import collate_tokens
    from dcp.models import build_model
    from dcp.runtime.context import SPContext
    from dcp.runtime.engines import DDPEngine, EngineError

    side = dist.new_group([0, 1])  # the test's own sums run on another group: the default one is the engine's
    model = build_model("t1d-tiny")  # seeded init: the same weights on every rank
    twin = build_model("t1d-tiny")  # the same micro-batches by plain backward: the local gradients (the engine's
    # are in its flat buffers once a bucket starts)
    eng = DDPEngine(model, torch.optim.SGD(model.parameters(), lr=1.0), bucket_cap_mb=0.01)
    mgr = _Manager()
    eng.attach(mgr)
    gen = torch.Generator().manual_seed(rank)
    batches = [collate_tokens([torch.randint(0, 256, (12 + 5 * i + 3 * rank,), generator=gen)]) for i in range(2)]
    before = [p.detach().clone() for p in model.parameters()]
    started_mid = started_last = -1
    if rank != idle_rank:
        for i, batch in enumerate(batches):
            mgr.last = i == len(batches) - 1
            loss, _ = model(batch, SPContext.single())
            eng.backward(loss)
            if not mgr.last:
                started_mid = len(eng._started)  # accumulation only: nothing is synced yet
        started_last = len(eng._started)
    if rank != idle_rank:
        for batch in batches:
            twin(batch, SPContext.single())[0].backward()
    local = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in twin.parameters()]
    if rank != idle_rank:  # every started bucket holds its gradients: one copy, not two, while they are reduced
        assert all(p.grad is None for p in model.parameters())
    for t in local:  # the expected update: a plain SUM all-reduce of the local gradients
        dist.all_reduce(t, group=side)
    if rank == idle_rank:
        eng.idle_step()
    else:
        eng._sync_step()
    deltas_ok = all(torch.allclose(b - p.detach(), w, rtol=1e-5, atol=1e-7)
                    for b, p, w in zip(before, model.parameters(), local, strict=True))
    # a second backward in the last micro-batch would add to gradients already being reduced: refused
    mgr.last = True
    refused = ""
    if rank != idle_rank:
        loss, _ = model(batches[0], SPContext.single())
        loss.backward(retain_graph=True)  # not through the engine: accumulation without the hooks armed
        eng._armed, eng._pending = True, [len(b) for b in eng._buckets]
        eng._final = {id(p) for p in model.parameters()}
        try:
            eng._on_final_grad(next(model.parameters()))
        except EngineError as exc:
            refused = str(exc)
        eng._armed = False
    return {"buckets": len(eng._buckets), "started_mid": started_mid, "started_last": started_last,
            "deltas_ok": deltas_ok, "refused": refused}


@pytest.mark.parametrize("idle_rank", [-1, 1])
def test_buckets_start_inside_the_last_backward_and_the_update_is_exact(idle_rank):
    out = run_distributed(_overlap, 2, idle_rank, timeout_s=120)
    for rank, o in enumerate(out):
        assert o["buckets"] > 3  # several buckets, so the order of their starts matters
        assert o["deltas_ok"], o
        if rank != idle_rank:
            assert o["started_mid"] == 0  # an earlier micro-batch's backward starts nothing
            assert o["started_last"] == o["buckets"]  # every bucket started before backward returned
            assert "second gradient" in o["refused"]
