"""Defaults that fit the data and the model, for the settings a user left at the library's defaults.

The library-wide defaults (profile edges 512 .. 4096 tokens, micro-batches up to 8, SP sizes 1, 2, 4, 8)
suit a GPU and long data; on a 64-sample set of at most 1024 tokens and a 4-head model they profile
lengths no sample has and SP sizes the heads cannot be split into. :func:`fit_config` replaces each of
those three settings by one derived from the dataset's lengths, the model's heads and the world size,
only where the given config still holds the library default (a value the user set is kept). The first two
(:func:`fit_profiling`) are fitted for every model ``dcp.set_manager`` is given, the SP sizes for HF models:

- ``profiling.seq_group_edges`` (:func:`edges_for`): powers of two ending at the longest sample's group
  (the smallest power of two >= the longest sample, never past it), at most :data:`MAX_GROUPS` of them,
  none below the shortest sample's group;
- ``planning.sp_sizes`` (:func:`sp_sizes_for`): every p that divides the heads and the world size and
  either divides the K/V heads or is a multiple of them (each rank then holds whole K/V heads; GQA
  repeats them, never splits one);
- ``profiling.max_micro_batch_size`` (:func:`micro_batch_cap`): a micro-batch of the shortest group's
  samples carries at most as many tokens as one sample of the longest group (or :data:`MIN_MB_TOKENS`),
  and at most :data:`MAX_MICRO_BATCH` samples, so that first-run profiling stays short.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dcp.config import DCPConfig, ModelShapeConfig, PlanningConfig, ProfilingConfig

MAX_GROUPS = 4
"""Most seq_groups the derived edges have (profiling time grows with each group)."""
MAX_MICRO_BATCH = 8
"""Largest derived micro-batch cap (the library default)."""
MIN_EDGE = 16
"""Smallest derived edge in tokens."""
MIN_MB_TOKENS = 1024
"""Tokens a micro-batch of short samples may always reach (below it, batching short samples is cheap)."""


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def edges_for(lengths: Sequence[int], *, max_groups: int = MAX_GROUPS) -> tuple[int, ...]:
    """Power-of-two seq_group edges from the shortest sample's group to the longest's (see the module)."""
    if not lengths:
        raise ValueError("lengths is empty: the dataset has no samples to derive seq_group_edges from")
    top = _pow2_at_least(max(max(lengths), MIN_EDGE))
    low = _pow2_at_least(max(min(lengths), MIN_EDGE))
    edges = [top]
    while len(edges) < max_groups and edges[0] // 2 >= low:
        edges.insert(0, edges[0] // 2)
    return tuple(edges)


def sp_sizes_for(num_heads: int, num_kv_heads: int, world_size: int) -> tuple[int, ...]:
    """SP sizes dividing the heads and the world size that hold whole K/V heads (see the module)."""
    return tuple(p for p in range(1, max(1, world_size) + 1)
                 if num_heads % p == 0 and world_size % p == 0 and (num_kv_heads % p == 0 or p % num_kv_heads == 0))


def micro_batch_cap(edges: Sequence[int]) -> int:
    """Micro-batch cap: a micro-batch of the shortest group holds at most max(longest edge, MIN_MB_TOKENS)
    tokens, within [1, MAX_MICRO_BATCH]."""
    return max(1, min(MAX_MICRO_BATCH, max(edges[-1], MIN_MB_TOKENS) // edges[0]))


def fit_profiling(prof: ProfilingConfig, lengths: Sequence[int]) -> ProfilingConfig:
    """``prof`` with ``seq_group_edges`` (:func:`edges_for`) and ``max_micro_batch_size``
    (:func:`micro_batch_cap`) derived from ``lengths`` where each is still the library default; ``prof``
    itself when ``lengths`` is empty. ``dcp.set_manager`` applies it for every model (the HF path through
    :func:`fit_config`), so a first run profiles the lengths its data has."""
    default = ProfilingConfig()
    changes: dict[str, object] = {}
    if lengths and prof.seq_group_edges == default.seq_group_edges:
        changes["seq_group_edges"] = edges_for(lengths)
    if lengths and prof.max_micro_batch_size == default.max_micro_batch_size:
        changes["max_micro_batch_size"] = micro_batch_cap(changes.get("seq_group_edges", prof.seq_group_edges))
    return dataclasses.replace(prof, **changes) if changes else prof


def fit_config(config: DCPConfig, *, lengths: Sequence[int], num_heads: int, num_kv_heads: int, world_size: int,
               model: ModelShapeConfig | None = None) -> DCPConfig:
    """``config`` with each of the three settings above derived where it is still the library default (edges
    and micro-batch cap only when ``lengths`` is not empty: :func:`fit_profiling`), and ``model`` as its
    ``[model]`` section when given (in the same replace: a 4-head model's config never passes through SP size 8)."""
    plan = config.planning
    sizes = plan.sp_sizes
    if sizes == PlanningConfig().sp_sizes:
        sizes = sp_sizes_for(num_heads, num_kv_heads, world_size)
    sections = {"model": model} if model is not None else {}
    return dataclasses.replace(config, profiling=fit_profiling(config.profiling, lengths),
                               planning=dataclasses.replace(plan, sp_sizes=sizes), **sections)
