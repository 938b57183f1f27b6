"""dcp.integrations.hf on one process, set_manager's defaults and forward_fn check, the manager's cache policy
(need_profile and init_profiler agree on the key; stale re-profiled unless strict; corrupt refused), the corpus."""

from __future__ import annotations

import logging

import pytest
import torch

import dcp
from dcp.api import set_manager
from dcp.config import (
    AdvancedConfig,
    ConfigError,
    DCPConfig,
    PlanningConfig,
    ProfilingConfig,
    config_from_dict,
)
from dcp.integrations import hf
from dcp.integrations.corpus import ByteCorpus, CorpusError
from dcp.profiler import cache
from dcp.profiler.adapters import AdapterError, HFLlamaAdapter
from dcp.profiler.dual_layer import cache_key_for
from dcp.runtime.context import SPContext
from dcp.runtime.data import SyntheticTokenDataset
from dcp.runtime.manager import ManagerError

transformers = pytest.importorskip("transformers")

LENGTHS = [13, 7, 30, 22, 5, 17]


def llama(**overrides):
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg, **overrides}))


def qwen2():
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256))


def mistral():
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=64))


def small_config(cache_dir, strict_cache: bool = False, **profiling) -> DCPConfig:
    return DCPConfig(
        profiling=ProfilingConfig(**{"seq_group_edges": (16, 32), "max_micro_batch_size": 2,
                                     "cache_dir": str(cache_dir), **profiling}),
        advanced=AdvancedConfig(warmup_iters=0, measure_iters=1, strict_cache=strict_cache),
        planning=PlanningConfig(sp_sizes=(1, 2), mem_capacity_gib=1.0),
    )


def test_prepared_model_matches_the_unmodified_model_and_keeps_eval_usable():
    for build in (llama, qwen2, mistral):
        model, ref = build(), build()
        integration = hf.prepare(model)
        assert model.config._attn_implementation == hf.ATTENTION_NAME
        data = SyntheticTokenDataset([11, 6], vocab_size=64, seed=3)
        batch = data.collate([data[0], data[1]])
        loss_sum, count = integration.forward(model, batch, SPContext.single())
        labels = batch.inputs.masked_fill(batch.targets == -100, -100)  # HF shifts labels itself
        labels[0, :11] = batch.inputs[0, :11]
        labels[1, :6] = batch.inputs[1, :6]
        mask = (torch.arange(11)[None] < torch.tensor([[11], [6]])).long()
        want = ref(input_ids=batch.inputs, attention_mask=mask, labels=labels).loss
        torch.testing.assert_close(loss_sum / count, want, rtol=1e-5, atol=1e-6)
        assert int(count) == 10 + 5
        # without a dcp_ctx the attention is plain causal attention (evaluation, generation)
        ids = batch.inputs[:1]
        torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits,
                                   ref(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_model_shape_and_adapter_come_from_the_hf_config():
    model = qwen2()
    integration = hf.prepare(model)
    shape = integration.shape()
    assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.ffn_hidden_size, shape.vocab_size,
            shape.param_bytes) == (2, 32, 4, 64, 64, 4)
    adapter = integration.adapter()
    assert isinstance(adapter, hf.HFCausalLMAdapter) and adapter.sp_aware and adapter.max_sp_size is None
    assert adapter.name == "qwen2-hf" and adapter.layers is model.model.layers and adapter.norm is model.model.norm
    assert integration.num_kv_heads == 2 and hf.prepare(model) is integration  # prepared once
    # the unprepared model's adapter is SP-1 only and its cache key differs (not the same measurements)
    plain = hf.HFCausalLMAdapter(qwen2())
    assert plain.max_sp_size == 1 and plain.config_hash() != adapter.config_hash()
    assert HFLlamaAdapter(qwen2()).config_hash() == plain.config_hash()  # the Llama-only adapter measures the same
    with pytest.raises(hf.HFModelError, match="call dcp.integrations.hf.prepare"):
        hf.HFCausalLMAdapter(qwen2(), sp_aware=True)
    with pytest.raises(AdapterError, match="call dcp.integrations.hf.prepare"):
        HFLlamaAdapter(qwen2(), sp_aware=True)


def test_prepare_refuses_what_it_cannot_drive():
    with pytest.raises(hf.HFIntegrationError, match="not a transformers PreTrainedModel"):
        hf.prepare(torch.nn.Linear(2, 2))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    gpt2._supports_attention_backend = False  # what a model with its own attention code declares
    with pytest.raises(hf.HFIntegrationError, match=r"GPT2LMHeadModel \(model_type 'gpt2'\) does not route its "
                                                    r"attention through .*pass set_manager\(\.\.\., forward_fn=fn, "
                                                    r"adapter="):
        hf.prepare(gpt2)
    with pytest.raises(hf.HFIntegrationError, match="attention_dropout"):
        hf.prepare(llama(attention_dropout=0.1))
    base = transformers.LlamaModel(llama().config)  # a Llama without its LM head
    with pytest.raises(hf.HFIntegrationError, match=r"LlamaModel \(model_type 'llama'\) has no LM head.*"
                                                    r"load the \*ForCausalLM class"):
        hf.prepare(base)


def test_attention_function_errors_name_the_fix():
    q = torch.zeros(1, 4, 8, 8)
    with pytest.raises(hf.HFIntegrationError, match="attention_dropout = 0.0"):
        hf.ulysses_attention_hf(None, q, q, q, None, dcp_ctx=SPContext.single(), dropout=0.1)
    with pytest.raises(hf.HFIntegrationError, match="attn_logit_softcapping = None"):
        hf.ulysses_attention_hf(None, q, q, q, None, dcp_ctx=SPContext.single(), softcap=50.0)
    # a model's own scale (Gemma-2's query_pre_attn_scalar) is applied exactly, not refused
    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(1, 4, 8, 8, generator=g) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(x, y, z, is_causal=True, scale=0.5).transpose(1, 2)
    torch.testing.assert_close(hf.ulysses_attention_hf(None, x, y, z, None, scaling=0.5)[0], want)
    with pytest.raises(hf.HFIntegrationError, match="sliding_window"):
        hf.ulysses_attention_hf(None, q, q, q, None, dcp_ctx=SPContext.single(), sliding_window=4)
    torch.testing.assert_close(hf.ulysses_attention_hf(None, q, q, q, None, sliding_window=8)[0], q.transpose(1, 2))


def test_set_manager_with_defaults_for_a_reference_and_an_hf_model():
    from dcp.models import T1DConfig, Transformer1D
    from dcp.planner import analytic_table_for

    for model in (Transformer1D(T1DConfig.tiny()), llama()):
        data = SyntheticTokenDataset(LENGTHS, vocab_size=64, seed=0)
        mgr = dcp.set_manager(model, data)  # the paper's call: config, forward, optimizer, adapter derived
        heads = mgr.config.model.num_heads
        assert heads == (4 if hf.is_hf_model(model) else 8)
        if hf.is_hf_model(model):  # fitted: SP sizes within the world size (1 process), edges up to the longest
            assert mgr.config.planning.sp_sizes == (1,) and mgr.config.profiling.seq_group_edges == (16, 32)
        else:
            assert mgr.config.planning.sp_sizes == tuple(p for p in (1, 2, 4, 8) if heads % p == 0)
        assert isinstance(mgr.engine.optimizer, torch.optim.AdamW)
        mgr.table = analytic_table_for(mgr.config, 1)  # (profiling with the default edges takes minutes on CPU)
        before = [p.detach().clone() for p in model.parameters()]
        for batch in mgr.get_data_iter():
            mgr.train_micro_batch(batch)
        assert mgr.step_stats and all(torch.isfinite(torch.tensor(s.loss)) for s in mgr.step_stats)
        assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    # a config whose [model] section is left at its default takes the model's shape
    mgr = dcp.set_manager(llama(), SyntheticTokenDataset(LENGTHS, vocab_size=64), DCPConfig(
        planning=PlanningConfig(sp_sizes=(1, 2))))
    assert mgr.config.model.hidden_size == 32 and mgr.config.model.name.startswith("llama-hf")


def test_missing_forward_fn_is_a_clear_error():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    from dcp.planner import analytic_table_for

    config = small_config("unused")
    mgr = set_manager(Plain(), SyntheticTokenDataset(LENGTHS, vocab_size=8), config,
                      table=analytic_table_for(config, 1))
    assert list(mgr.epoch_plans(0))  # planning needs no forward
    batch = next(iter(mgr.get_data_iter()))
    # the first forward fails at once with the fix, not deep inside the model
    with pytest.raises(ManagerError, match=r"Plain.forward cannot be called as model\(batch, ctx\): pass "
                                           r"set_manager\(\.\.\., forward_fn=fn\)"):
        mgr.engine(batch)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    gpt2._supports_attention_backend = False
    with pytest.raises(hf.HFIntegrationError, match="pass set_manager\\(\\.\\.\\., forward_fn=fn"):
        set_manager(gpt2, SyntheticTokenDataset(LENGTHS, vocab_size=8), small_config("unused"))


def test_need_profile_and_init_profiler_agree_on_the_key(tmp_path):
    data = SyntheticTokenDataset(LENGTHS, vocab_size=64, seed=0)
    config = small_config(tmp_path)
    model = llama()
    mgr = set_manager(model, data, config)
    # the key is the prepared model's adapter (SP-aware), not the default SP-1 HF adapter
    assert cache_key_for(mgr.adapter, config, 1) != cache_key_for(HFLlamaAdapter(llama()), config, 1)
    assert mgr.need_profile()
    mgr.init_profiler()
    again = set_manager(llama(), data, config)  # the second run of the same script
    assert not again.need_profile()
    again.init_profiler()
    assert again.table.rows == mgr.table.rows
    # an adapter handed to init_profiler becomes the manager's: need_profile then looks up its key
    third = set_manager(llama(), data, config)
    third.init_profiler(adapter=HFLlamaAdapter(third.model, sp_aware=False))  # another key: profiled
    assert third.adapter.sp_aware is False and third.table.rows != mgr.table.rows
    model = llama()
    fourth = set_manager(model, data, config, adapter=HFLlamaAdapter(model, sp_aware=False))
    assert fourth.adapter.sp_aware is False and not fourth.need_profile()  # set_manager's adapter is used


def _stale_cache(tmp_path, mgr, config):
    """Put a table profiled for another key at this run's cache path (what lookup calls stale)."""
    key = cache_key_for(mgr.adapter, config, 1)
    other = cache_key_for(mgr.adapter, small_config(tmp_path / "elsewhere", max_micro_batch_size=1), 1)
    first = set_manager(llama(), mgr.dataset, small_config(tmp_path / "elsewhere", max_micro_batch_size=1))
    first.init_profiler()
    path = cache.cache_path(config.profiling.cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.cache_path(tmp_path / "elsewhere", other).replace(path)
    assert cache.lookup(config.profiling.cache_dir, key).status == "stale"


def test_stale_table_is_reprofiled_in_the_run_with_a_log_line(tmp_path, caplog):
    config = small_config(tmp_path / "c")
    mgr = set_manager(llama(), SyntheticTokenDataset(LENGTHS, vocab_size=64), config)
    _stale_cache(tmp_path, mgr, config)
    assert mgr.need_profile()
    with caplog.at_level(logging.INFO, logger="dcp"):
        mgr.init_profiler()
    text = caplog.text
    assert "is stale (max_micro_batch_size: cached 1 vs now 2" in text and "re-profiling inside this run" in text
    assert "profiled inside this run (the cached table was stale" in text
    assert not set_manager(llama(), mgr.dataset, config).need_profile()  # the fresh table is now cached


def test_strict_cache_refuses_stale_and_missing_tables(tmp_path):
    config = small_config(tmp_path / "c", strict_cache=True)
    mgr = set_manager(llama(), SyntheticTokenDataset(LENGTHS, vocab_size=64), config)
    with pytest.raises(ManagerError, match=r"strict_cache \(true\) but .* holds no cached profile table.*set "
                                           "advanced.strict_cache = false"):
        mgr.init_profiler()
    _stale_cache(tmp_path, mgr, config)
    with pytest.raises(ManagerError, match="is stale .*strict_cache \\(true\\) forbids re-profiling"):
        mgr.need_profile()
    with pytest.raises(ManagerError, match="forbids re-profiling"):
        mgr.init_profiler()
    mgr.init_profiler(refresh=True)  # an explicit refresh still profiles
    assert len(mgr.table) > 0


def test_corrupt_table_is_refused_even_when_not_strict(tmp_path):
    config = small_config(tmp_path)
    mgr = set_manager(llama(), SyntheticTokenDataset(LENGTHS, vocab_size=64), config)
    path = cache.cache_path(tmp_path, cache_key_for(mgr.adapter, config, 1))
    path.write_text("not a profile table\n")
    with pytest.raises(cache.CorruptCacheError):
        mgr.need_profile()
    with pytest.raises(cache.CorruptCacheError):
        mgr.init_profiler()


def test_strict_cache_config_field():
    assert config_from_dict({"advanced": {"strict_cache": True}}).advanced.strict_cache is True
    with pytest.raises(ConfigError, match=r"advanced.strict_cache \('yes'\) must be of type bool"):
        config_from_dict({"advanced": {"strict_cache": "yes"}})
    with pytest.raises(ConfigError, match=r"advanced.strict_cache \(1\) must be true or false"):
        AdvancedConfig(strict_cache=1)


def test_byte_corpus_is_real_and_length_diverse():
    corpus = ByteCorpus(num_samples=200, max_len_tokens=512, seed=0)
    lengths = corpus.lengths()
    assert len(corpus) == 200 and min(lengths) >= 16 and max(lengths) == 512
    assert len(set(lengths)) > 50  # diverse, not one fixed length
    assert corpus.lengths() == ByteCorpus(num_samples=200, max_len_tokens=512, seed=0).lengths()
    batch = corpus.collate([corpus[0], corpus[1]])
    assert bytes(batch.inputs[0, : lengths[0]].tolist()).decode("utf-8", "replace").strip()
    assert corpus.target_counts() == [n - 1 for n in lengths]
    with pytest.raises(CorpusError, match="num_samples"):
        ByteCorpus(num_samples=10**9)
    with pytest.raises(CorpusError, match="min_len_tokens"):
        ByteCorpus(min_len_tokens=1)
    with pytest.raises(CorpusError, match="max_len_tokens"):
        ByteCorpus(min_len_tokens=64, max_len_tokens=32)


def test_the_example_adds_the_lines_it_claims():
    """examples/hf_llama.py = examples/hf_llama_plain.py + the lines marked # DCP (the README's count)."""
    import difflib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples"

    def code(name):  # the file without its module docstring
        text = (root / name).read_text()
        return text[text.index('"""', 3) + 3:].splitlines()

    added = [line[1:] for line in difflib.unified_diff(code("hf_llama_plain.py"), code("hf_llama.py"), lineterm="", n=0)
             if line.startswith("+") and not line.startswith("+++")]
    assert added == [line for line in code("hf_llama.py") if line.rstrip().endswith("# DCP") or "# DCP:" in line]
    assert len(added) == 16


def test_a_padded_micro_batch_runs_only_its_real_tokens_and_equals_its_samples_one_by_one():
    """Unequal lengths run as one row of documents: the decoder layers see 11 + 6 tokens, not 2 x 11, and the
    loss and gradients are those of the two samples run alone (RoPE restarts, attention stays per sample)."""
    model = llama()
    integration = hf.prepare(model)
    data = SyntheticTokenDataset([11, 6], vocab_size=64, seed=3)
    seen = []
    hook = model.model.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(tuple(args[0].shape[:2])))
    loss, count = integration.forward(model, data.collate([data[0], data[1]]), SPContext.single())
    loss.backward()
    together = [p.grad.clone() for p in model.parameters()]
    assert seen == [(1, 17)] and int(count) == 10 + 5
    model.zero_grad()
    seen.clear()
    alone = 0.0
    for i in (0, 1):
        one, _ = integration.forward(model, data.collate([data[i]]), SPContext.single())
        one.backward()
        alone += float(one.detach())
    hook.remove()
    assert seen == [(1, 11), (1, 6)]  # equal-length micro-batches keep their rows
    torch.testing.assert_close(float(loss.detach()), alone, rtol=1e-5, atol=1e-5)
    for g_together, p in zip(together, model.parameters(), strict=True):
        torch.testing.assert_close(g_together, p.grad, rtol=1e-4, atol=1e-6)
