"""SPGroupRegistry in a world bound to a device (NCCL's eager mode), where torch makes every new group by
splitting the world's communicator: the registry must call ``split_group`` once per SP size on every rank,
with the same split everywhere, and not ``new_group`` once per block.

NCCL cannot run on this CPU machine and torch's split_group refuses the gloo and fake backends (no
``supports_splitting``), so torch.distributed is replaced here by a recording stand-in that keeps
split_group's documented contract (every rank of the parent enters with the same split; a rank gets the group
of its split, or None when it is in none) and checks the registry against it, one rank at a time for every
rank of the world."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

import dcp.runtime.registry as registry
from dcp.bench.census import Census
from dcp.runtime.registry import SPGroupRegistry, creation_mode, sp_blocks

SIZES = (1, 2, 4, 8, 16)


class _Group:
    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks


class _FakeWorld:
    """Records the group creations of one rank of a ``world_size``-rank world."""

    def __init__(self, rank: int, world_size: int, backend: str = "nccl", broken_split: bool = False) -> None:
        self.rank, self.world_size, self.backend, self.broken_split = rank, world_size, backend, broken_split
        self.splits: list[tuple[list[list[int]], dict]] = []
        self.new_groups: list[tuple[list[int], dict]] = []

    def split_group(self, parent_pg=None, split_ranks=None, **kwargs):
        assert parent_pg is None  # the default group: the world's communicator
        flat = [r for s in split_ranks for r in s]
        assert len(flat) == len(set(flat)) and all(0 <= r < self.world_size for r in flat)  # torch's checks
        self.splits.append((split_ranks, kwargs))
        mine = [s for s in split_ranks if self.rank in s]
        return _Group(sorted(mine[0])) if mine and not self.broken_split else None

    def new_group(self, ranks, **kwargs):
        self.new_groups.append((ranks, kwargs))
        if self.rank not in ranks:
            return dist.GroupMember.NON_GROUP_MEMBER
        return _Group(ranks)

    def install(self, monkeypatch: pytest.MonkeyPatch, device_bound: bool = True, has_split: bool = True) -> None:
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: self.world_size)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: self.rank)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: self.backend)
        monkeypatch.setattr(dist, "new_group", self.new_group)
        if has_split:
            monkeypatch.setattr(dist, "split_group", self.split_group)
        else:
            monkeypatch.delattr(dist, "split_group")
        monkeypatch.setattr(registry, "splits_world_communicator", lambda: device_bound)


def test_creation_mode_follows_binding_layout_and_torch():
    safe, unsafe = sp_blocks(16, 8, SIZES), sp_blocks(8, 4, [1, 3, 4])
    assert creation_mode(safe, device_bound=True, can_split=True) == "split"
    assert creation_mode(unsafe, device_bound=True, can_split=True) == "split"  # split names groups by ranks
    assert creation_mode(safe, device_bound=True, can_split=False) == "world"
    assert creation_mode(safe, device_bound=False, can_split=True) == "members"
    assert creation_mode(unsafe, device_bound=False, can_split=True) == "world"


def test_bound_world_splits_once_per_size_with_the_same_split_on_every_rank(monkeypatch):
    # 20 ranks, 8 per node: the last node holds 4 ranks, so ranks 16..19 are in no block of size 8 or 16
    w, blocks = 20, sp_blocks(20, 8, SIZES)
    seen = []
    for rank in range(w):
        world = _FakeWorld(rank, w)
        world.install(monkeypatch)
        reg = SPGroupRegistry(w, 8, SIZES, timeout_s=60)
        assert reg.creation == "split" and not reg.local
        assert world.new_groups == []  # not one new_group per block (each a world-wide ncclCommSplit)
        assert len(world.splits) == len(SIZES)
        seen.append(world.splits)
        for (split, kwargs), p in zip(world.splits, SIZES, strict=True):
            assert split == [list(range(f, f + p)) for f, q in blocks if q == p]  # every block of the size
            assert kwargs == {"timeout": timedelta(seconds=60), "group_desc": f"dcp_sp{p}"}
        for first, p in blocks:
            group = reg.get(first, p)
            if first <= rank < first + p:
                assert group.ranks == list(range(first, first + p))
            else:
                assert group is dist.GroupMember.NON_GROUP_MEMBER
        held = {p for first, p in blocks if first <= rank < first + p}
        assert held == (set(SIZES) if rank < 16 else {1, 2, 4})
    assert all(s == seen[0] for s in seen)  # split_group is collective: every rank enters with the same split


def test_bound_world_of_4096_ranks_costs_one_split_per_size_and_the_census_counts_them(monkeypatch):
    w, rank = 4096, 2049
    world = _FakeWorld(rank, w)
    world.install(monkeypatch)
    with Census(dist) as census:
        reg = SPGroupRegistry(w, 8, SIZES)
    # before: every rank called new_group for all 7,936 blocks, each one a split of the world's communicator
    assert len(sp_blocks(w, 8, SIZES)) == 7936
    assert census.new_groups == len(SIZES) == census.member_groups == len(world.splits)
    assert reg.get(2048, 16).ranks == list(range(2048, 2064)) and reg.get(2049, 1).ranks == [2049]


def test_bound_world_without_split_group_creates_every_block_on_every_rank(monkeypatch):
    world = _FakeWorld(9, 64)
    world.install(monkeypatch, has_split=False)  # a torch without split_group
    reg = SPGroupRegistry(64, 8, SIZES)
    assert reg.creation == "world"
    assert [r for r, _ in world.new_groups] == [list(range(f, f + p)) for f, p in sp_blocks(64, 8, SIZES)]
    assert all(kw["use_local_synchronization"] is False for _, kw in world.new_groups)
    assert reg.get(8, 8).ranks == list(range(8, 16))


def test_bound_world_with_another_backend_than_the_worlds_creates_every_block(monkeypatch):
    world = _FakeWorld(3, 16)
    world.install(monkeypatch)
    reg = SPGroupRegistry(16, 8, SIZES, backend="gloo")  # split_group keeps the world's backend: cannot serve
    assert reg.creation == "world" and world.splits == []
    assert len(world.new_groups) == len(sp_blocks(16, 8, SIZES))
    assert all(kw["backend"] == "gloo" for _, kw in world.new_groups)
    world = _FakeWorld(3, 16)
    world.install(monkeypatch)
    assert SPGroupRegistry(16, 8, SIZES, backend="NCCL").creation == "split"  # the world's own backend


def test_unbound_world_keeps_member_only_groups(monkeypatch):
    world = _FakeWorld(5, 64, backend="gloo")
    world.install(monkeypatch, device_bound=False)
    reg = SPGroupRegistry(64, 8, SIZES)
    assert reg.creation == "members" and reg.local and world.splits == []
    assert [r for r, _ in world.new_groups] == [[5], [4, 5], [4, 5, 6, 7], list(range(8)), list(range(16))]
    assert all(kw["use_local_synchronization"] is True for _, kw in world.new_groups)


def test_split_that_leaves_a_member_without_its_group_is_one_clear_error(monkeypatch):
    world = _FakeWorld(2, 16, broken_split=True)
    world.install(monkeypatch)
    with pytest.raises(RuntimeError, match=r"split_group returned no group to rank 2 .*first_rank=2, sp_size=1"):
        SPGroupRegistry(16, 8, SIZES)
