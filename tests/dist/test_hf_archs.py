"""Six Hugging Face architectures (Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-NeoX), tiny configs, nothing
downloaded, in ONE launch of 2 gloo processes: for each, the plain DDP twin (examples/hf_train_plain.py) and the
DCP twin (examples/hf_train.py, 10 added lines) train on the same ``datasets.Dataset``; the DCP run's step
losses equal a one-process replay of the same steps with the unmodified HF model (its own attention and loss)
and the same optimizer; the emulated memory forces SP 2 on the longest samples; and an SP-2 forward (the
manager's and the profiler adapter's) equals the unmodified model's loss and gradients."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dcp.distributed.launch import run_distributed

pytestmark = pytest.mark.dist
transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")

ARCHS = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt_neox")
SAMPLES, MAX_LEN, LR = 16, 256, 1e-3


def example(name: str):
    """examples/<name>.py as a module (examples/ is not a package)."""
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"dcp_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dcp_config(cache_dir: str, mem_gib: float = 80.0):
    import dcp

    # only the cache folder, the emulated memory, a short profile and per-step loss records are set: the model
    # shape, edges, micro-batch cap and SP sizes are those DCP derives from the HF model and fits to the data
    return dcp.DCPConfig(profiling=dcp.config.ProfilingConfig(cache_dir=cache_dir),
                         planning=dcp.config.PlanningConfig(mem_capacity_gib=mem_gib),
                         advanced=dcp.config.AdvancedConfig(warmup_iters=0, measure_iters=1,
                                                            stats_every=1))  # a loss record every step


def forcing_sp2_gib(table) -> float:
    """An emulated capacity between the measured full-recompute memory of the longest group's single sample at
    SP 2 and at SP 1: SP 1 cannot hold it (not even recomputing every layer), SP 2 can."""
    from dcp.planner.cost import micro_batch_mem_bytes

    top = max(r.seq_group for r in table.rows)
    need = {r.sp_size: micro_batch_mem_bytes(r, r.num_layers) for r in table.rows
            if r.seq_group == top and r.micro_batch_size == 1}
    assert need[2] < need[1], need
    return (need[1] + need[2]) / 2 / 2**30


def _sp2_check(arch: str, rank: int) -> dict:
    """SP-2 forward of the manager (and of the profiler adapter) vs the unmodified model on one process."""
    from dcp.integrations import hf
    from dcp.integrations.hf_zoo import tiny_causal_lm
    from dcp.runtime.context import SPContext

    ctx = SPContext(group=dist.new_group([0, 1]), sp_size=2, sp_rank=rank, recompute_layers=0)
    rows = [{"input_ids": list(range(5, 5 + n)), "labels": [-100] * 4 + list(range(9, 5 + n))} for n in (23, 14, 8)]
    data = hf.TokenDataset(rows)  # 45 tokens packed: odd, so SP 2 pads after the last one and splits a document
    batch = data.collate([data[i] for i in range(3)])
    model, ref = tiny_causal_lm(arch, layers=2), tiny_causal_lm(arch, layers=2)
    integration = hf.prepare(model)
    loss_sum, count = integration.forward(model, batch, ctx)
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
    want = ref(input_ids=batch.inputs, attention_mask=mask, labels=labels).loss  # HF's own loss
    want.backward()
    torch.testing.assert_close(total / n, want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{arch} {name}: {m}")
    with torch.no_grad():
        prof_sum, prof_count = integration.adapter().full_loss(batch, ctx)
    prof = torch.stack([prof_sum, prof_count.to(prof_sum.dtype)])
    dist.all_reduce(prof)
    torch.testing.assert_close(prof[0] / prof[1], want.detach(), rtol=1e-5, atol=1e-6)
    return {"count": int(n), "loss": float(want.detach())}


def _job(rank: int, world: int, cache_dir: str) -> dict:
    import dcp
    from dcp.integrations import hf
    from dcp.integrations.hf_zoo import tiny_causal_lm

    plain, dcp_twin = example("hf_train_plain"), example("hf_train")
    out = {}
    for arch in ARCHS:
        plain_losses = plain.train(rank, world, arch, 1, SAMPLES, MAX_LEN)
        data = hf.TokenDataset(dcp_twin.byte_dataset(SAMPLES, MAX_LEN))
        probe_config = dcp_config(f"{cache_dir}/{arch}-probe")  # one sample of the longest group at SP 1 and 2
        probe_config = probe_config.replace(profiling=dataclasses.replace(
            probe_config.profiling, seq_group_edges=(MAX_LEN,), max_micro_batch_size=1))
        probe = dcp.set_manager(tiny_causal_lm(arch), data, probe_config)
        probe.init_profiler()  # the measured memory of this model picks a capacity that forces SP 2
        config = dcp_config(f"{cache_dir}/{arch}", forcing_sp2_gib(probe.table))
        dcp_losses = dcp_twin.train(rank, world, arch, 1, SAMPLES, MAX_LEN, config)
        # the same run's plans (the cached table, the same config): which samples each step trained on
        mgr = dcp.set_manager(tiny_causal_lm(arch), data, config)
        assert not mgr.need_profile()  # the second run of the same script is a cache hit
        steps = [(sorted(int(i) for i in plan.sample_id_array), sorted({int(p) for p in plan.sp_size}))
                 for plan in mgr.epoch_plans(0)]
        out[arch] = {"plain": plain_losses, "dcp": dcp_losses, "steps": steps, "sp2": _sp2_check(arch, rank),
                     "longest": max(range(SAMPLES), key=data.lengths().__getitem__),
                     "config": (mgr.config.profiling.seq_group_edges, mgr.config.profiling.max_micro_batch_size,
                                mgr.config.planning.sp_sizes)}
    return out


def _replay(arch: str, steps: list) -> list[float]:
    """One process, the unmodified HF model: each step's mean loss over its samples' targets, then AdamW."""
    import torch.nn.functional as F

    from dcp.integrations.hf_zoo import tiny_causal_lm

    ds = example("hf_train_plain").byte_dataset(SAMPLES, MAX_LEN)
    model = tiny_causal_lm(arch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for ids, _ in steps:
        total, count = 0.0, 0
        for i in ids:
            x = torch.tensor(ds[i]["input_ids"])[None]
            logits = model(input_ids=x).logits
            total = total + F.cross_entropy(logits[0, :-1].float(), x[0, 1:], reduction="sum")
            count += x.shape[1] - 1
        loss = total / count
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.timeout(900)  # one launch for six models: 1-5 minutes on a shared 2-core machine
def test_six_architectures_train_under_dcp_like_the_unmodified_model(tmp_path):
    out = run_distributed(_job, 2, str(tmp_path), timeout_s=600)
    assert out[0].keys() == set(ARCHS)
    for arch in ARCHS:
        got = out[0][arch]
        assert got == out[1][arch] or got["dcp"] == out[1][arch]["dcp"]
        assert len(got["plain"]) == 2 and torch.isfinite(torch.tensor(got["plain"])).all()  # 8 samples a rank, 4 a batch
        edges, cap, sp_sizes = got["config"]
        assert sp_sizes == (1, 2) and edges[-1] == MAX_LEN and cap >= 1  # fitted: 4 heads, 2 K/V heads, W = 2
        assert sorted(i for ids, _ in got["steps"] for i in ids) == list(range(SAMPLES))  # every sample once
        (longest_step,) = [sizes for ids, sizes in got["steps"] if got["longest"] in ids]
        assert longest_step == [2], f"{arch}: memory did not force SP 2 on the longest sample: {got['steps']}"
        want = _replay(arch, got["steps"])
        torch.testing.assert_close(got["dcp"], want, rtol=2e-5, atol=2e-5, msg=lambda m, arch=arch: f"{arch}: {m}")
