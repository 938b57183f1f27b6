"""A plain data-parallel training loop for a Hugging Face causal LM (the baseline hf_train.py starts from).

    python examples/hf_train_plain.py --arch qwen2                      # spawns 2 gloo processes itself
    torchrun --nproc-per-node 2 examples/hf_train_plain.py --arch qwen2 # or under torchrun

The model is any ``--arch`` of dcp.integrations.hf_zoo (Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-NeoX, ...),
built from a tiny config (random weights, nothing downloaded); the data is a ``datasets.Dataset`` of
``input_ids``: pieces of the Python standard library's source, as bytes. ``config`` is unused here (the
DCP twin's settings; both twins are called alike). `diff examples/hf_train_plain.py examples/hf_train.py`
shows every line DCP adds.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from datasets import Dataset
from dcp.integrations.corpus import ByteCorpus
from dcp.integrations.hf_zoo import tiny_causal_lm


def byte_dataset(samples: int, max_len: int) -> Dataset:
    """A tokenized Hugging Face dataset: one row of byte ids per top-level piece of the standard library."""
    corpus = ByteCorpus(num_samples=samples, max_len_tokens=max_len)
    return Dataset.from_dict({"input_ids": [corpus[i][1].tolist() for i in range(len(corpus))]})


def pad(rows: list[dict]) -> dict[str, torch.Tensor]:
    """The usual causal-LM collate: right-pad, mask the padding, labels = input_ids (-100 on padding)."""
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([r["input_ids"] + [0] * (n - len(r["input_ids"])) for r in rows])
    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (n - len(r["input_ids"])) for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def train(rank: int, world_size: int, arch: str = "llama", epochs: int = 1, samples: int = 48, max_len: int = 512,
          config: object = None) -> list[float]:
    ds = byte_dataset(samples, max_len)
    model = tiny_causal_lm(arch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = DistributedDataParallel(model)
    sampler = DistributedSampler(ds, world_size, rank, seed=0)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=pad)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="llama", help="tiny model architecture (default: %(default)s)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=48)
    args = parser.parse_args()
    if "RANK" in os.environ:  # under torchrun
        import torch.distributed as dist

        dist.init_process_group("gloo")
        losses = train(dist.get_rank(), dist.get_world_size(), args.arch, args.epochs, args.samples)
        if dist.get_rank() == 0:
            print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")
        dist.destroy_process_group()
        return
    from dcp.distributed.launch import run_distributed

    losses = run_distributed(train, args.world_size, args.arch, args.epochs, args.samples, timeout_s=600)[0]
    print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
