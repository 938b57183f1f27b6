"""dcp.integrations.hf for any causal LM (eleven architectures from tiny configs), the one-line dataset, the
lengths cache, the defaults fitted to data and model, the example's diff, and the transformers floor."""

from __future__ import annotations

import difflib
import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

import dcp
from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig
from dcp.integrations import hf
from dcp.integrations.hf_data import HFDataError, count_tokens
from dcp.integrations.hf_defaults import edges_for, fit_config, micro_batch_cap, sp_sizes_for
from dcp.integrations.hf_zoo import ARCHS, tiny_causal_lm
from dcp.runtime.context import SPContext

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"gpt_neox": "gpt_neox.layers", "gpt2": "transformer.h"}


def rows():
    """Three samples with a 3-token prompt the loss ignores (-100), as an instruction-tuning set has."""
    return [{"input_ids": list(range(3, 3 + n)), "labels": [-100] * 3 + list(range(6, 3 + n))} for n in (11, 6, 9)]


@pytest.mark.parametrize("arch", ARCHS)
def test_any_architecture_matches_the_unmodified_model(arch):
    model, ref = tiny_causal_lm(arch, layers=2), tiny_causal_lm(arch, layers=2)
    integration = hf.prepare(model)
    assert integration.layers is model.get_submodule(LAYERS.get(arch, "model.layers"))
    data = hf.TokenDataset(rows())
    batch = data.collate([data[i] for i in range(3)])
    loss_sum, count = integration.forward(model, batch, SPContext.single())
    mask = (torch.arange(11)[None] < torch.tensor([[11], [6], [9]])).long()
    labels = torch.full((3, 11), -100)
    for j, row in enumerate(rows()):
        labels[j, : len(row["labels"])] = torch.tensor(row["labels"])
    want = ref(input_ids=batch.inputs, attention_mask=mask, labels=labels).loss  # HF's own shift and loss
    torch.testing.assert_close(loss_sum / count, want, rtol=1e-5, atol=1e-6)
    assert int(count) == sum(data.target_counts()) == 8 + 3 + 6  # only real targets
    with torch.no_grad():  # the profiler's generic adapter runs the model's own embedding, layers, norm and head
        prof_sum, prof_count = integration.adapter().full_loss(batch, SPContext.single())
    torch.testing.assert_close(prof_sum / prof_count, want.detach(), rtol=1e-5, atol=1e-6)
    assert model.config.model_type in hf.TESTED_MODEL_TYPES and set(hf.TESTED_MODEL_TYPES) == set(ARCHS)
    shape = hf.hf_shape(model)
    assert (shape.num_layers, shape.hidden_size, shape.num_heads) == (2, 64, 4)
    assert shape.num_kv_heads == (4 if arch in ("gpt_neox", "gpt2") else 2)  # GPT-NeoX ignores num_key_value_heads


def test_token_dataset_from_a_datasets_dataset_and_from_lists():
    ds = datasets.Dataset.from_list(rows())
    for data in (hf.TokenDataset(ds), hf.TokenDataset(rows()), hf.TokenDataset(ds.with_format("torch"))):
        assert data.lengths() == [11, 6, 9] and data.target_counts() == [8, 3, 6] and len(data) == 3
        batch = data.collate([data[2], data[0]])
        assert batch.sample_ids == (2, 0) and batch.seq_lens == (9, 11)
        assert batch.targets[0, :8].tolist() == [-100, -100] + list(range(6, 12)) and batch.targets[0, 8:].eq(-100).all()
    plain = hf.TokenDataset(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]]}))  # no labels column
    assert plain.target_counts() == [2, 1]
    assert plain.collate([plain[0]]).targets.tolist() == [[2, 3, -100]]
    assert hf.TokenDataset([[1, 2, 3]]).lengths() == [3]  # rows that are the ids themselves


def test_token_dataset_errors_name_the_fix():
    with pytest.raises(HFDataError, match=r"row 0 has no 'input_ids' \(keys \['text'\]\): tokenize the dataset"):
        hf.TokenDataset([{"text": "hi"}])
    with pytest.raises(HFDataError, match="dataset has no column 'input_ids'.*tokenize it first"):
        hf.TokenDataset(datasets.Dataset.from_dict({"text": ["hi"]}))
    with pytest.raises(HFDataError, match="row 1: 'labels' has 1 entries but 'input_ids' has 2: labels are aligned"):
        hf.TokenDataset([{"input_ids": [1], "labels": [1]}, {"input_ids": [1, 2], "labels": [1]}])
    with pytest.raises(HFDataError, match="row 0 has no tokens: drop empty rows"):
        hf.TokenDataset([{"input_ids": []}])
    with pytest.raises(HFDataError, match="is not indexable: .*materialize a streaming dataset"):
        hf.TokenDataset(iter([[1, 2]]))
    with pytest.raises(HFDataError, match=r"lengths \(1\) and target_counts \(1\) must give one entry per row"):
        hf.TokenDataset([[1, 2], [3, 4]], lengths=[2])


def test_lengths_are_cached_by_fingerprint_and_written_atomically(tmp_path, monkeypatch):
    ds = datasets.Dataset.from_list(rows())
    got = hf.cached_lengths(ds, cache_dir=tmp_path)
    assert got == ([11, 6, 9], [8, 3, 6])
    (path,) = tmp_path.glob("lengths-*.json")
    assert ds._fingerprint in path.name and json.loads(path.read_text())["lengths"] == [11, 6, 9]
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed over the target
    monkeypatch.setattr("dcp.integrations.hf_data.count_tokens", lambda *a, **k: pytest.fail("read the data again"))
    assert hf.cached_lengths(ds, cache_dir=tmp_path) == got  # the second run reads the file
    assert hf.TokenDataset(ds, cache_dir=tmp_path).target_counts() == [8, 3, 6]
    monkeypatch.undo()
    shorter = ds.map(lambda r: {"input_ids": r["input_ids"][:4], "labels": r["labels"][:4]})  # a new fingerprint
    assert hf.cached_lengths(shorter, cache_dir=tmp_path) == ([4, 4, 4], [1, 1, 1])
    assert len(list(tmp_path.glob("lengths-*.json"))) == 2
    with pytest.raises(HFDataError, match=r"has no datasets fingerprint .*pass cached_lengths\(data, key="):
        hf.cached_lengths(rows(), cache_dir=tmp_path)
    assert hf.cached_lengths(rows(), cache_dir=tmp_path, key="mine") == got
    path.write_text("{")
    with pytest.raises(HFDataError, match="is unreadable .*delete it to recompute"):
        hf.cached_lengths(ds, cache_dir=tmp_path)
    path.write_text(json.dumps({"lengths": [1], "target_counts": [0]}))
    with pytest.raises(HFDataError, match="holds 1 samples but the data has 3"):
        hf.cached_lengths(ds, cache_dir=tmp_path)
    assert count_tokens(ds) == got

    def stream():  # a streaming source: one pass computes its lengths, keyed by the caller
        yield from rows()

    it = datasets.IterableDataset.from_generator(stream)
    assert hf.cached_lengths(it, cache_dir=tmp_path / "s", key="stream-v1") == got
    assert hf.cached_lengths(it, cache_dir=tmp_path / "s", key="stream-v1") == got  # from the file
    with pytest.raises(HFDataError, match=r"data \(IterableDataset\) is not indexable"):
        hf.TokenDataset(it)


def test_defaults_fit_the_data_and_the_model():
    assert edges_for([20, 700, 1000]) == (128, 256, 512, 1024)  # never past the longest sample's group
    assert edges_for([300, 310]) == (512,)
    assert edges_for([3]) == (16,)
    assert max(edges_for([17, 4097])) == 8192 and len(edges_for(range(1, 5000))) == 4
    assert sp_sizes_for(4, 2, 2) == (1, 2)
    assert sp_sizes_for(4, 2, 8) == (1, 2, 4)  # 4 = 2 x the K/V heads: each rank holds a whole one
    assert sp_sizes_for(12, 4, 6) == (1, 2)  # 3 and 6 split the K/V heads unevenly; 4 does not divide 6 ranks
    assert sp_sizes_for(8, 1, 8) == (1, 2, 4, 8) and sp_sizes_for(8, 8, 1) == (1,)
    assert micro_batch_cap((64, 128, 256, 512)) == 8 and micro_batch_cap((512, 1024, 2048, 4096)) == 8
    assert micro_batch_cap((2048, 4096)) == 2 and micro_batch_cap((8192,)) == 1
    shape = hf.model_shape(tiny_causal_lm("qwen2", layers=2))
    fitted = fit_config(DCPConfig(), lengths=[20, 700, 1000], num_heads=4, num_kv_heads=2, world_size=2, model=shape)
    assert fitted.profiling.seq_group_edges == (128, 256, 512, 1024) and fitted.profiling.max_micro_batch_size == 8
    assert fitted.planning.sp_sizes == (1, 2) and fitted.model == shape
    mine = DCPConfig(profiling=ProfilingConfig(seq_group_edges=(64, 4096), max_micro_batch_size=3),
                     planning=PlanningConfig(sp_sizes=(1, 2, 4)))
    kept = fit_config(mine, lengths=[20, 1000], num_heads=4, num_kv_heads=2, world_size=2)
    assert (kept.profiling.seq_group_edges, kept.profiling.max_micro_batch_size, kept.planning.sp_sizes) == (
        (64, 4096), 3, (1, 2, 4))  # what the user set is kept


def test_set_manager_fits_the_defaults_and_a_forward_fn_without_adapter_profiles(tmp_path):
    """The issue's failure: Phi with a forward_fn but no adapter failed before profiling (HFLlamaAdapter)."""
    data = hf.TokenDataset([list(range(n)) for n in (5, 40, 70, 12)])
    mgr = dcp.set_manager(tiny_causal_lm("gpt_neox", layers=2), data)
    assert mgr.config.profiling.seq_group_edges == (16, 32, 64, 128) and mgr.config.planning.sp_sizes == (1,)
    assert mgr.config.model.name.startswith("gpt_neox-hf")
    phi = tiny_causal_lm("phi", layers=2)
    integration = hf.prepare(tiny_causal_lm("phi", layers=2))  # a forward of the user's own (here: the same one)
    config = DCPConfig(profiling=ProfilingConfig(cache_dir=str(tmp_path), max_micro_batch_size=1),
                       advanced=AdvancedConfig(warmup_iters=0, measure_iters=1))
    mgr = dcp.set_manager(phi, data, config, forward_fn=lambda m, b, c: integration.forward(integration.model, b, c))
    assert isinstance(mgr.adapter, hf.HFCausalLMAdapter) and mgr.adapter.max_sp_size == 1
    assert phi.config._attn_implementation != hf.ATTENTION_NAME  # the user's forward runs the model as it is
    mgr.init_profiler()
    assert len(mgr.table) > 0 and {r.sp_size for r in mgr.table.rows} == {1}


def test_models_it_cannot_drive_get_one_line_naming_what_to_pass():
    model = tiny_causal_lm("llama", layers=2)
    model.config.num_hidden_layers = 3  # no list of 3 decoder layers to find
    with pytest.raises(hf.HFIntegrationError, match=r"LlamaForCausalLM holds no nn.ModuleList of its 3 decoder "
                                                    r"layers .*call dcp.integrations.hf.prepare\(model, layers="):
        hf.prepare(model)
    prepared = hf.prepare(model, layers=model.model.layers)
    assert prepared.layers is model.model.layers and hf.prepare(model) is prepared
    neox = tiny_causal_lm("gpt_neox", layers=2)
    neox.gpt_neox.my_norm = neox.gpt_neox.final_layer_norm
    del neox.gpt_neox.final_layer_norm
    with pytest.raises(hf.HFModelError, match=r"GPTNeoXModel has no final norm named one of .*prepare\(model, "
                                              r"final_norm="):
        hf.prepare(neox).adapter()
    assert hf.prepare(neox, final_norm=neox.gpt_neox.my_norm).adapter().norm is neox.gpt_neox.my_norm
    gemma2 = tiny_causal_lm("gemma2", layers=2)
    gemma2.config.attn_logit_softcapping = 50.0
    with pytest.raises(hf.HFIntegrationError, match=r"attn_logit_softcapping \(50.0\) .*attn_logit_softcapping=None"):
        hf.prepare(gemma2)
    class OddLM:  # a config without the usual field names
        config = transformers.PretrainedConfig(n_heads=4, hidden_size=64, num_hidden_layers=2, vocab_size=8)

    with pytest.raises(hf.HFModelError, match=r"config.num_attention_heads \(None\) of OddLM .*"
                                              r"ModelShapeConfig\(num_layers="):
        hf.hf_shape(OddLM())


def _code(name: str) -> list[str]:
    text = (ROOT / "examples" / name).read_text()
    return text[text.index('"""', 3) + 3:].splitlines()  # without the module docstring


def test_the_hf_example_adds_at_most_ten_lines_and_the_readme_shows_them():
    added = [line[1:] for line in difflib.unified_diff(_code("hf_train_plain.py"), _code("hf_train.py"), lineterm="", n=0)
             if line.startswith("+") and not line.startswith("+++")]
    assert added == [line for line in _code("hf_train.py") if "# DCP" in line]  # every added line is marked
    assert len(added) == 10
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Hugging Face in ten lines"):]
    shown = re.search(r"```diff\n(.*?)```", section, re.S).group(1).splitlines()
    assert [line[1:].split("  # DCP")[0].rstrip() for line in shown if line.startswith("+")] == [
        line.split("  # DCP")[0].rstrip() for line in added]
    assert f"{len(added)} added lines" in section and 'pip install -e ".[hf]"' in readme
    assert "torchrun --nproc-per-node" in readme and "experiments/slurm/sweep.sbatch" in readme


def test_the_installed_transformers_is_at_least_the_declared_floor():
    toml = (ROOT / "pyproject.toml").read_text()
    (floor,) = set(re.findall(r'"transformers>=([0-9.]+)"', toml))
    assert floor == "4.54.0"  # the first release with set_attn_implementation (4.53.3 lacks it)

    def parse(v):
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    assert parse(version("transformers")) >= parse(floor)
    assert callable(getattr(transformers.PreTrainedModel, "set_attn_implementation", None))
    assert hasattr(transformers, "AttentionInterface")
    (ds_floor,) = set(re.findall(r'"datasets>=([0-9.]+)"', toml))
    assert parse(version("datasets")) >= parse(ds_floor) and hasattr(datasets.Dataset, "select_columns")
