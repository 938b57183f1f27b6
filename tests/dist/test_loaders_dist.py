"""Multi-process tests of the loaders: distributed sample sort, interleaving, token balance across ranks.

One spawn per world size; each spawn runs several checks (a spawned process costs seconds of torch import).
"""

from __future__ import annotations

import numpy as np
import pytest

from dcp.distributed.launch import run_distributed

NUM_SAMPLES = 3000


def _lengths() -> list[int]:
    rng = np.random.default_rng(7)
    # lognormal with many ties (lengths repeat), so the id tie-break matters
    return np.clip(rng.lognormal(5.5, 1.0, NUM_SAMPLES), 1, 4096).astype(int).tolist()


def _held_ids(rank: int, world_size: int) -> list[int]:
    """What each rank 'loaded': a skewed random split (rank 0 gets most), not an interleaved one."""
    rng = np.random.default_rng(11)
    owner = rng.choice(world_size, size=NUM_SAMPLES, p=np.arange(world_size, 0, -1) / sum(range(1, world_size + 1)))
    return [i for i in range(NUM_SAMPLES) if owner[i] == rank]


def _worker(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from dcp.loaders import LoadBalancedBatcher, LoadBalancedConfig, LoaderError
    from dcp.loaders.curriculum import distributed_sort, gather_order, interleave

    lengths = _lengths()
    ids = _held_ids(rank, world_size)
    out: dict = {}

    sl = distributed_sort([lengths[i] for i in ids], ids, samples_per_rank=16)
    keys = list(zip(sl.lengths, sl.sample_ids, strict=True))
    out["slice_sorted"] = keys == sorted(keys)
    out["slice_lengths_match"] = all(lengths[i] == n for n, i in keys)
    out["offset"], out["total"], out["slice_len"] = sl.offset, sl.total, len(keys)
    out["order"] = gather_order(sl)

    # curriculum -> variable batch size: every rank plans the same steps from the gathered order, so the
    # realised global batch sizes (the LR scaling input) agree without further communication
    from dcp.loaders import VariableBatchConfig, plan_variable_batches

    steps = plan_variable_batches(out["order"], lengths, VariableBatchConfig(max_tokens_per_batch=8192), world_size)
    out["batch_sizes"] = [s.batch_size for s in steps]
    out["my_samples"] = sorted(i for s in steps for b in s.for_rank(rank) for i in b.sample_ids)

    share = interleave(sl)
    out["share"] = list(share.sample_ids)
    out["share_rank"] = share.offset

    # an empty rank (holds nothing) must still take part and receive its share
    empty = distributed_sort([], [], samples_per_rank=4) if rank == world_size - 1 else None
    if empty is None:
        empty = distributed_sort([lengths[i] for i in ids], ids, samples_per_rank=4)
    out["with_empty_total"] = empty.total

    # error paths that must fail on every rank at once, not hang the others in a collective
    dup = ids + ([ids[0]] if rank == 0 else [])
    try:
        distributed_sort([lengths[i] for i in dup], dup)
        out["dup_error"] = ""
    except LoaderError as exc:
        out["dup_error"] = str(exc)
    bad = ids if rank else ids[:-1]  # rank 0 passes one length fewer than ids
    try:
        distributed_sort([lengths[i] for i in bad], ids)
        out["mismatch_error"] = ""
    except LoaderError as exc:
        out["mismatch_error"] = str(exc)
    try:
        distributed_sort([1], [ids[0] if ids else 0], samples_per_rank=0)
        out["samples_error"] = ""
    except LoaderError as exc:
        out["samples_error"] = str(exc)
    dist.barrier()

    # load-balanced batching: tokens each rank trains per step, gathered from every rank
    cfg = LoadBalancedConfig(load_balanced_pool_size=64, load_balanced_max_tokens_for_batch=4096,
                             max_num_steps=40, dataloader_seed=3)
    mine = [sum(b.tokens for b in step) for step in LoadBalancedBatcher(lengths, cfg, rank=rank, world_size=world_size)]
    per_rank: list = [None] * world_size
    dist.all_gather_object(per_rank, mine)
    out["tokens_per_rank"] = per_rank
    return out


def _check_world(world_size: int, results: list[dict]) -> list[int]:
    lengths = _lengths()
    reference = sorted(range(NUM_SAMPLES), key=lambda i: (lengths[i], i))
    offset = 0
    for rank, r in enumerate(results):
        assert r["slice_sorted"] and r["slice_lengths_match"], f"rank {rank} slice not sorted"
        assert r["offset"] == offset, "slices must be contiguous in rank order"
        offset += r["slice_len"]
        assert r["total"] == NUM_SAMPLES
        assert r["order"] == reference, "gathered order differs from the (length, id) sort"
        # interleaved share: rank q trains global positions q, q + W, ...
        assert r["share_rank"] == rank
        assert r["share"] == reference[rank::world_size]
        assert r["with_empty_total"] == NUM_SAMPLES - len(_held_ids(world_size - 1, world_size))
        assert "occurs more than once" in r["dup_error"] and str(_held_ids(0, world_size)[0]) in r["dup_error"]
        assert r["mismatch_error"], f"rank {rank} did not fail with the others"
        assert r["samples_error"].startswith("samples_per_rank (0) must be >= 1")
    assert offset == NUM_SAMPLES
    assert all(r["batch_sizes"] == results[0]["batch_sizes"] for r in results)
    assert sum(results[0]["batch_sizes"]) == NUM_SAMPLES
    assert sorted(i for r in results for i in r["my_samples"]) == list(range(NUM_SAMPLES))
    shares = [len(r["share"]) for r in results]
    assert max(shares) - min(shares) <= 1
    if world_size > 1:
        assert "len(lengths)" in results[0]["mismatch_error"]
        assert "rejected its (length, id) input" in results[1]["mismatch_error"]
        tokens = np.array(results[0]["tokens_per_rank"], dtype=float)  # [rank][step]
        assert tokens.shape == (world_size, 40)
        ratio = tokens.max(axis=0) / tokens.mean(axis=0)
        # every rank fills every step to the same budget: max/mean tokens stays close to 1
        assert ratio.mean() < 1.15, ratio.mean()
    return results[0]["order"]


@pytest.mark.dist
def test_sample_sort_and_interleave_same_for_every_world_size():
    orders = [_check_world(w, run_distributed(_worker, w, timeout_s=120)) for w in (1, 2, 4)]
    assert orders[0] == orders[1] == orders[2]

