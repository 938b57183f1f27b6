"""Profile-table cache: hit, miss, stale, corrupt, refresh, atomic store."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.planner.table import ProfileRow, ProfileTable, TableMeta
from dcp.profiler import cache
from dcp.profiler.cache import CacheKey, CorruptCacheError, StaleCacheError

KEY = CacheKey(model="t1d-tiny", model_hash="0123456789abcdef", world_size=2, hardware="cpu-x86_64-2cores",
               dtype="float32", precision="fp32", version="0.1.0", seq_group_edges=(128, 256), sp_sizes=(1, 2),
               max_micro_batch_size=4, mem_capacity_gib=1.0, clock="wall")


def table() -> ProfileTable:
    rows = [ProfileRow(seq_group=g, seq_len=e, micro_batch_size=1, sp_size=1, t_f_s=0.01 * e, t_b_s=0.02 * e,
                       m_act_bytes=1000.0 * e, m_inp_bytes=10.0 * e, t_const_s=0.001, m_const_bytes=1e6,
                       num_layers=4) for g, e in enumerate((128, 256))]
    return ProfileTable(rows, TableMeta(model="t1d-tiny", hardware="cpu-x86_64-2cores", dtype="float32",
                                        world_size=2, seq_group_edges=(128, 256), version="0.1.0",
                                        source="profiled", extra={"model_hash": KEY.model_hash,
                                                                  "mem_capacity_gib": 1.0, "sp_sizes": [1, 2]}))


def test_miss_then_hit(tmp_path):
    assert cache.lookup(tmp_path, KEY).status == "miss"
    assert cache.need_profile(tmp_path, KEY)
    assert cache.load_or_refuse(tmp_path, KEY) is None
    path = cache.store(table(), tmp_path, KEY)
    assert path == cache.cache_path(tmp_path, KEY) and path.name == f"t1d-tiny-01234567-w2-{KEY.digest()[:12]}.csv"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    assert path.stat().st_mode & 0o777 == 0o644
    found = cache.lookup(tmp_path, KEY)
    assert found.hit and found.table.rows == table().rows
    assert not cache.need_profile(tmp_path, KEY)
    assert cache.load_or_refuse(tmp_path, KEY).rows == table().rows


def test_only_rank_zero_writes(tmp_path):
    cache.store(table(), tmp_path, KEY, rank=1)
    assert not any(tmp_path.iterdir())


def test_every_full_key_has_its_own_file_so_tables_coexist(tmp_path):
    cache.store(table(), tmp_path, KEY)
    assert cache.lookup(tmp_path, dataclasses.replace(KEY, model_hash="ffff0000ffff0000")).status == "miss"
    # a table timed with the CPU clock (blind to communication waits) never stands in for a wall-clock one
    assert cache.lookup(tmp_path, dataclasses.replace(KEY, clock="cpu")).status == "miss"
    newer = dataclasses.replace(KEY, version="0.2.0")
    assert cache.lookup(tmp_path, newer).status == "miss"  # a new dcp version profiles beside the old table
    newer_table = ProfileTable(table().rows, dataclasses.replace(table().meta, version="0.2.0"))
    cache.store(newer_table, tmp_path, newer)
    assert len(list(tmp_path.glob("*.csv"))) == 2
    assert cache.lookup(tmp_path, KEY).hit and cache.lookup(tmp_path, newer).hit


def test_a_table_copied_to_another_keys_path_is_stale(tmp_path):
    path = cache.store(table(), tmp_path, KEY)
    other = dataclasses.replace(KEY, version="0.2.0")
    path.replace(cache.cache_path(tmp_path, other))
    found = cache.lookup(tmp_path, other)
    assert found.status == "stale" and "version: cached '0.1.0' vs now '0.2.0'" in found.message
    with pytest.raises(StaleCacheError, match=r"dcp profile --refresh"):
        cache.need_profile(tmp_path, other)
    with pytest.raises(StaleCacheError, match="delete"):
        cache.load_or_refuse(tmp_path, other)
    assert cache.need_profile(tmp_path, other, refresh=True)
    assert cache.load_or_refuse(tmp_path, other, refresh=True) is None
    cache.store(table(), tmp_path, KEY)
    assert cache.load_or_refuse(tmp_path, KEY, refresh=True) is None  # refresh re-profiles even a hit


def _last_row_cells(text: str, edit) -> str:
    lines = text.splitlines()
    cells = lines[-1].split(",")
    edit(cells)
    lines[-1] = ",".join(cells)
    return "\n".join(lines) + "\n"


def _set(i, value):
    def edit(cells):
        cells[i] = value
    return edit


# Each edit leaves a file that parses as CSV; the cache must still refuse it.
EDITS = {
    "drop-last-row": lambda t: "\n".join(t.splitlines()[:-1]) + "\n",
    "truncated-bool": lambda t: t.rstrip("\n")[:-2] + "\n",  # True -> Tr
    "lowercase-bool": lambda t: _last_row_cells(t, _set(-1, "true")),
    "changed-number": lambda t: _last_row_cells(t, _set(4, "0.5")),
    "nan-time": lambda t: _last_row_cells(t, _set(4, "nan")),
    "inf-in-feasible-row": lambda t: _last_row_cells(t, _set(5, "inf")),
    "underscore-int": lambda t: _last_row_cells(t, _set(1, "2_56")),
    "non-ascii-int": lambda t: _last_row_cells(t, _set(1, "\u0662\u0665\u0666")),
    "huge-int": lambda t: _last_row_cells(t, _set(1, "1" * 20)),
    "widened-edges": lambda t: t.replace("# seq_group_edges: [128, 256]", "# seq_group_edges: [128, 8192]"),
    "other-world-size": lambda t: t.replace("# world_size: 2", "# world_size: 4"),
    "other-hardware": lambda t: t.replace('# hardware: "cpu-x86_64-2cores"', '# hardware: "NVIDIA H200"'),
    "row-count": lambda t: t.replace('"row_count": 2', '"row_count": 3'),
    "no-checksum": lambda t: t.replace('"rows_sha256"', '"rows_sha"'),
    "bool-world-size": lambda t: t.replace("# world_size: 2", "# world_size: true"),
    "inf-capacity-in-key": lambda t: t.replace('"mem_capacity_gib": 1.0, "model"', '"mem_capacity_gib": 1e999, "model"'),
}


@pytest.mark.parametrize("edit", list(EDITS.values()), ids=list(EDITS))
def test_an_edited_or_truncated_table_is_corrupt_never_a_hit(tmp_path, edit):
    path = cache.store(table(), tmp_path, KEY)
    text = path.read_text()
    bad = edit(text)
    assert bad != text, "the edit must change the file"
    path.write_text(bad)
    found = cache.lookup(tmp_path, KEY)
    assert found.status == "corrupt", found
    assert str(path) in found.message and "dcp profile --refresh" in found.message
    with pytest.raises(CorruptCacheError):
        cache.load_or_refuse(tmp_path, KEY)


def test_a_non_utf8_or_directory_cache_file_is_corrupt(tmp_path):
    path = cache.cache_path(tmp_path, KEY)
    path.write_bytes(b"# model: \xff\xfe\n")
    found = cache.lookup(tmp_path, KEY)
    assert found.status == "corrupt" and "not UTF-8" in found.message and str(path) in found.message
    path.unlink()
    path.mkdir()
    assert cache.lookup(tmp_path, KEY).status == "corrupt"


def test_with_key_refuses_a_table_that_contradicts_its_key():
    wrong = ProfileTable(table().rows, dataclasses.replace(table().meta, seq_group_edges=(128, 8192)))
    with pytest.raises(cache.CacheError, match=r"seq_group_edges \(\[128, 8192\]\) differs"):
        cache.with_key(wrong, KEY)


def _unwritable(monkeypatch, folder):
    """Make ``folder`` refuse new files and renames, as a read-only folder does (tests may run as root)."""
    import pathlib
    import tempfile

    real_mkstemp, real_replace = tempfile.mkstemp, pathlib.Path.replace

    def mkstemp(*args, dir=None, **kw):
        if dir is not None and pathlib.Path(dir) == folder:
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, dir=dir, **kw)

    def replace(self, target):
        if pathlib.Path(self).parent == folder:
            raise PermissionError(13, "Permission denied")
        return real_replace(self, target)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(pathlib.Path, "replace", replace)


def test_an_unwritable_cache_folder_never_costs_the_table(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    monkeypatch.setattr(cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    _unwritable(monkeypatch, folder)
    with pytest.warns(cache.CacheWriteWarning, match=r"not writable .* written to .*copy it to"):
        where = cache.store(table(), folder, KEY)
    assert where.parent == cache.fallback_dir(folder) and where.name == cache.cache_path(folder, KEY).name
    assert ProfileTable.load(where).rows == table().rows
    # --refresh over a corrupt file in that folder: the rename aside fails too, the table still lands
    bad = cache.cache_path(folder, KEY)
    bad.write_text("garbage")
    with pytest.warns(cache.CacheWriteWarning):
        where = cache.store(table(), folder, KEY)
    assert ProfileTable.load(where).rows == table().rows and bad.read_text() == "garbage"


def test_no_writable_folder_at_all_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(cache.tempfile, "gettempdir", lambda: str(blocker))
    with pytest.raises(cache.CacheWriteError, match=r"could not be written to .* nor to .*--out FILE"):
        cache.store(table(), blocker / "cache", KEY)


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
