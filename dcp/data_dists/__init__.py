"""Sequence-length distributions for experiments, the simulator and the paper figures.

>>> from dcp.data_dists import load_distribution, load_shapes
>>> lengths = load_distribution("t1d-short", scale="cpu", num_samples=256, seed=0)   # list[int] of tokens
>>> shapes = load_shapes("t2d-long", scale="paper", num_samples=64, seed=0)          # list[(frames, spatial)]

The specs are data in the repository's top-level ``datasets/`` folder (see its README.md). Names are the file
stems (t1d-short, t1d-balanced, t1d-long, t2d-short, t2d-balanced, t2d-long, t2d-zipf) and the sweep members
(sweep-<family>-<index>, 140 of them, see ``sweep_names``). Every generator is seeded and deterministic.
"""

from __future__ import annotations

from pathlib import Path

from dcp.data_dists.lengths_csv import Lengths, LengthsFileError, load_lengths_csv, write_lengths_csv
from dcp.data_dists.sample import compute_shares_of, draw_shapes, tier_count_probs
from dcp.data_dists.spec import (
    SCALES,
    DistributionError,
    DistributionSpec,
    GridScale,
    default_spec_dir,
    load_grid_scale,
    load_spec,
)
from dcp.data_dists.sweep import SWEEP_PREFIX, sweep_specs

__all__ = [
    "SCALES",
    "DistributionError",
    "DistributionSpec",
    "GridScale",
    "Lengths",
    "LengthsFileError",
    "compute_shares_of",
    "distribution_names",
    "get_spec",
    "load_distribution",
    "load_grid_scale",
    "load_lengths",
    "load_lengths_csv",
    "load_shapes",
    "sweep_names",
    "tier_count_probs",
    "write_lengths_csv",
]


def distribution_names(spec_dir: Path | None = None) -> list[str]:
    """Named distributions (file stems of datasets/*.toml other than grids and sweep)."""
    d = spec_dir or default_spec_dir()
    return sorted(p.stem for p in d.glob("*.toml") if p.stem not in ("grids", "sweep"))


def sweep_names(spec_dir: Path | None = None) -> list[str]:
    return [s.name for s in sweep_specs(spec_dir)]


def get_spec(name: str, spec_dir: Path | None = None) -> DistributionSpec:
    """The spec of a named distribution or sweep member."""
    d = spec_dir or default_spec_dir()
    if name.startswith(SWEEP_PREFIX):
        for s in sweep_specs(d):
            if s.name == name:
                return s
        raise DistributionError(f"distribution ({name!r}) is not a sweep member: see sweep_names() for the list")
    path = d / f"{name}.toml"
    if name in ("grids", "sweep") or not path.exists():
        raise DistributionError(
            f"distribution ({name!r}) is not known in {d}: use one of {distribution_names(d)} or a sweep member"
        )
    return load_spec(path)


def load_lengths(name: str, *, scale: str = "paper", num_samples: int, seed: int = 0,
                 spec_dir: Path | None = None) -> Lengths:
    """Draw ``num_samples`` samples of a named distribution at a scale ('paper' or 'cpu'), deterministically."""
    if not isinstance(num_samples, int) or num_samples < 1:
        raise DistributionError(f"num_samples ({num_samples!r}) must be a positive integer: e.g. 1024")
    spec = get_spec(name, spec_dir)
    grid = load_grid_scale(spec.grid, scale, spec_dir)
    shapes = draw_shapes(spec, grid, num_samples, seed)
    tokens = tuple(f * s for f, s in shapes)
    return Lengths(tokens=tokens, shapes=tuple(shapes) if grid.dims == "2d" else None)


def load_distribution(name: str, *, scale: str = "paper", num_samples: int, seed: int = 0,
                      spec_dir: Path | None = None) -> list[int]:
    """Total tokens of every sample (frames * spatial tokens for 2d distributions)."""
    return list(load_lengths(name, scale=scale, num_samples=num_samples, seed=seed, spec_dir=spec_dir).tokens)


def load_shapes(name: str, *, scale: str = "paper", num_samples: int, seed: int = 0,
                spec_dir: Path | None = None) -> list[tuple[int, int]]:
    """(frames, spatial_tokens) of every sample of a 2d distribution."""
    got = load_lengths(name, scale=scale, num_samples=num_samples, seed=seed, spec_dir=spec_dir)
    if got.shapes is None:
        raise DistributionError(f"distribution ({name!r}) is 1d: use load_distribution for token lengths")
    return list(got.shapes)
