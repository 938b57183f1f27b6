"""Length curriculum: a distributed sample sort of (length, id), then interleaved reassignment.

Each rank starts with some of the dataset's (length, sample id) pairs (whatever it loaded). Sorting
locally and training in that order would give every rank a different curriculum and unbalanced work,
and the order would change with the number of ranks. Instead:

1. ``distributed_sort`` (sample sort): every rank sorts its keys, draws evenly spaced samples, all ranks
   all-gather the samples and pick the same ``W - 1`` splitters, every key is sent (all-to-all) to the
   rank owning its splitter interval, and the received keys are sorted again. Rank ``r`` then holds the
   ``r``-th contiguous slice of the one global order sorted by (length, id). Because ids break ties, that
   order is a total order of the dataset: it is identical for every world size.
2. ``interleave``: global position ``p`` is reassigned to rank ``p % W`` (a second all-to-all). Rank ``q``
   trains ``global[q], global[q + W], ...``; at step ``k`` the ranks together train positions
   ``kW .. kW + W - 1``, so all ranks see lengths that differ by at most one neighbour in the sort.

Keys travel as one int64 each: ``length << 32 | id`` (ids below 2**32, lengths below 2**31), whose
integer order is the lexicographic (length, id) order. Works on gloo (CPU) and NCCL (pass CUDA tensors'
device via ``device``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dcp.loaders._common import LoaderError, fail_arg

_ID_BITS = 32


@dataclass(frozen=True, slots=True)
class SortedSlice:
    """This rank's contiguous piece of the globally sorted (length, id) order."""

    lengths: tuple[int, ...]
    """Lengths of the slice, ascending."""
    sample_ids: tuple[int, ...]
    """Sample ids, same order (ties in length ordered by id)."""
    offset: int
    """Global position of the slice's first element."""
    total: int
    """Samples over all ranks."""


def _encode(lengths: Sequence[int], sample_ids: Sequence[int]) -> torch.Tensor:
    if len(lengths) != len(sample_ids):
        fail_arg("len(lengths)", len(lengths), f"differs from len(sample_ids) ({len(sample_ids)})",
                 "pass one length per sample id")
    lens = torch.as_tensor(list(lengths), dtype=torch.int64)
    ids = torch.as_tensor(list(sample_ids), dtype=torch.int64)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= 2**_ID_BITS):
        fail_arg("sample_ids", int(ids.min()) if int(ids.min()) < 0 else int(ids.max()),
                 f"must be in [0, 2**{_ID_BITS})", "renumber samples with non-negative ids below 2**32")
    if len(lens) and (int(lens.min()) < 0 or int(lens.max()) >= 2**31):
        fail_arg("lengths", int(lens.min()) if int(lens.min()) < 0 else int(lens.max()),
                 "must be in [0, 2**31)", "pass token counts as non-negative ints below 2**31")
    return (lens << _ID_BITS) | ids


def _decode(keys: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple((keys >> _ID_BITS).tolist()), tuple((keys & (2**_ID_BITS - 1)).tolist())


def _exchange(keys: torch.Tensor, dest: torch.Tensor, world_size: int, group: dist.ProcessGroup | None,
              device: torch.device) -> torch.Tensor:
    """Send ``keys[i]`` to rank ``dest[i]`` (all-to-all-v); return what this rank received, unsorted."""
    order = torch.argsort(dest, stable=True)
    keys, dest = keys[order], dest[order]
    send_counts = torch.bincount(dest, minlength=world_size).to(torch.int64)
    recv_counts = torch.empty(world_size, dtype=torch.int64, device=device)
    # first exchange the counts so every rank can size its receive buffer ...
    dist.all_to_all_single(recv_counts, send_counts.to(device), group=group)
    recv = torch.empty(int(recv_counts.sum()), dtype=torch.int64, device=device)
    # ... then the keys themselves, with uneven splits
    dist.all_to_all_single(recv, keys.to(device), recv_counts.tolist(), send_counts.tolist(), group=group)
    return recv.cpu()


def distributed_sort(
    lengths: Sequence[int],
    sample_ids: Sequence[int],
    *,
    group: dist.ProcessGroup | None = None,
    samples_per_rank: int = 64,
    device: torch.device | str = "cpu",
) -> SortedSlice:
    """Sample-sort the (length, id) pairs held by all ranks of ``group``; return this rank's sorted slice.

    Collective: every rank of ``group`` must call it (a rank may hold no pairs). Ids must be unique over
    all ranks; a duplicate is reported.
    """
    if samples_per_rank < 1:
        fail_arg("samples_per_rank", samples_per_rank, "must be >= 1", "use e.g. 64 (more: better-balanced slices)")
    device = torch.device(device)
    world_size = dist.get_world_size(group)
    error: LoaderError | None = None
    try:
        keys = torch.sort(_encode(lengths, sample_ids)).values
    except LoaderError as exc:  # raised below, after telling the other ranks, so that none of them hangs
        error, keys = exc, torch.empty(0, dtype=torch.int64)

    # Splitters from a global sample: each rank contributes up to samples_per_rank evenly spaced keys,
    # padded with -1 to a fixed size (all_gather needs equal shapes); every rank then derives the same
    # splitters from the same gathered set, so no further agreement is needed. Slot 0 carries an
    # "input rejected" flag so that a bad input fails on every rank at the same point.
    local = torch.full((samples_per_rank + 1,), -1, dtype=torch.int64)
    local[0] = int(error is not None)
    if len(keys):
        pick = torch.linspace(0, len(keys) - 1, min(samples_per_rank, len(keys))).round().long()
        local[1 : 1 + len(pick)] = keys[pick]
    gathered = [torch.empty(samples_per_rank + 1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(gathered, local.to(device), group=group)
    if error is not None:
        raise error
    rejected = [r for r, g in enumerate(gathered) if int(g[0])]
    if rejected:
        fail_arg("rank", rejected[0], "rejected its (length, id) input", "fix the input reported by that rank")
    pool = torch.sort(torch.cat([g[1:] for g in gathered]).cpu()).values
    pool = pool[pool >= 0]
    if len(pool):
        at = torch.linspace(0, len(pool) - 1, world_size + 1).round().long()[1:-1]
        splitters = pool[at]
    else:
        splitters = torch.empty(0, dtype=torch.int64)
    # key k goes to the rank r with splitters[r-1] <= k < splitters[r]
    dest = torch.bucketize(keys, splitters, right=True) if len(splitters) else torch.zeros_like(keys)
    mine = torch.sort(_exchange(keys, dest, world_size, group, device)).values

    # Equal keys land on the same rank, so a duplicate id is always seen locally. Its finder must not
    # raise alone (the others would hang in the next collective): the flag travels with the counts.
    dup = (mine[1:] == mine[:-1]).nonzero()
    dup_id = int(_decode(mine[dup[0]])[1][0]) if len(dup) else -1
    counts = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(counts, torch.tensor([len(mine), dup_id], dtype=torch.int64, device=device), group=group)
    dups = [int(c[1]) for c in counts if int(c[1]) >= 0]
    if dups:
        fail_arg("sample_ids", dups[0], "occurs more than once over the ranks", "give every sample a unique id")
    counts_list = [int(c[0]) for c in counts]
    rank = dist.get_rank(group)
    lens, ids = _decode(mine)
    return SortedSlice(lens, ids, offset=sum(counts_list[:rank]), total=sum(counts_list))


def interleave(
    sorted_slice: SortedSlice, *, group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu"
) -> SortedSlice:
    """Reassign global sorted position ``p`` to rank ``p % W``; return this rank's share in curriculum order.

    The result's ``offset`` is this rank's index q and its i-th element is global position ``q + i * W``.
    Shares differ by at most one sample and, position by position, by one neighbour in length.
    """
    device = torch.device(device)
    world_size = dist.get_world_size(group)
    keys = _encode(sorted_slice.lengths, sorted_slice.sample_ids)
    positions = torch.arange(sorted_slice.offset, sorted_slice.offset + len(keys), dtype=torch.int64)
    # (key, position) would be two payloads; instead each receiver re-sorts by key, which restores the
    # global order among its share because keys are already globally sorted.
    recv = torch.sort(_exchange(keys, positions % world_size, world_size, group, device)).values
    lens, ids = _decode(recv)
    return SortedSlice(lens, ids, offset=dist.get_rank(group), total=sorted_slice.total)


def gather_order(sorted_slice: SortedSlice, *, group: dist.ProcessGroup | None = None) -> list[int]:
    """The whole global order of sample ids on every rank (for datasets whose id list fits in memory)."""
    world_size = dist.get_world_size(group)
    out: list[object] = [None] * world_size
    dist.all_gather_object(out, (sorted_slice.offset, sorted_slice.sample_ids), group=group)
    return [i for _, ids in sorted(out) for i in ids]  # type: ignore[misc]


def curriculum_order(lengths: Sequence[int]) -> list[int]:
    """Single-process reference: sample ids sorted by (length, id); equals the distributed result."""
    return sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
