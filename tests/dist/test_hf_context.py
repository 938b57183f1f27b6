"""A Hugging Face Llama (4 query, 2 K/V heads) through DCP's attention interface under a context layout (1x2 on
2 gloo processes: the sequence in two balanced chunks per rank, K/V all-gathered unexpanded): loss and every
gradient equal the unmodified model's on one process, for three packed documents of odd total length."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist
pytest.importorskip("transformers")


def _cp2(rank: int, world: int) -> None:
    from dcp.integrations import hf
    from dcp.integrations.hf_zoo import tiny_causal_lm
    from dcp.runtime.context import SPContext

    group = dist.new_group([0, 1])
    ctx = SPContext(group=group, sp_size=2, sp_rank=rank, context_size=2, context_group=group)
    rows = [{"input_ids": list(range(5, 5 + n)), "labels": [-100] * 4 + list(range(9, 5 + n))} for n in (23, 14, 8)]
    data = hf.TokenDataset(rows)  # 45 tokens packed: padded to 48, four chunks of 12, documents cross chunks
    batch = data.collate([data[i] for i in range(3)])
    model, ref = tiny_causal_lm("llama", layers=2), tiny_causal_lm("llama", layers=2)
    loss_sum, count = hf.prepare(model).forward(model, batch, ctx)
    n = torch.tensor(float(count))
    dist.all_reduce(n)
    (loss_sum / n).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    total = loss_sum.detach().clone()
    dist.all_reduce(total)
    mask = (torch.arange(batch.inputs.shape[1])[None] < torch.tensor(batch.seq_lens)[:, None]).long()
    labels = torch.full_like(batch.inputs, -100)
    for j, row in enumerate(rows):
        labels[j, : len(row["labels"])] = torch.tensor(row["labels"])
    want = ref(input_ids=batch.inputs, attention_mask=mask, labels=labels).loss
    want.backward()
    torch.testing.assert_close(total / n, want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_hf_llama_context_layout_equals_one_process():
    run_distributed(_cp2, 2)
