"""Profile-table cache: hit, miss, stale, corrupt, refresh, atomic store."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.planner.table import ProfileRow, ProfileTable, TableMeta
from dcp.profiler import cache
from dcp.profiler.cache import CacheKey, CorruptCacheError, StaleCacheError

KEY = CacheKey(model="t1d-tiny", model_hash="0123456789abcdef", world_size=2, hardware="cpu-x86_64-2cores",
               dtype="float32", precision="fp32", version="0.1.0", seq_group_edges=(128, 256), sp_sizes=(1, 2),
               max_micro_batch_size=4, mem_capacity_gib=1.0)


def table() -> ProfileTable:
    rows = [ProfileRow(seq_group=g, seq_len=e, micro_batch_size=1, sp_size=1, t_f_s=0.01 * e, t_b_s=0.02 * e,
                       m_act_bytes=1000.0 * e, m_inp_bytes=10.0 * e, t_const_s=0.001, m_const_bytes=1e6,
                       num_layers=4) for g, e in enumerate((128, 256))]
    return ProfileTable(rows, TableMeta(model="t1d-tiny", hardware="cpu", dtype="float32", world_size=2,
                                        seq_group_edges=(128, 256), source="profiled"))


def test_miss_then_hit(tmp_path):
    assert cache.lookup(tmp_path, KEY).status == "miss"
    assert cache.need_profile(tmp_path, KEY)
    assert cache.load_or_refuse(tmp_path, KEY) is None
    path = cache.store(table(), tmp_path, KEY)
    assert path == cache.cache_path(tmp_path, KEY) and path.name == "t1d-tiny-01234567-w2.csv"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    assert path.stat().st_mode & 0o777 == 0o644
    found = cache.lookup(tmp_path, KEY)
    assert found.hit and found.table.rows == table().rows
    assert not cache.need_profile(tmp_path, KEY)
    assert cache.load_or_refuse(tmp_path, KEY).rows == table().rows


def test_only_rank_zero_writes(tmp_path):
    cache.store(table(), tmp_path, KEY, rank=1)
    assert not any(tmp_path.iterdir())


def test_model_config_change_is_a_miss_other_key_changes_are_stale(tmp_path):
    cache.store(table(), tmp_path, KEY)
    assert cache.lookup(tmp_path, dataclasses.replace(KEY, model_hash="ffff0000ffff0000")).status == "miss"
    newer = dataclasses.replace(KEY, version="0.2.0", hardware="NVIDIA H200")
    found = cache.lookup(tmp_path, newer)
    assert found.status == "stale"
    assert "version: cached '0.1.0' vs now '0.2.0'" in found.message and "hardware" in found.message
    with pytest.raises(StaleCacheError, match=r"dcp profile --refresh"):
        cache.need_profile(tmp_path, newer)
    with pytest.raises(StaleCacheError, match="delete"):
        cache.load_or_refuse(tmp_path, newer)
    assert cache.need_profile(tmp_path, newer, refresh=True)
    assert cache.load_or_refuse(tmp_path, newer, refresh=True) is None
    assert cache.load_or_refuse(tmp_path, KEY, refresh=True) is None  # refresh re-profiles even a hit


@pytest.mark.parametrize(
    "mutate",
    [
        lambda text: "not a table at all\x00",
        lambda text: text.replace("# format_version: 1", "# format_version: 99"),
        lambda text: "\n".join(line for line in text.splitlines() if "cache_key" not in line),
        lambda text: text.replace("seq_group,seq_len", "seq_grp,seq_len"),
        lambda text: text.replace('"world_size": 2}', '"world_size": 2, "colour": 1}', 1),
    ],
    ids=["garbage", "format-version", "no-key", "bad-columns", "bad-key-fields"],
)
def test_corrupt_cache_is_refused_and_never_overwritten_silently(tmp_path, mutate):
    path = cache.store(table(), tmp_path, KEY)
    bad = mutate(path.read_text())
    path.write_text(bad)
    found = cache.lookup(tmp_path, KEY)
    assert found.status == "corrupt" and str(path) in found.message
    with pytest.raises(CorruptCacheError, match=r"delete .* or run `dcp profile --refresh`"):
        cache.need_profile(tmp_path, KEY)
    with pytest.raises(CorruptCacheError):
        cache.load_or_refuse(tmp_path, KEY)
    assert path.read_text() == bad  # refusing does not touch the file
    assert cache.load_or_refuse(tmp_path, KEY, refresh=True) is None
    cache.store(table(), tmp_path, KEY)
    assert (tmp_path / (path.name + ".corrupt")).read_text() == bad  # moved aside, not lost
    assert cache.lookup(tmp_path, KEY).hit


def test_key_digest_and_diff():
    other = dataclasses.replace(KEY, world_size=4)
    assert KEY.digest() != other.digest() and KEY.digest() == dataclasses.replace(KEY).digest()
    assert KEY.diff(other) == {"world_size": (2, 4)}
    assert CacheKey.from_dict(KEY.to_dict()) == KEY
