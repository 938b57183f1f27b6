"""``[model]`` is derived from the model wherever ``set_manager`` is given one: left out it is filled in (the
reference models' ``config.shape()``, an HF model's config), and a written one that disagrees with the model
fails in one line naming the field, both values and the fix, before anything is profiled or planned."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.api import _resolve_config, set_manager
from dcp.config import ConfigError, DCPConfig, ModelShapeConfig, ProfilingConfig
from dcp.models import build_model
from dcp.runtime.data import SyntheticTokenDataset

LENGTHS = [40, 64, 33, 50]


def _set(model, config):
    data = SyntheticTokenDataset(LENGTHS, vocab_size=64)
    return set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_left_out_model_section_is_the_models_own():
    model = build_model("t1d-tiny")
    config = _resolve_config(model, DCPConfig(profiling=ProfilingConfig(seq_group_edges=(64,))), None)
    assert config.model == model.config.shape()
    # written and equal to the model's: kept as written (a name of the user's own is not the model's to check)
    named = dataclasses.replace(model.config.shape(), name="mine", optimizer_bytes_per_param=12)
    assert _resolve_config(model, DCPConfig(model=named), None).model == named


@pytest.mark.parametrize(("change", "field", "ours", "theirs"), [
    ({"num_layers": 6}, "num_layers", 6, 4),
    ({"hidden_size": 128}, "hidden_size", 128, 64),
    ({"ffn_hidden_size": 100}, "ffn_hidden_size", 100, 256),
    ({"vocab_size": 512}, "vocab_size", 512, 256),
    ({"attentions_per_layer": 2}, "attentions_per_layer", 2, 1),
    ({"num_kv_heads": 4}, "num_kv_heads", 4, 8),
])
def test_a_written_model_section_that_disagrees_with_the_model_fails_in_one_line(change, field, ours, theirs):
    model = build_model("t1d-tiny")
    assert dataclasses.asdict(model.config.shape())[field] in (theirs, 0)  # the figures this test states
    wrong = dataclasses.replace(model.config.shape(), **change)
    with pytest.raises(ConfigError) as info:
        _set(model, DCPConfig(model=wrong))
    message = str(info.value)
    assert "\n" not in message
    assert message == (f"model.{field} ({ours}) differs from the model's ({theirs}, from model.config.shape()): "
                       f"leave [model] out (it is derived from the model) or set {field} = {theirs}")


def test_a_two_dimensional_model_is_checked_against_its_own_shape():
    model = build_model("t2d-tiny")
    assert _resolve_config(model, DCPConfig(model=model.config.shape()), None).model == model.config.shape()
    one_d = dataclasses.replace(model.config.shape(), attentions_per_layer=1)
    with pytest.raises(ConfigError, match=r"^model\.attentions_per_layer \(1\) differs from the model's \(2, "):
        _resolve_config(model, DCPConfig(model=one_d), None)


def test_an_hf_model_is_checked_against_its_config():
    transformers = pytest.importorskip("transformers")
    from dcp.integrations.hf import model_shape

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256))
    # left out: the HF config's shape (set_manager's HF path fits the rest of the config too)
    assert _resolve_config(model, DCPConfig(), None).model == model_shape(model)
    wrong = dataclasses.replace(model_shape(model), num_layers=3)
    with pytest.raises(ConfigError, match=r"^model\.num_layers \(3\) differs from the model's \(2, from its Hugging "
                                          r"Face config\): leave \[model\] out .* or set num_layers = 2$"):
        _set(model, DCPConfig(model=wrong))
    assert ModelShapeConfig().num_layers != 2  # the default [model] is not the model's: it is replaced, not checked


def test_a_model_without_a_shape_is_still_checked_by_its_head_count():
    import types

    model = torch.nn.Linear(2, 2)
    model.config = types.SimpleNamespace(num_heads=4)  # a model of the user's own: heads known, no shape()
    with pytest.raises(ConfigError, match=r"^model\.num_heads \(8\) differs from the model's head count \(4\): "):
        _resolve_config(model, DCPConfig(), None)
    assert _resolve_config(model, DCPConfig(model=ModelShapeConfig(num_heads=4)), None).model.num_heads == 4
