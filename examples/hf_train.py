"""Train any Hugging Face causal LM with DCP on CPU processes (no weights, no downloads).

    python examples/hf_train.py --arch qwen2                      # spawns 2 gloo processes itself
    torchrun --nproc-per-node 2 examples/hf_train.py --arch qwen2 # or under torchrun

It is examples/hf_train_plain.py (a plain DDP loop over a ``datasets.Dataset``) plus the lines marked
``# DCP``: `diff examples/hf_train_plain.py examples/hf_train.py` shows them all (10, dataset included).
``config`` (a ``dcp.DCPConfig``) overrides the defaults DCP fits to the data and the model (profiled
lengths, SP sizes, micro-batch cap); on CPU, ``planning.mem_capacity_gib`` emulates a GPU's memory. Without
one the example trains the plain loop's global batch (``planning.samples_per_step`` = its ``batch_size`` 4 x
the ranks: the same optimizer steps) and logs every step (``runtime.log_every = 1``; the library logs, and records a StepStats, every
10th step by default) so that ``mgr.step_stats`` holds one loss per step, like the plain loop's list.
"""

from __future__ import annotations

import argparse
import os

import torch

import dcp.integrations.hf  # DCP
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
    config = config or dcp.DCPConfig(planning=dcp.config.PlanningConfig(samples_per_step=4 * world_size), runtime=dcp.config.RuntimeConfig(log_every=1))  # DCP: the plain loop's batch, every step logged
    mgr = dcp.set_manager(model, dcp.integrations.hf.TokenDataset(ds), config, optimizer=optimizer)  # DCP
    for epoch in range(epochs):
        for batch in mgr.get_data_iter():  # DCP: profiles the model on first use (cached), then plans
            mgr.optimize_dynamics(batch, mgr.engine)  # DCP: SP group, recompute layers, loss weight
            with mgr.profile(batch, mgr.engine):  # DCP
                loss = mgr.engine(batch)  # DCP
                mgr.engine.backward(loss)  # DCP
                mgr.engine.step()  # DCP: one gradient sync + optimizer step per DCP step
    return [s.loss for s in mgr.step_stats]  # DCP


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
