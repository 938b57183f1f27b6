"""Train a Hugging Face LlamaForCausalLM with DCP on CPU processes (no weights, no downloads).

    python examples/hf_llama.py                      # spawns 2 gloo processes itself
    torchrun --nproc-per-node 2 examples/hf_llama.py # or under torchrun

It is examples/hf_llama_plain.py (a plain DDP loop) plus the lines marked ``# DCP``:
`diff examples/hf_llama_plain.py examples/hf_llama.py` shows every line DCP adds or changes.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import dcp  # DCP
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
    config = dcp.DCPConfig(profiling=dcp.config.ProfilingConfig(seq_group_edges=(128, 256, 512), max_micro_batch_size=4),  # DCP
                           planning=dcp.config.PlanningConfig(sp_sizes=(1, 2), mem_capacity_gib=0.005),  # DCP: emulated memory
                           runtime=dcp.config.RuntimeConfig(log_every=1))  # DCP: a log line and loss record every step
    mgr = dcp.set_manager(model, dataset, config, optimizer=optimizer)  # DCP: Ulysses attention, forward, profiler
    engine = mgr.engine  # DCP
    for _ in range(epochs):  # DCP: the manager tracks the epoch
        if mgr.need_profile():  # DCP
            mgr.init_profiler()  # DCP: dual-layer profiling of this model inside this run, cached
        for batch in mgr.get_data_iter():  # DCP
            mgr.optimize_dynamics(batch, engine)  # DCP: SP group, recompute layers, loss weight
            with mgr.profile(batch, engine):  # DCP
                loss = engine(batch)  # DCP
                engine.backward(loss)  # DCP
                engine.step()  # DCP: one gradient sync + optimizer step per DCP step
    return [s.loss for s in mgr.step_stats]  # DCP


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
