"""Length distributions: deterministic, within their grids, dominated by the tier their spec says."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dcp.data_dists import (
    DistributionError,
    compute_shares_of,
    default_spec_dir,
    distribution_names,
    get_spec,
    load_distribution,
    load_grid_scale,
    load_lengths,
    load_shapes,
    sweep_names,
)

NAMED = ["t1d-short", "t1d-balanced", "t1d-long", "t2d-short", "t2d-balanced", "t2d-long", "t2d-zipf", "text"]


def test_named_distributions_listed():
    assert sorted(NAMED) == distribution_names()


@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("scale", ["paper", "cpu"])
def test_deterministic_and_within_grid(name, scale):
    a = load_distribution(name, scale=scale, num_samples=300, seed=3)
    b = load_distribution(name, scale=scale, num_samples=300, seed=3)
    c = load_distribution(name, scale=scale, num_samples=300, seed=4)
    assert a == b and a != c and len(a) == 300
    grid = load_grid_scale(get_spec(name).grid, scale)
    assert grid.min_tokens <= min(a) and max(a) <= grid.max_tokens
    if scale == "cpu":
        assert 32 <= min(a) and max(a) <= 2048  # tiny models on CPU


def test_text_documents_far_below_their_group_bounds_with_a_long_tail():
    import numpy as np

    x = np.asarray(load_distribution("text", num_samples=30000, seed=0))
    body = x[x < 2048]
    assert 250 <= body.mean() <= 350  # the lognormal body's mean ~300 tokens
    assert np.median(x) < 1024 / 4  # most documents far below the first seq_group bound (1k)
    assert 0.01 <= (x >= 2048).mean() <= 0.04  # the tail holds ~2% of the documents
    assert 65536 < x.max() <= 131072  # and reaches the grid's max (128k)


def test_text_sampler_bad_fields_name_them(tmp_path):
    from dcp.data_dists.spec import DistributionSpec

    with pytest.raises(DistributionError, match="tail_share/tail_min_tokens"):
        DistributionSpec(name="x", grid="text", sampler="text", tail_share=1.0)
    with pytest.raises(DistributionError, match="body_mean_tokens/body_log_std/tail_alpha"):
        DistributionSpec(name="x", grid="text", sampler="text", body_mean_tokens=0)


def test_2d_shapes_come_from_video_buckets():
    shapes = load_shapes("t2d-balanced", num_samples=200, seed=0)
    grid = load_grid_scale("t2d", "paper")
    assert set(shapes) <= set(grid.buckets())
    assert load_distribution("t2d-balanced", num_samples=200, seed=0) == [f * s for f, s in shapes]
    assert max(f * s for f, s in grid.buckets()) == 204 * 3600  # 720p x 204 frames


def test_load_shapes_of_1d_distribution_fails():
    with pytest.raises(DistributionError, match="is 1d"):
        load_shapes("t1d-short", num_samples=10)


@pytest.mark.parametrize("grid_name,prefix", [("t1d", "t1d"), ("t2d", "t2d")])
def test_compute_dominance_matches_spec(grid_name, prefix):
    # CPU scale keeps the top tier frequent enough for a stable estimate from 20k samples.
    grid = load_grid_scale(grid_name, "cpu")
    for kind in ("short", "balanced", "long"):
        spec = get_spec(f"{prefix}-{kind}")
        lengths = load_lengths(spec.name, scale="cpu", num_samples=20000, seed=1)
        shapes = list(lengths.shapes) if lengths.shapes else [(1, t) for t in lengths.tokens]
        got = compute_shares_of(shapes, grid)
        for want, have in zip(spec.compute_shares, got, strict=True):
            assert abs(want - have) < 0.06, (spec.name, spec.compute_shares, got)
    long = load_lengths(f"{prefix}-long", scale="cpu", num_samples=20000, seed=2)
    shapes = list(long.shapes) if long.shapes else [(1, t) for t in long.tokens]
    shares = compute_shares_of(shapes, grid)
    assert shares[-1] > 0.6  # long samples carry most of the compute ...
    top_count = sum(1 for f, s in shapes if grid.tier_of_total(f * s) == grid.num_tiers - 1) if long.shapes else \
        sum(1 for _, t in shapes if t > grid.tier_edges_tokens[-2])
    assert top_count < 0.4 * len(shapes)  # ... while being a minority of the samples


def test_paper_scale_long_dominated_by_compute_not_count():
    lengths = load_distribution("t1d-long", num_samples=20000, seed=0)
    grid = load_grid_scale("t1d", "paper")
    shares = compute_shares_of([(1, t) for t in lengths], grid)
    assert shares[-1] > 0.5
    assert sum(1 for t in lengths if t > 131072) < 0.05 * len(lengths)


def test_sweep_has_140_distinct_deterministic_members():
    names = sweep_names()
    assert len(names) == 140 and len(set(names)) == 140
    a = load_distribution(names[57], num_samples=100, seed=0)
    assert a == load_distribution(names[57], num_samples=100, seed=0)
    assert {get_spec(n).sampler for n in names} == {"lognormal", "zipf", "tiers"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": "nope", "num_samples": 10}, "is not known"),
        ({"name": "sweep-nope-000", "num_samples": 10}, "is not a sweep member"),
        ({"name": "grids", "num_samples": 10}, "is not known"),
        ({"name": "t1d-short", "num_samples": 0}, "num_samples"),
        ({"name": "t1d-short", "num_samples": 10, "scale": "huge"}, "scale"),
    ],
)
def test_bad_arguments(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(DistributionError, match=match):
        load_distribution(name, **kwargs)


def _spec_dir(tmp_path: Path) -> Path:
    d = tmp_path / "datasets"
    shutil.copytree(default_spec_dir(), d)
    return d


@pytest.mark.parametrize(
    "text,match",
    [
        ('name = "x"\ngrid = "t1d"\nsampler = "tiers"\ncompute_shares = [0.5, 0.6, 0.0, 0.0]\n', "sum to 1"),
        ('name = "x"\ngrid = "t1d"\nsampler = "tiers"\ncompute_share = [1.0]\n', "valid keys are"),
        ('name = "y"\ngrid = "t1d"\nsampler = "tiers"\ncompute_shares = [1, 0, 0, 0]\n', "differs from the file"),
        ('name = "x"\ngrid = "t1d"\nsampler = "magic"\n', "sampler"),
        ('name = "x"\nsampler = "zipf"\n', "grid"),
        ('name = "x"\ngrid = "t3d"\nsampler = "zipf"\n', "is not a section"),
        ('name = "x"\ngrid = "t2d"\nsampler = "zipf"\nzipf_order = "up"\n', "zipf_order"),
        ("name = [\n", "not valid TOML"),
    ],
)
def test_spec_errors(tmp_path, text, match):
    d = _spec_dir(tmp_path)
    (d / "x.toml").write_text(text)
    with pytest.raises(DistributionError, match=match):
        load_distribution("x", num_samples=5, spec_dir=d)


def test_grid_errors(tmp_path):
    d = _spec_dir(tmp_path)
    grids = (d / "grids.toml").read_text()
    (d / "grids.toml").write_text(grids.replace("tier_edges_tokens = [0, 128, 512, 1024, 0]",
                                                "tier_edges_tokens = [0, 128, 512, 100000, 0]"))
    with pytest.raises(DistributionError, match="without buckets"):
        load_distribution("t2d-short", scale="cpu", num_samples=5, spec_dir=d)
    (d / "grids.toml").write_text(grids.replace("round_tokens = 16", "round_tokenz = 16"))
    with pytest.raises(DistributionError, match="valid keys"):
        load_distribution("t1d-short", scale="cpu", num_samples=5, spec_dir=d)
    (d / "grids.toml").write_text(grids.replace("[64, 256, 512, 1024, 2048]", "[64, 512, 256, 1024, 2048]"))
    with pytest.raises(DistributionError, match="strictly increasing"):
        load_distribution("t1d-short", scale="cpu", num_samples=5, spec_dir=d)
    (d / "grids.toml").unlink()
    with pytest.raises(DistributionError, match="does not exist"):
        load_distribution("t1d-short", num_samples=5, spec_dir=d)


def test_sweep_errors(tmp_path):
    d = _spec_dir(tmp_path)
    (d / "sweep.toml").write_text('[[family]]\nname = "a"\ngrid = "t1d"\nsampler = "tiers"\ncount = 0\n')
    with pytest.raises(DistributionError, match="count"):
        sweep_names(d)
    (d / "sweep.toml").write_text('[[family]]\nname = "a"\ngrid = "t1d"\nsampler = "odd"\n')
    with pytest.raises(DistributionError, match="sampler"):
        sweep_names(d)
    (d / "sweep.toml").write_text('[[family]]\nname = "a"\n')
    with pytest.raises(DistributionError, match="required"):
        sweep_names(d)
