"""Length-distribution specs: parsed strictly from the TOML files in the top-level ``datasets/`` folder.

A *grid* (``datasets/grids.toml``) says which lengths exist at each scale (``paper`` or ``cpu``) and how they
split into tiers; a *distribution* (``datasets/<name>.toml``) names a grid and says how samples are drawn:

- ``tiers``: one compute share per tier (dominance is defined by compute cost, paper Appendix A);
- ``zipf``: the k-th smallest video bucket is drawn with probability ~ k^-a;
- ``lognormal``: log(length) normal between the grid's min and max (used by the imbalance sweep);
- ``text``: documents of a text corpus: a lognormal body (mean ``body_mean_tokens``) and a truncated Pareto
  tail from ``tail_min_tokens`` to the grid's max holding ``tail_share`` of the documents. Token parameters are
  at the ``paper`` scale; other scales shrink them by the ratio of the grids' maxima.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp.config import MAX_TOKENS, fail, read_toml

SCALES = ("paper", "cpu")
SAMPLERS = ("tiers", "zipf", "lognormal", "text")


class DistributionError(ValueError):
    """A distribution spec, name or argument breaks a rule; the message says which and how to fix it."""


def default_spec_dir() -> Path:
    """The repository's ``datasets/`` folder (an editable install keeps the package next to it)."""
    return Path(__file__).resolve().parents[2] / "datasets"


@dataclass(kw_only=True, slots=True, frozen=True)
class GridScale:
    """One scale of a grid: the lengths that exist and how they split into tiers."""

    dims: str
    """'1d' (token lengths) or '2d' (frames x spatial tokens)."""
    tier_edges_tokens: tuple[int, ...]
    """1d: K+1 increasing token bounds of K tiers. 2d: K+1 bounds on total tokens, tier k = (edge_k, edge_k+1],
    0 as the last edge means no upper bound."""
    attention_crossover_tokens: int
    """c of the compute-cost proxy: attention FLOPs equal dense FLOPs at this many tokens (8 x hidden size)."""
    round_tokens: int = 1
    """1d only: lengths are rounded to a multiple of this."""
    spatial_tokens: tuple[int, ...] = ()
    """2d only: spatial tokens per frame of each resolution, increasing."""
    spatial_names: tuple[str, ...] = ()
    """2d only: a name per resolution (e.g. 720p), for tables and plots."""
    frames: tuple[int, ...] = ()
    """2d only: frame counts (temporal tokens), increasing."""

    @property
    def num_tiers(self) -> int:
        return len(self.tier_edges_tokens) - 1

    @property
    def min_tokens(self) -> int:
        if self.dims == "1d":
            return self.tier_edges_tokens[0]
        return self.spatial_tokens[0] * self.frames[0]

    @property
    def max_tokens(self) -> int:
        if self.dims == "1d":
            return self.tier_edges_tokens[-1]
        return self.spatial_tokens[-1] * self.frames[-1]

    def buckets(self) -> list[tuple[int, int]]:
        """2d: every (frames, spatial_tokens) bucket, sorted by total tokens (ties: fewer frames first)."""
        pairs = [(f, s) for s in self.spatial_tokens for f in self.frames]
        return sorted(pairs, key=lambda fs: (fs[0] * fs[1], fs[0]))

    def tier_of_total(self, total: int) -> int:
        edges = self.tier_edges_tokens
        for k in range(self.num_tiers):
            hi = edges[k + 1]
            if (total > edges[k] or k == 0) and (hi == 0 or total <= hi):
                return k
        return self.num_tiers - 1

    def cost(self, frames: int, spatial: int) -> float:
        """Compute-cost proxy of one sample (arbitrary unit); 1d samples are frames=1, spatial=tokens."""
        c = self.attention_crossover_tokens
        if self.dims == "1d":
            s = frames * spatial
            return s * (1.0 + s / c)
        return frames * spatial * (1.0 + spatial / c + frames / c)


@dataclass(kw_only=True, slots=True, frozen=True)
class DistributionSpec:
    """How samples of one distribution are drawn from a grid."""

    name: str
    """Name used by load_distribution (the file stem, or sweep-<family>-<index>)."""
    grid: str
    """Grid section of grids.toml: t1d or t2d."""
    sampler: str
    """tiers, zipf or lognormal."""
    description: str = ""
    """One line for listings."""
    compute_shares: tuple[float, ...] = ()
    """tiers: share of the total compute per tier (shortest first), sums to 1."""
    zipf_exponent: float = 1.0
    """zipf: a in P(k-th bucket) ~ k^-a."""
    zipf_order: str = "ascending"
    """zipf: 'ascending' (smallest bucket most common) or 'descending'."""
    log_position_mean: float = 0.5
    """lognormal: mean of log(length) as a position between log(min) (0) and log(max) (1)."""
    log_position_std: float = 0.2
    """lognormal: standard deviation of that position."""
    body_mean_tokens: float = 300.0
    """text: mean length of the lognormal body (paper-scale tokens)."""
    body_log_std: float = 1.0
    """text: standard deviation of log(length) in the body."""
    tail_share: float = 0.02
    """text: share of the documents drawn from the tail."""
    tail_min_tokens: int = 2048
    """text: shortest tail document (paper-scale tokens); the tail ends at the grid's max."""
    tail_alpha: float = 1.0
    """text: Pareto exponent of the tail (P(length > x) ~ x^-alpha)."""

    def __post_init__(self) -> None:
        where = f"distribution {self.name}"
        if self.sampler not in SAMPLERS:
            _fail(f"{where}: sampler", self.sampler, f"is not one of {list(SAMPLERS)}", "pick one of those")
        if self.sampler == "tiers":
            shares = self.compute_shares
            if not shares or any(s < 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-6:
                _fail(f"{where}: compute_shares", list(shares), "must be >= 0 and sum to 1",
                      "give one share per tier, e.g. [0.25, 0.25, 0.25, 0.25]")
        if self.zipf_order not in ("ascending", "descending"):
            _fail(f"{where}: zipf_order", self.zipf_order, "is not ascending or descending", "pick one")
        if self.zipf_exponent < 0:
            _fail(f"{where}: zipf_exponent", self.zipf_exponent, "must be >= 0", "use e.g. 1.0")
        if self.body_mean_tokens <= 0 or self.body_log_std <= 0 or self.tail_alpha <= 0:
            _fail(f"{where}: body_mean_tokens/body_log_std/tail_alpha",
                  (self.body_mean_tokens, self.body_log_std, self.tail_alpha), "must all be > 0",
                  "e.g. body_mean_tokens = 300, body_log_std = 1.0, tail_alpha = 1.0")
        if not 0 <= self.tail_share < 1 or self.tail_min_tokens < 1:
            _fail(f"{where}: tail_share/tail_min_tokens", (self.tail_share, self.tail_min_tokens),
                  "need 0 <= tail_share < 1 and tail_min_tokens >= 1", "e.g. tail_share = 0.02, tail_min_tokens = 2048")
        if not 0 <= self.log_position_mean <= 1 or self.log_position_std <= 0:
            _fail(f"{where}: log_position_mean/std", (self.log_position_mean, self.log_position_std),
                  "need mean in [0, 1] and std > 0", "e.g. mean 0.5, std 0.2")


_fail = functools.partial(fail, error=DistributionError)


def _read_toml(path: Path) -> dict[str, Any]:
    return read_toml(path, what="spec file", missing_fix="check the datasets folder", error=DistributionError)


def _check_keys(where: str, raw: dict[str, Any], valid: set[str]) -> None:
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise DistributionError(f"{where}: key {unknown[0]!r} is not known: valid keys are {sorted(valid)}")


def _int_tuple(where: str, key: str, raw: dict[str, Any]) -> tuple[int, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v <= MAX_TOKENS for v in value):
        _fail(f"{where}.{key}", value, f"must be a list of integers in [0, {MAX_TOKENS}]", "e.g. [64, 256, 1024]")
    return tuple(value)


def load_grid_scale(grid: str, scale: str, spec_dir: Path | None = None) -> GridScale:
    """Read one scale of one grid from grids.toml, validated."""
    if scale not in SCALES:
        _fail("scale", scale, f"is not one of {list(SCALES)}", "use 'paper' or 'cpu'")
    path = (spec_dir or default_spec_dir()) / "grids.toml"
    raw = _read_toml(path)
    if grid not in raw:
        _fail(f"{path}: grid", grid, f"is not a section of grids.toml ({sorted(raw)})", "name an existing grid")
    section = raw[grid]
    _check_keys(f"{path} [{grid}]", section, {"dims", *SCALES})
    dims = section.get("dims")
    if dims not in ("1d", "2d"):
        _fail(f"{path} [{grid}].dims", dims, "is not '1d' or '2d'", "set dims = \"1d\" or \"2d\"")
    if scale not in section:
        _fail(f"{path} [{grid}]", scale, "has no such scale", f"add a [{grid}.{scale}] section")
    sc = section[scale]
    where = f"{path} [{grid}.{scale}]"
    valid = {"tier_edges_tokens", "attention_crossover_tokens", "round_tokens"}
    if dims == "2d":
        valid |= {"spatial_tokens", "spatial_names", "frames"}
    _check_keys(where, sc, valid)
    edges = _int_tuple(where, "tier_edges_tokens", sc)
    crossover = sc.get("attention_crossover_tokens", 0)
    round_tokens = sc.get("round_tokens", 1)
    if type(round_tokens) is not int or not 1 <= round_tokens <= MAX_TOKENS:
        _fail(f"{where}.round_tokens", round_tokens, "must be a positive integer", "use 1 for no rounding")
    if type(crossover) is not int or not 1 <= crossover <= MAX_TOKENS:
        _fail(f"{where}.attention_crossover_tokens", crossover, "must be a positive integer", "use 8 x hidden size")
    out = GridScale(
        dims=dims,
        tier_edges_tokens=edges,
        attention_crossover_tokens=crossover,
        round_tokens=round_tokens,
        spatial_tokens=_int_tuple(where, "spatial_tokens", sc),
        spatial_names=tuple(str(n) for n in sc.get("spatial_names", [])),
        frames=_int_tuple(where, "frames", sc),
    )
    _validate_scale(where, out)
    return out


def _validate_scale(where: str, g: GridScale) -> None:
    edges = g.tier_edges_tokens
    if len(edges) < 2:
        _fail(f"{where}.tier_edges_tokens", list(edges), "needs at least 2 bounds", "e.g. [64, 256, 2048]")
    inner = edges if g.dims == "1d" else edges[:-1] if edges[-1] == 0 else edges
    if any(b <= a for a, b in zip(inner, inner[1:], strict=False)) or (g.dims == "1d" and edges[0] < 1):
        _fail(f"{where}.tier_edges_tokens", list(edges), "must be strictly increasing (1d: from >= 1)",
              "sort the bounds; 2d may end with 0 for no upper bound")
    if g.round_tokens < 1:
        _fail(f"{where}.round_tokens", g.round_tokens, "must be >= 1", "use 1 for no rounding")
    if g.dims == "2d":
        for key in ("spatial_tokens", "frames"):
            vals = getattr(g, key)
            if not vals or any(v < 1 for v in vals) or list(vals) != sorted(set(vals)):
                _fail(f"{where}.{key}", list(vals), "must be positive, distinct and increasing", "sort the list")
        if g.spatial_names and len(g.spatial_names) != len(g.spatial_tokens):
            _fail(f"{where}.spatial_names", list(g.spatial_names), "needs one name per spatial_tokens entry",
                  "list as many names as resolutions")
        counts = [0] * g.num_tiers
        for f, s in g.buckets():
            counts[g.tier_of_total(f * s)] += 1
        if 0 in counts:
            _fail(f"{where}.tier_edges_tokens", list(edges), f"leaves tier {counts.index(0)} without buckets",
                  "move the bounds so every tier holds at least one (frames, spatial) bucket")


def load_spec(path: Path) -> DistributionSpec:
    """Read a distribution file strictly (unknown keys fail, listing the valid ones)."""
    raw = _read_toml(path)
    valid = {"name", "description", "grid", "sampler", "compute_shares", "zipf_exponent", "zipf_order",
             "log_position_mean", "log_position_std", "body_mean_tokens", "body_log_std", "tail_share",
             "tail_min_tokens", "tail_alpha"}
    _check_keys(str(path), raw, valid)
    for key in ("name", "grid", "sampler"):
        if key not in raw:
            _fail(f"{path}: {key}", None, "is missing", f"add {key} = \"...\"")
    if raw["name"] != path.stem:
        _fail(f"{path}: name", raw["name"], f"differs from the file name ({path.stem})", "make them equal")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return DistributionSpec(**kw)
