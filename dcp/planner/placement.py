"""Placing SP groups on rank blocks: node-aware, aligned, largest group first.

Ranks 0..W-1 form nodes of ``ranks_per_node`` consecutive ranks (the last node may be partial, so any
W works). A group of p <= ranks_per_node ranks stays inside one node, at a node-local offset that is a
multiple of p: its all-to-alls then run over the fast intra-node links, and groups of power-of-two
sizes pack without gaps. A group of p > ranks_per_node necessarily spans nodes; it starts at a global
multiple of p on nodes nothing else uses.

Groups are placed largest first, first fit. With sizes that divide each other (1, 2, 4, 8) every node
then fills contiguously from its start, so a set of groups fits whenever each node's total fits; any
alignment gap or node tail left over is returned as a free segment for the assembler to fill.
"""

from __future__ import annotations

from collections.abc import Sequence


def node_bounds(world_size: int, ranks_per_node: int) -> list[tuple[int, int]]:
    """(first rank, end rank) of every node; the last node holds W mod ranks_per_node ranks if nonzero."""
    return [(s, min(s + ranks_per_node, world_size)) for s in range(0, world_size, ranks_per_node)]


def place_largest_first(
    sizes: Sequence[int], world_size: int, ranks_per_node: int
) -> tuple[list[int | None], list[tuple[int, int]]]:
    """First rank of each group (None if it cannot be placed), and the free segments left, by rank.

    ``sizes`` must be sorted in non-increasing order (the caller keeps its own stable order among equal
    sizes). Each free segment lies inside one node.
    """
    nodes = node_bounds(world_size, ranks_per_node)
    used = [0] * len(nodes)  # free space of node i is [start_i + used[i], end_i)
    gaps: list[tuple[int, int]] = []
    starts: list[int | None] = []
    i, n_items = 0, len(sizes)
    while i < n_items:
        p = sizes[i]
        j = i
        while j < n_items and sizes[j] == p:
            j += 1
        if j < n_items and sizes[j] > p:
            raise ValueError(
                f"sizes ({list(sizes)[:8]}...) must be non-increasing: sort groups largest first"
            )
        run = j - i  # groups of size p, placed together
        i = j
        if p > ranks_per_node:
            lo = 0  # a start that failed fails again (used only grows): each search resumes after the last group
            for _ in range(run):
                st = _place_cross(p, nodes, used, gaps, world_size, ranks_per_node, lo)
                starts.append(st)
                lo = world_size if st is None else st + p
            continue
        # First fit over nodes: fill each node with as many aligned blocks as fit, then move on (a node that
        # cannot take p now never can: used only grows).
        for n, (ns, ne) in enumerate(nodes):
            if not run:
                break
            local = -(-used[n] // p) * p
            fit = (ne - ns - local) // p
            if fit <= 0:
                continue
            take = min(fit, run)
            if local > used[n]:
                gaps.append((ns + used[n], ns + local))
            starts.extend(range(ns + local, ns + local + take * p, p))
            used[n] = local + take * p
            run -= take
        starts.extend([None] * run)
    free = gaps + [(ns + u, ne) for (ns, ne), u in zip(nodes, used, strict=True) if ns + u < ne]
    free.sort()
    return starts, free


def _place_cross(
    p: int,
    nodes: list[tuple[int, int]],
    used: list[int],
    gaps: list[tuple[int, int]],
    world_size: int,
    ranks_per_node: int,
    lo: int = 0,
) -> int | None:
    """The first aligned start from ``lo`` (a multiple of p) whose nodes are free from it on; None: none."""
    for start in range(lo, world_size - p + 1, p):
        end = start + p
        touched = range(start // ranks_per_node, (end - 1) // ranks_per_node + 1)
        if all(nodes[n][0] + used[n] <= max(start, nodes[n][0]) for n in touched):
            for n in touched:
                ns, ne = nodes[n]
                lo = max(start, ns)
                if ns + used[n] < lo:
                    gaps.append((ns + used[n], lo))
                used[n] = min(end, ne) - ns
            return start
    return None


def aligned_slots(p: int, world_size: int, ranks_per_node: int) -> list[int]:
    """First ranks of the disjoint aligned blocks of size p that tile as much of the world as possible."""
    starts, _ = place_largest_first([p] * (world_size // p), world_size, ranks_per_node)
    return [s for s in starts if s is not None]
