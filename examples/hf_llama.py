"""Train a Hugging Face LlamaForCausalLM with DCP on 4 CPU processes (no weights, no downloads).

    python examples/hf_llama.py                      # spawns 4 gloo processes itself
    torchrun --nproc-per-node 4 examples/hf_llama.py # or under torchrun

The lines marked ``# DCP`` are all that DCP adds to a plain training script: Ulysses runs inside HF's
attention through the attention-function registry (using the manager's current SP group), and RoPE sees
global positions through ``position_ids``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F

import dcp
from dcp.config import DCPConfig, ModelShapeConfig, PlanningConfig, ProfilingConfig
from dcp.models.common import IGNORE_INDEX
from dcp.runtime.data import SyntheticTokenDataset
from dcp.runtime.ulysses import ulysses_attention

HEADS, LAYERS, HIDDEN, VOCAB = 8, 4, 64, 256


def dcp_config() -> DCPConfig:
    shape = ModelShapeConfig(name="llama-tiny", num_layers=LAYERS, hidden_size=HIDDEN, num_heads=HEADS,
                             ffn_hidden_size=128, vocab_size=VOCAB)
    return DCPConfig(model=shape, profiling=ProfilingConfig(seq_group_edges=(256, 512, 1024, 2048)),
                     planning=PlanningConfig(sp_sizes=(1, 2, 4), mem_capacity_gib=0.004, gmax=4))


def llama_loss(model, batch, ctx):
    """(loss_sum, count) over this rank's chunk: pad to a multiple of sp_size, slice, global position_ids."""
    s = batch.inputs.shape[1]
    start, end = ctx.shard(s)
    ids = F.pad(batch.inputs, (0, ctx.padded_len(s) - s))[:, start:end]
    labels = F.pad(batch.targets, (0, ctx.padded_len(s) - s), value=IGNORE_INDEX)[:, start:end]
    pos = torch.arange(start, end)[None].expand_as(ids)  # global positions: RoPE agrees across SP sizes
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (labels != IGNORE_INDEX).sum()


def tiny_llama(attn_implementation: str = "sdpa"):
    """A randomly initialised Llama from a config: no weights, no downloads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                        max_position_embeddings=2048, attn_implementation=attn_implementation))


def train(rank: int, world_size: int, epochs: int = 1) -> list[float]:
    from transformers import AttentionInterface

    config = dcp_config()
    lengths = [int(n) for n in torch.randint(16, 2000, (32,), generator=torch.Generator().manual_seed(1))]
    dataset = SyntheticTokenDataset(lengths, vocab_size=VOCAB, seed=0)
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    table = analytic_table_for(config, world_size)  # or leave it out: mgr.init_profiler() profiles in this run

    mgr = dcp.set_manager(model, dataset, config, optimizer=optimizer, forward_fn=llama_loss, table=table)  # DCP
    AttentionInterface.register("dcp_ulysses", lambda m, q, k, v, mask, **kw: (  # DCP: [b, H, s, d] in, [b, s, H, d] out
        ulysses_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mgr.ctx, causal=True), None))
    model.set_attn_implementation("dcp_ulysses")  # DCP
    mgr.wrap_layers(model.model.layers)  # DCP: recompute the first r layers of each micro-batch's plan
    engine = mgr.engine  # DCP: forward / backward / step with DCP's loss weights and one sync per step

    for _ in range(epochs):
        if mgr.need_profile():  # DCP
            mgr.init_profiler()  # DCP
        for batch in mgr.get_data_iter():  # DCP
            mgr.optimize_dynamics(batch, engine)  # DCP
            with mgr.profile(batch, engine):  # DCP
                loss = engine(batch)
                engine.backward(loss)
                engine.step()
    return [s.loss for s in mgr.step_stats]


def analytic_table_for(config: DCPConfig, world_size: int):
    """A profile table without profiling (keeps the example fast); the profiler measures the real model."""
    from dcp.planner import CPU_SMALL, analytic_table

    return analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=config.planning.sp_sizes,
                          max_micro_batch_size=config.profiling.max_micro_batch_size, world_size=world_size,
                          hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    if "RANK" in os.environ:  # under torchrun
        import torch.distributed as dist

        dist.init_process_group("gloo")
        losses = train(dist.get_rank(), dist.get_world_size(), args.epochs)
        if dist.get_rank() == 0:
            print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")
        dist.destroy_process_group()
        return
    from dcp.testing import run_distributed

    losses = run_distributed(train, args.world_size, args.epochs, timeout_s=600)[0]
    print(f"steps {len(losses)} first loss {losses[0]:.4f} last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
