"""examples/hf_trainer_plain.py with DCP's training loop: the class name and a DCPConfig (lines marked ``# DCP``).

    python examples/hf_trainer.py                      # spawns 2 gloo processes itself
    torchrun --nproc-per-node 2 examples/hf_trainer.py # or under torchrun

The model is a tiny Llama from a config (random weights, nothing downloaded); the data is a ``datasets.Dataset``
of ``input_ids``: pieces of the Python standard library's source, as bytes (examples/hf_train.py).
DCPTrainer maps the global batch (2 x 2 x world size samples) onto DCP's tokens per step, so both scripts
take about the same optimizer steps; ``config`` (a ``dcp.DCPConfig``) sets the rest (SP sizes, memory).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from transformers import TrainingArguments  # DCP: DCPTrainer in place of Trainer

import dcp
from dcp.hf_trainer import DCPTrainer  # DCP
from dcp.integrations.hf_zoo import tiny_causal_lm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_train import byte_dataset, pad  # noqa: E402


def train(rank: int, world_size: int, out_dir: str, samples: int = 48, max_len: int = 512, max_steps: int = -1,
          config: object = None) -> list[dict]:
    """Trains one epoch; returns Trainer's log history (one entry per logged step, the last the summary)."""
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             learning_rate=1e-3, num_train_epochs=1, max_steps=max_steps, logging_steps=1,
                             save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    config = config or dcp.DCPConfig()  # the DCP twin's settings
    model, dataset = tiny_causal_lm("llama"), byte_dataset(samples, max_len)
    trainer = DCPTrainer(model=model, args=args, train_dataset=dataset, data_collator=pad, dcp_config=config)  # DCP
    trainer.train()
    return trainer.state.log_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--out", default="trainer_out")
    args = parser.parse_args()
    if "RANK" in os.environ:  # under torchrun
        import torch.distributed as dist

        dist.init_process_group("gloo")
        history = train(dist.get_rank(), dist.get_world_size(), args.out, args.samples)
    else:
        from dcp.distributed.launch import run_distributed

        history = run_distributed(train, args.world_size, args.out, args.samples, timeout_s=600)[0]
    losses = [h["loss"] for h in history if "loss" in h]
    print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
