"""runtime.compile (dcp.runtime.compiled): each block under torch.compile with attention left eager.

The CPU tests compile with torch.compile's "aot_eager" backend: the same capture, graph breaks and autograd
split as Inductor, without code generation (seconds, no C++ compiler in a timed test). Exactness against
eager is checked on equal rows, packed micro-batches and recomputed layers; a packed micro-batch with a new
number of documents must not recompile (attention reads the host-int layout outside the graph)."""

from __future__ import annotations

import copy

import pytest
import torch

from dcp.config import ConfigError, RuntimeConfig
from dcp.data import collate_tokens
from dcp.models import build_model
from dcp.runtime.compiled import compile_layers, layer_modules
from dcp.runtime.context import SPContext

TOL = dict(rtol=1e-5, atol=1e-5)


def _step(model, batch, recompute_layers=0):
    model.zero_grad(set_to_none=True)
    loss, count = model(batch, SPContext.single(attention="sdpa").replace(recompute_layers=recompute_layers))
    loss.backward()
    return loss.detach(), int(count), {n: p.grad.clone() for n, p in model.named_parameters()}


def _tokens(gen, *lengths):
    return collate_tokens([torch.randint(0, 256, (n,), generator=gen) for n in lengths])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # every test compiles from scratch: no graphs of another test's shapes
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["t1d-tiny", "t2d-tiny"])
def test_compiled_blocks_match_eager(name):
    eager = build_model(name)
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled, "default", backend="aot_eager") == len(eager.layers)
    gen = torch.Generator().manual_seed(0)
    if name == "t1d-tiny":
        batches = [_tokens(gen, 32, 32), _tokens(gen, 32, 20, 7), _tokens(gen, 40, 9), _tokens(gen, 24)]
    else:
        batches = [eager.synthetic_batch(b, s, generator=gen) for b, s in ((2, 32), (1, 48), (2, 16))]
    for batch in batches:
        for r in (0, 2):  # recomputed layers run the compiled block again in the backward
            loss_e, count_e, grads_e = _step(eager, batch, r)
            loss_c, count_c, grads_c = _step(compiled, batch, r)
            torch.testing.assert_close(loss_c, loss_e, **TOL)
            assert count_c == count_e
            assert grads_c.keys() == grads_e.keys()
            for n in grads_e:
                torch.testing.assert_close(grads_c[n], grads_e[n], **TOL, msg=n)
    # compiled in place: the state dict keeps the module's own names
    assert list(compiled.state_dict()) == list(eager.state_dict())


def test_a_new_document_layout_does_not_recompile():
    model = build_model("t1d-tiny")
    compile_layers(model, "default", backend="aot_eager")
    gen = torch.Generator().manual_seed(1)
    # Warm-up: one row (static, then dynamic in the length) and packed rows (attention returns a new tensor
    # there, a view for one document per row: the graph after attention keeps one entry for each kind).
    for lengths in ((32,), (48,), (20, 12), (30, 10, 5, 3)):
        _step(model, _tokens(gen, *lengths))
    # new lengths and new numbers of documents: the graphs around attention see only [1, s, h] tensors
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lengths in ((7, 6, 5, 4, 3, 2, 1), (64,), (33, 31), (100,), (9, 90)):
            _step(model, _tokens(gen, *lengths))


def test_off_compiles_nothing_and_bad_modes_fail_in_one_line():
    model = build_model("t1d-tiny")
    assert compile_layers(model, "off") == 0
    assert all(layer._compiled_call_impl is None for layer in model.layers)
    with pytest.raises(ValueError, match=r"runtime.compile \('fast'\) is not one of"):
        compile_layers(model, "fast")
    with pytest.raises(ConfigError, match="runtime.compile"):
        RuntimeConfig(compile="fast")


def test_layer_modules_finds_the_blocks_or_names_the_fix():
    model = build_model("t2d-tiny")
    assert layer_modules(model) == list(model.layers)
    with pytest.raises(ValueError, match=r"no non-empty `layers`.*runtime.compile = \"off\""):
        layer_modules(torch.nn.Linear(2, 2))


def test_set_manager_refuses_compile_for_a_hugging_face_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    from dcp.api import set_manager
    from dcp.config import DCPConfig, ProfilingConfig
    from dcp.runtime.data import SyntheticTokenDataset

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256))
    config = DCPConfig(profiling=ProfilingConfig(cache_dir=str(tmp_path)), runtime=RuntimeConfig(compile="default"))
    attention = model.config._attn_implementation
    with pytest.raises(ConfigError, match=r"runtime.compile \('default'\) is for models whose blocks.*compile = \"off\""):
        set_manager(model, SyntheticTokenDataset([13, 7, 30], vocab_size=64), config)
    # refused before anything touched the model: no compiled layer, its own attention kept
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    assert model.config._attn_implementation == attention


def test_set_manager_compiles_the_layers_before_the_engine_wraps_them():
    from dcp.api import set_manager
    from dcp.config import DCPConfig
    from dcp.planner import CPU_SMALL, analytic_table
    from dcp.runtime.data import SyntheticTokenDataset

    model = build_model("t1d-tiny")
    data = SyntheticTokenDataset([40, 64, 33, 20], vocab_size=model.config.vocab_size)
    config = DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(compile="default"))
    table = analytic_table(config.model, config.profiling.seq_group_edges, sp_sizes=(1,), max_micro_batch_size=8,
                           world_size=1, hardware=CPU_SMALL, mem_capacity_bytes=config.planning.mem_capacity_bytes)
    names = list(model.state_dict())
    set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), table=table)
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    assert list(model.state_dict()) == names  # checkpoints keep their keys


def test_the_cache_key_keeps_eager_tables_and_separates_compiled_ones():
    import dataclasses

    from dcp.config import DCPConfig
    from dcp.profiler.cache import CacheKey
    from dcp.profiler.dual_layer import cache_key_for

    model = build_model("t1d-tiny")
    eager = cache_key_for(model, DCPConfig(model=model.config.shape()), 1)
    compiled = cache_key_for(model, DCPConfig(model=model.config.shape(), runtime=RuntimeConfig(compile="default")), 1)
    assert compiled == dataclasses.replace(eager, compile="default")
    # an eager key is stored without the field, so tables profiled before it existed keep their digest and path
    assert "compile" not in eager.to_dict() and compiled.to_dict()["compile"] == "default"
    assert CacheKey.from_dict(eager.to_dict()) == eager and CacheKey.from_dict(compiled.to_dict()) == compiled
    assert eager.digest() != compiled.digest()
    assert eager.diff(compiled) == {"compile": ("off", "default")}


def test_bench_gpu_only_short_runs_on_cpu():
    """`dcp bench gpu --only short` through its hidden tiny CPU path (aot_eager): every variant that exists on
    CPU measures every micro-batch (CUDA graphs and the busy share need CUDA)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "dcp.cli", "bench", "gpu", "--device", "cpu", "--tiny", "--only",
                          "short", "--reps", "1", "--json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert {(r["variant"], r["weights"]) for r in rows} == {
        ("eager", "autocast"), ("eager", "bf16-module"), ("compiled", "autocast"), ("compiled", "bf16-module")}
    assert len(rows) == 4 * 6 and all(r["wall_ms"] > 0 and r["busy"] is None for r in rows)
