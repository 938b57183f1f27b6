"""Seeded, deterministic samplers for the distribution specs (numpy PCG64 from one integer seed)."""

from __future__ import annotations

import math

import numpy as np

from dcp.data_dists.spec import DistributionSpec, GridScale

_LOG_GRID_POINTS = 512  # points of the log grid that estimates a 1d tier's mean cost


def _round_1d(g: GridScale, tokens: np.ndarray) -> np.ndarray:
    r = g.round_tokens
    out = np.rint(tokens / r).astype(np.int64) * r
    return np.clip(out, g.min_tokens, g.max_tokens)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, n: int) -> np.ndarray:
    return np.exp(rng.uniform(math.log(lo), math.log(hi), size=n))


def _tier_mean_cost_1d(g: GridScale, k: int) -> float:
    lo, hi = g.tier_edges_tokens[k], g.tier_edges_tokens[k + 1]
    s = np.exp(np.linspace(math.log(lo), math.log(hi), _LOG_GRID_POINTS))
    return float(np.mean(s * (1.0 + s / g.attention_crossover_tokens)))


def _tier_buckets_2d(g: GridScale) -> list[list[tuple[int, int]]]:
    tiers: list[list[tuple[int, int]]] = [[] for _ in range(g.num_tiers)]
    for f, s in g.buckets():
        tiers[g.tier_of_total(f * s)].append((f, s))
    return tiers


def tier_count_probs(spec: DistributionSpec, g: GridScale) -> np.ndarray:
    """Probability that a sample falls in each tier so that tier k carries compute_shares[k] of the compute.

    Dominance is defined by compute cost (paper Appendix A): P(tier k) ~ share_k / E[cost | tier k].
    """
    if g.dims == "1d":
        means = [_tier_mean_cost_1d(g, k) for k in range(g.num_tiers)]
    else:
        means = [float(np.mean([g.cost(f, s) for f, s in b])) for b in _tier_buckets_2d(g)]
    w = np.asarray(spec.compute_shares, dtype=float) / np.asarray(means)
    return w / w.sum()


def draw_shapes(spec: DistributionSpec, g: GridScale, num_samples: int, seed: int) -> list[tuple[int, int]]:
    """Draw ``num_samples`` samples as (frames, spatial_tokens); a 1d sample is (1, tokens)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    if spec.sampler == "tiers":
        probs = tier_count_probs(spec, g)
        tiers = rng.choice(len(probs), size=num_samples, p=probs)
        if g.dims == "1d":
            out = np.empty(num_samples, dtype=np.int64)
            for k in range(g.num_tiers):
                idx = np.flatnonzero(tiers == k)
                lo, hi = g.tier_edges_tokens[k], g.tier_edges_tokens[k + 1]
                out[idx] = _round_1d(g, _log_uniform(rng, lo, hi, idx.size))
            return [(1, int(t)) for t in out]
        buckets = _tier_buckets_2d(g)
        picks = [buckets[k][int(rng.integers(len(buckets[k])))] for k in tiers]
        return [(int(f), int(s)) for f, s in picks]
    if spec.sampler == "zipf":
        items = g.buckets() if g.dims == "2d" else [(1, int(t)) for t in _zipf_lengths_1d(g)]
        ranks = np.arange(1, len(items) + 1, dtype=float)
        w = ranks ** (-spec.zipf_exponent)
        if spec.zipf_order == "descending":
            w = w[::-1]
        idx = rng.choice(len(items), size=num_samples, p=w / w.sum())
        return [items[i] for i in idx]
    if spec.sampler == "text":
        return [(1, int(t)) for t in _text_lengths(spec, g, num_samples, rng)]
    # lognormal: log(length) normal between log(min) and log(max), clipped to the grid
    pos = np.clip(rng.normal(spec.log_position_mean, spec.log_position_std, size=num_samples), 0.0, 1.0)
    lo, hi = math.log(g.min_tokens), math.log(g.max_tokens)
    tokens = np.exp(lo + pos * (hi - lo))
    if g.dims == "1d":
        return [(1, int(t)) for t in _round_1d(g, tokens)]
    # 2d: nearest bucket by total tokens
    buckets = g.buckets()
    totals = np.asarray([f * s for f, s in buckets], dtype=float)
    nearest = np.abs(np.log(totals)[None, :] - np.log(tokens)[:, None]).argmin(axis=1)
    return [buckets[i] for i in nearest]


def _text_lengths(spec: DistributionSpec, g: GridScale, n: int, rng: np.random.Generator) -> np.ndarray:
    """Documents of a text corpus: lognormal body (mean body_mean_tokens) and a truncated Pareto tail from
    tail_min_tokens to the grid's max, both in paper-scale tokens shrunk by ``TEXT_PAPER_MAX_TOKENS`` / max."""
    if g.dims != "1d":
        raise ValueError(f"distribution {spec.name}: sampler 'text' needs a 1d grid, not {spec.grid!r} (2d)")
    shrink = g.max_tokens / TEXT_PAPER_MAX_TOKENS
    sigma = spec.body_log_std
    mu = math.log(spec.body_mean_tokens * shrink) - sigma * sigma / 2  # E[exp(N(mu, sigma))] = the mean
    out = np.exp(rng.normal(mu, sigma, size=n))
    tail = rng.random(n) < spec.tail_share
    lo, hi = min(spec.tail_min_tokens * shrink, g.max_tokens), float(g.max_tokens)
    # inverse CDF of a Pareto(alpha) truncated to [lo, hi]
    u = rng.random(int(tail.sum()))
    a = spec.tail_alpha
    out[tail] = lo / (1.0 - u * (1.0 - (lo / hi) ** a)) ** (1.0 / a)
    return _round_1d(g, out)


TEXT_PAPER_MAX_TOKENS = 131072
"""The text grid's paper-scale max: token parameters of a ``text`` spec are at this scale."""


def _zipf_lengths_1d(g: GridScale) -> list[int]:
    """1d zipf items: powers of two between the grid's min and max."""
    out, t = [], g.min_tokens
    while t <= g.max_tokens:
        out.append(t)
        t *= 2
    return out


def compute_shares_of(shapes: list[tuple[int, int]], g: GridScale) -> list[float]:
    """Realised share of the compute (cost proxy) per tier of a drawn sample; used to check dominance."""
    costs = [0.0] * g.num_tiers
    for f, s in shapes:
        total = f * s
        if g.dims == "1d":
            k = next((i for i in range(g.num_tiers) if total <= g.tier_edges_tokens[i + 1]), g.num_tiers - 1)
        else:
            k = g.tier_of_total(total)
        costs[k] += g.cost(f, s)
    whole = sum(costs) or 1.0
    return [c / whole for c in costs]
