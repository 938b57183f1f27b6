"""Shared helpers of the runtime dist tests (module-level so spawned children can import them)."""

from __future__ import annotations

import copy

import torch

from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, RuntimeConfig
from dcp.models import T1DConfig, T2DConfig, Transformer1D, Transformer2D
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.context import SPContext
from dcp.runtime.data import SyntheticTokenDataset, SyntheticVideoDataset

TOKEN_LENGTHS = [13, 7, 9, 22, 5, 11, 17, 8, 15, 6, 19, 10, 12, 9, 21, 4]
VIDEO_SHAPES = [(3, 5), (2, 3), (4, 3), (2, 7), (1, 5), (3, 3), (2, 9), (2, 4), (3, 6), (1, 6), (4, 5), (2, 5),
                (3, 4), (3, 3), (2, 11), (1, 4)]


def hf_example():
    """examples/hf_llama.py as a module (examples/ is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "hf_llama.py"
    spec = importlib.util.spec_from_file_location("dcp_example_hf_llama", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_reference_loss(model, batch, ctx):
    """(loss_sum, count) of an UNMODIFIED HF causal LM (its own attention, one process): the reference."""
    import torch.nn.functional as F

    logits = model(input_ids=batch.inputs, use_cache=False).logits
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.reshape(-1), reduction="sum")
    return loss, (batch.targets != -100).sum()


def build(kind: str, seed: int = 0):
    """(model, dataset) of a tiny reference model (t1d, t2d), the example's HF Llama (hf) or a Llama with 2 K/V
    heads of its 4 (hf-gqa: SP 4 runs the context layout 2x2)."""
    if kind == "hf":
        ex = hf_example()
        return ex.tiny_llama(), SyntheticTokenDataset(TOKEN_LENGTHS, vocab_size=256, seed=7)
    if kind == "hf-gqa":
        from dcp.integrations.hf_zoo import tiny_causal_lm

        return tiny_causal_lm("llama", layers=2), SyntheticTokenDataset(TOKEN_LENGTHS, vocab_size=256, seed=7)
    if kind == "t1d":
        model = Transformer1D(T1DConfig.tiny(seed=seed))
        data = SyntheticTokenDataset(TOKEN_LENGTHS, vocab_size=model.config.vocab_size, seed=7)
    else:
        model = Transformer2D(T2DConfig.tiny(seed=seed))
        data = SyntheticVideoDataset(VIDEO_SHAPES, in_channels=model.config.in_channels, seed=7)
    return model, data


def config_for(model, *, engine: str = "ddp", weighting: str = "tokens", **planning) -> DCPConfig:
    if type(model).__name__ == "LlamaForCausalLM":
        from dcp.integrations.hf import model_shape

        shape = model_shape(model)
    else:
        shape = model.config.shape()
    return DCPConfig(
        model=shape,
        planning=PlanningConfig(sp_sizes=(1, 2, 4), ranks_per_node=8, **planning),
        runtime=RuntimeConfig(engine=engine, loss_weighting=weighting),
        advanced=AdvancedConfig(plan_check_timeout_s=120.0),
    )


def mb(data, ids) -> MicroBatch:
    lens = data.lengths()
    return MicroBatch(sample_ids=tuple(ids), seq_lens=tuple(lens[i] for i in ids), seq_group=0)


def group(data, first, p, r, *mbs) -> GroupPlan:
    return GroupPlan(first_rank=first, sp_size=p, recompute_layers=r, micro_batches=tuple(mb(data, m) for m in mbs))


def step(epoch: int, world: int, *groups, number: int = 0) -> StepPlan:
    return StepPlan(epoch=epoch, step=number, world_size=world, method="dcp-intra", groups=tuple(groups))


def mixed_steps_w4(data) -> list[StepPlan]:
    """Three one-step epochs at W=4: mixed SP sizes with unequal ga_steps, one SP-4 group, a partial step."""
    return [
        step(0, 4, group(data, 0, 2, 1, [0, 1], [2]), group(data, 2, 1, 0, [3], [4], [5]),
             group(data, 3, 1, 2, [6, 7])),
        step(1, 4, group(data, 0, 4, 4, [8], [9, 10])),
        step(2, 4, group(data, 0, 2, 0, [11]), group(data, 2, 1, 0), group(data, 3, 1, 0)),
    ]


def reference_grads(model, data, sample_ids, weighting: str = "tokens") -> list[torch.Tensor]:
    """Gradient of the mean loss over the samples, on one process, one sample at a time (no SP)."""
    if type(model).__name__ == "LlamaForCausalLM":  # a fresh SDPA model with the same weights
        c = model.config
        if c.num_key_value_heads == c.num_attention_heads:
            ref = hf_example().tiny_llama()  # its own SDPA attention: not prepared for DCP
        else:
            from dcp.integrations.hf_zoo import tiny_causal_lm

            ref = tiny_causal_lm("llama", layers=c.num_hidden_layers)
        ref.load_state_dict(model.state_dict())
        forward = hf_reference_loss
    else:
        ref = copy.deepcopy(model)
        forward = lambda m, b, c: m(b, c)  # noqa: E731
    ref.zero_grad(set_to_none=True)
    ctx = SPContext.single()
    total, count, per_sample = 0.0, 0, []
    for i in sample_ids:
        loss, n = forward(ref, data.collate([data[i]]), ctx)
        total, count = total + loss, count + int(n)
        per_sample.append(loss / n)
    mean = total / count if weighting == "tokens" else sum(per_sample) / len(per_sample)
    mean.backward()
    return [p.grad.detach().clone() for p in ref.parameters()]


PLANNER_LENGTHS = [494, 63, 309, 52, 378, 421, 170, 44, 210, 139, 277, 468, 30, 351, 95, 256, 188, 403, 71, 333,
                   129, 22, 450, 301]


def planner_setup(world: int, seed: int = 0):
    """(model, dataset, config, table) for runs through the real planner (DCP-intra, analytic table)."""
    from dcp.config import ProfilingConfig
    from dcp.planner import CPU_SMALL, analytic_table

    model = Transformer1D(T1DConfig.tiny(seed=seed))
    data = SyntheticTokenDataset(PLANNER_LENGTHS, vocab_size=model.config.vocab_size, seed=3)
    config = DCPConfig(
        model=model.config.shape(),
        profiling=ProfilingConfig(seq_group_edges=(64, 128, 256, 512), max_micro_batch_size=4),
        planning=PlanningConfig(sp_sizes=(1, 2), mem_capacity_gib=0.007, gmax=4, ranks_per_node=8, seed=seed),
        advanced=AdvancedConfig(plan_check_timeout_s=120.0),
    )
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=(1, 2), max_micro_batch_size=4,
                           world_size=world, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    return model, data, config, table


def bucket_like(plan: StepPlan, data, sp_size: int) -> StepPlan:
    """The same samples as ``plan`` on fixed SP groups of ``sp_size`` (one sample per micro-batch, round robin):
    the bucket baseline's shape with DCP's step contents."""
    world = plan.world_size
    n_groups = world // sp_size
    per_group: list[list[list[int]]] = [[] for _ in range(n_groups)]
    for k, i in enumerate(sorted(plan.sample_ids, key=lambda i: -data.lengths()[i])):
        per_group[k % n_groups].append([i])
    groups = [group(data, g * sp_size, sp_size, 0, *mbs) for g, mbs in enumerate(per_group)]
    return StepPlan(epoch=plan.epoch, step=plan.step, world_size=world, method="bucket", groups=tuple(groups))
