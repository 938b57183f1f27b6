"""A plain data-parallel training loop for a Hugging Face Llama (the baseline hf_llama.py starts from).

    python examples/hf_llama_plain.py                      # spawns 2 gloo processes itself
    torchrun --nproc-per-node 2 examples/hf_llama_plain.py # or under torchrun

`diff examples/hf_llama_plain.py examples/hf_llama.py` shows every line DCP adds or changes.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from transformers import LlamaConfig, LlamaForCausalLM

from dcp.integrations.corpus import ByteCorpus


def tiny_llama(layers: int = 4, hidden: int = 64, heads: int = 4) -> LlamaForCausalLM:
    """A randomly initialised byte-level Llama from a config: no weights, no downloads."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                                        max_position_embeddings=4096))


def train(rank: int, world_size: int, epochs: int = 1, samples: int = 48) -> list[float]:
    dataset = ByteCorpus(num_samples=samples, max_len_tokens=512)  # the standard library's source, as bytes
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, world_size, rank, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=dataset.collate)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            logits = model(input_ids=batch.inputs).logits
            loss = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=48)
    args = parser.parse_args()
    if "RANK" in os.environ:  # under torchrun
        import torch.distributed as dist

        dist.init_process_group("gloo")
        losses = train(dist.get_rank(), dist.get_world_size(), args.epochs, args.samples)
        if dist.get_rank() == 0:
            print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")
        dist.destroy_process_group()
        return
    from dcp.distributed.launch import run_distributed

    losses = run_distributed(train, args.world_size, args.epochs, args.samples, timeout_s=600)[0]
    print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
