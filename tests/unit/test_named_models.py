"""dcp.named_models: the one registry of model names and the paper shapes every user reads."""

from __future__ import annotations

import pytest

from dcp.config import ModelShapeConfig
from dcp.named_models import MODEL_NAMES, MODELS, PAPER_MODELS, T1D_5B, NamedModel, named_model


def test_every_user_reads_the_same_names():
    from dcp.experiments import sweep
    from dcp.models import MODEL_NAMES as BUILDERS
    from dcp.sim.scenario import scenario

    assert MODEL_NAMES == ("t1d-tiny", "t2d-tiny", "t1d-5b", "t2d-1.2b")
    assert tuple(BUILDERS) == MODEL_NAMES
    assert sweep.MODEL_NAMES is MODEL_NAMES
    assert PAPER_MODELS == ("t1d-5b", "t2d-1.2b")
    for name in PAPER_MODELS:
        assert scenario(name, "h100").model is MODELS[name].paper_shape


@pytest.mark.parametrize("name", ["t1d-5b", "t2d-1.2b"])
def test_the_models_config_has_the_simulators_shape(name):
    from dcp.models import build_config

    cfg, shape = build_config(name), MODELS[name].paper_shape
    got = cfg.shape()
    for field in ("name", "num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "attentions_per_layer"):
        assert getattr(got, field) == getattr(shape, field), field


def test_unknown_name_lists_the_valid_ones():
    from dcp.models import build_config

    for call in (named_model, build_config):
        with pytest.raises(ValueError, match=r"model name \('t3d'\) is not one of \['t1d-5b'"):
            call("t3d")


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="x", family="t3d", preset="tiny"), r"NamedModel.family \('t3d'\) is not one of"),
    (dict(name="x", family="t1d", preset="paper_5b", paper_shape=T1D_5B), r"paper_shape.name \('t1d-5b'\) differs"),
    (dict(name="t1d-5b", family="t1d", preset="paper_5b", paper_shape=T1D_5B, sp_sizes=(1, 5)),
     r"sp_sizes \(\(1, 5\)\) holds 5, which does not divide num_heads \(48\)"),
])
def test_bad_entries_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NamedModel(**kwargs)


def test_paper_shapes_are_shapes():
    assert all(isinstance(MODELS[n].paper_shape, ModelShapeConfig) for n in PAPER_MODELS)
    assert MODELS["t2d-1.2b"].attention == "2d" and MODELS["t1d-5b"].attention == "1d"
