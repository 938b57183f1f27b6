"""Model configs: named sizes and every validation error (field, value, rule, fix)."""

from __future__ import annotations

import pytest

from dcp.config import ConfigError
from dcp.models import MODEL_NAMES, T1DConfig, T2DConfig, build_config, build_model


def test_named_sizes_match_the_paper():
    c1 = T1DConfig.paper_5b()
    assert (c1.num_layers, c1.hidden_size, c1.num_heads) == (42, 3072, 48)
    assert 4.8e9 < c1.shape().num_params < 5.1e9
    c2 = T2DConfig.paper_1_2b()
    assert (c2.num_layers, c2.hidden_size, c2.num_heads) == (28, 1152, 16)
    assert 1.1e9 < c2.shape().num_params < 1.3e9
    tiny = build_model("t2d-tiny")
    # the planner's parameter estimate matches the real module for both tiny models
    for name in ("t1d-tiny", "t2d-tiny"):
        model = build_model(name) if name != "t2d-tiny" else tiny
        real = sum(p.numel() for p in model.parameters())
        assert abs(model.config.shape().num_params - real) / real < 0.05
    assert set(MODEL_NAMES) == {"t1d-tiny", "t1d-5b", "t2d-tiny", "t2d-1.2b"}
    assert build_config("t1d-tiny", num_layers=2).num_layers == 2


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: T1DConfig(num_layers=0), "t1d.num_layers (0) must be >= 1"),
        (lambda: T1DConfig(ffn_hidden_size=-1), "t1d.ffn_hidden_size (-1)"),
        (lambda: T1DConfig(hidden_size=60, num_heads=8), "t1d.hidden_size (60) is not divisible"),
        (lambda: T1DConfig(hidden_size=24, num_heads=8), "t1d.num_heads (8) gives an odd head_dim"),
        (lambda: T1DConfig(rope_theta=0.0), "t1d.rope_theta/norm_eps/init_std"),
        (lambda: T1DConfig(ulysses_impl="ring"), "t1d.ulysses_impl ('ring')"),
        (lambda: T2DConfig(in_channels=0), "t2d.in_channels (0) must be >= 1"),
        (lambda: T2DConfig(out_channels=-2), "t2d.out_channels (-2)"),
        (lambda: T2DConfig(hidden_size=30, num_heads=4), "t2d.hidden_size (30) is not divisible"),
        (lambda: T2DConfig(init_std=0.0), "t2d.norm_eps/init_std"),
        (lambda: T2DConfig(ulysses_impl="x"), "t2d.ulysses_impl ('x')"),
        (lambda: T2DConfig(synthetic_spatial_per_frame=-1.0), "t2d.synthetic_spatial_per_frame (-1.0) must be >= 0"),
        (lambda: build_config("gpt2"), "model name ('gpt2') is not one of"),
    ],
)
def test_config_errors(make, words):
    with pytest.raises(ValueError) as exc:
        make()
    assert words in str(exc.value) and ":" in str(exc.value)
    if "model name" not in words:
        assert isinstance(exc.value, ConfigError)


def test_synthetic_2d_shapes_follow_the_data_aspect():
    import torch

    from dcp.models.t2d import synthetic_shape

    tiny = T2DConfig.tiny()  # 4 spatial tokens per frame, the cpu grid's heaviest buckets (datasets/grids.toml)
    assert [synthetic_shape(tiny, s) for s in (64, 256, 1024, 2048)] == [(4, 16), (8, 32), (16, 64), (23, 90)]
    assert synthetic_shape(tiny, 2) == (1, 2)  # at least one frame, never more frames than tokens
    # 0 keeps T = synthetic_frames (the paper model, whose calibration rows were profiled that way)
    assert synthetic_shape(T2DConfig.paper_1_2b(), 4096) == (16, 256)
    assert synthetic_shape(T2DConfig(synthetic_frames=4), 1024) == (4, 256)
    batch = build_model("t2d-tiny").synthetic_batch(2, 1024, generator=torch.Generator().manual_seed(0))
    assert batch.shapes == ((16, 64), (16, 64)) and batch.seq_lens == (1024, 1024)
