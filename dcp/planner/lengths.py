"""Seeded synthetic length streams for the planner CLI and benchmark (length files: dcp.data_dists)."""

from __future__ import annotations

import numpy as np


def synthetic_lengths(n: int, max_len: int, seed: int = 0, *, min_len: int = 16) -> np.ndarray:
    """n seeded lengths in [min_len, max_len], log-uniform (many short, few long: a mixed long-context set)."""
    if n < 1 or max_len < 1:
        raise ValueError(f"n ({n}) and max_len ({max_len}) must be >= 1: ask for at least one sample")
    lo = min(min_len, max_len)
    rng = np.random.default_rng([int(seed), 7919])
    x = np.exp(rng.uniform(np.log(lo), np.log(max_len), size=n))
    return np.clip(np.round(x), lo, max_len).astype(np.int64)
