"""The profile-table cache: one CSV per (model, model config, world size) in ``profiling.cache_dir``.

A cached table is reused only when its stored key equals the run's key: model name and config hash,
world size, hardware, dtype, dcp version, and the profiling inputs that shape the table (seq_group
edges, SP sizes, largest b, memory capacity). Outcomes of :func:`lookup`:

- ``hit``: the file exists, parses, and its key matches; the table is returned;
- ``miss``: no file; profile (inside the run) and :func:`store` the result;
- ``stale``: the file parses but was made for another key (new dcp version, other GPU, ...);
- ``corrupt``: the file does not parse, has the wrong ``format_version`` or no key.

Stale and corrupt caches are refused: :func:`load_or_refuse` raises :class:`StaleCacheError` /
:class:`CorruptCacheError` whose message names the file and says how to refresh it (delete it or run
``dcp profile --refresh``). Storing over a corrupt file first moves it aside (``<name>.corrupt``),
so nothing is lost silently.

Only rank 0 writes, through a temporary file in the same folder and ``os.replace`` (atomic on POSIX):
a reader never sees half a table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp.planner.table import ProfileTable, TableError

KEY_FIELD = "cache_key"


class CacheError(ValueError):
    """A cached profile table cannot be used; the message says why and how to refresh it."""


class StaleCacheError(CacheError):
    """The cached table was profiled for another model, world size, hardware, dtype or dcp version."""


class CorruptCacheError(CacheError):
    """The cached table does not parse, has the wrong format_version, or lacks its cache key."""


@dataclass(kw_only=True, slots=True, frozen=True)
class CacheKey:
    """Everything a cached table must match to be reused."""

    model: str
    """Model name (adapter name)."""
    model_hash: str
    """Hash of the model's config (shapes, vocabulary, ...)."""
    world_size: int
    """Ranks of the job the table was profiled for."""
    hardware: str
    """Device description (GPU name, or 'cpu-<arch>-<cores>')."""
    dtype: str
    """Parameter dtype, e.g. 'float32'."""
    precision: str
    """Compute precision the table was measured in ('bf16' or 'fp32', runtime.precision resolved)."""
    version: str
    """dcp version that profiled the table."""
    seq_group_edges: tuple[int, ...]
    """profiling.seq_group_edges."""
    sp_sizes: tuple[int, ...]
    """SP sizes that were profiled."""
    max_micro_batch_size: int
    """profiling.max_micro_batch_size."""
    mem_capacity_gib: float
    """planning.mem_capacity_gib: the search skipped what did not fit it."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seq_group_edges"] = list(self.seq_group_edges)
        d["sp_sizes"] = list(self.sp_sizes)
        return d

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CacheKey:
        names = {f.name for f in dataclasses.fields(cls)}
        if set(raw) != names:
            raise CorruptCacheError(
                f"cache key fields ({sorted(raw)}) differ from {sorted(names)}: delete the file or run "
                "`dcp profile --refresh`"
            )
        return cls(**{**raw, "seq_group_edges": tuple(raw["seq_group_edges"]), "sp_sizes": tuple(raw["sp_sizes"])})

    def diff(self, other: CacheKey) -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ: name -> (self's, other's)."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cache_dir: str | Path, key: CacheKey) -> Path:
    """``<cache_dir>/<model>-<model_hash[:8]>-w<world_size>.csv``: one file per model config and world."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.model)
    return Path(cache_dir) / f"{safe}-{key.model_hash[:8]}-w{key.world_size}.csv"


@dataclass(kw_only=True, slots=True, frozen=True)
class CacheLookup:
    """Outcome of a cache lookup."""

    status: str
    """'hit', 'miss', 'stale' or 'corrupt'."""
    path: Path
    """The cache file that was looked at."""
    table: ProfileTable | None = None
    """The table on a hit (on stale too, for inspection; never for planning)."""
    message: str = ""
    """Why a stale or corrupt cache was refused, and how to refresh it."""

    @property
    def hit(self) -> bool:
        return self.status == "hit"


def _refresh_hint(path: Path) -> str:
    return f"delete {path} or run `dcp profile --refresh` (or set refresh=True) to profile again"


def lookup(cache_dir: str | Path, key: CacheKey) -> CacheLookup:
    """Look for the table of ``key`` in ``cache_dir``; never raises for a bad file (see ``status``)."""
    path = cache_path(cache_dir, key)
    if not path.exists():
        return CacheLookup(status="miss", path=path)
    try:
        table = ProfileTable.load(path)
        raw = table.meta.extra.get(KEY_FIELD)
        if not isinstance(raw, dict):
            raise CorruptCacheError(f"table metadata has no {KEY_FIELD!r}")
        stored = CacheKey.from_dict(raw)
    except (TableError, CacheError, OSError, UnicodeDecodeError, TypeError, ValueError, KeyError) as exc:
        return CacheLookup(
            status="corrupt", path=path,
            message=f"cached profile table {path} is corrupt ({exc}): {_refresh_hint(path)}",
        )
    if stored != key:
        changes = ", ".join(f"{k}: cached {a!r} vs now {b!r}" for k, (a, b) in stored.diff(key).items())
        return CacheLookup(
            status="stale", path=path, table=table,
            message=f"cached profile table {path} is stale ({changes}): {_refresh_hint(path)}",
        )
    return CacheLookup(status="hit", path=path, table=table)


def load_or_refuse(cache_dir: str | Path, key: CacheKey, *, refresh: bool = False) -> ProfileTable | None:
    """The cached table on a hit, None when profiling is needed (miss, or refresh requested).

    Stale or corrupt caches raise unless ``refresh`` (then the caller profiles and :func:`store` moves a
    corrupt file aside to ``<name>.corrupt`` before writing).
    """
    found = lookup(cache_dir, key)
    if found.status == "hit" and not refresh:
        return found.table
    if found.status == "miss" or (found.status == "hit" and refresh):
        return None
    if not refresh:
        err = StaleCacheError if found.status == "stale" else CorruptCacheError
        raise err(found.message)
    return None  # store() moves a corrupt file aside before writing


def need_profile(cache_dir: str | Path, key: CacheKey, *, refresh: bool = False) -> bool:
    """True when no valid cached table exists; raises on a stale or corrupt one (unless ``refresh``)."""
    found = lookup(cache_dir, key)
    if found.status in ("stale", "corrupt") and not refresh:
        err = StaleCacheError if found.status == "stale" else CorruptCacheError
        raise err(found.message)
    return refresh or not found.hit


def with_key(table: ProfileTable, key: CacheKey) -> ProfileTable:
    """A copy of ``table`` whose metadata carries ``key`` (what :func:`lookup` checks)."""
    meta = dataclasses.replace(table.meta, extra={**table.meta.extra, KEY_FIELD: key.to_dict()})
    return ProfileTable(table.rows, meta)


def store(table: ProfileTable, cache_dir: str | Path, key: CacheKey, *, rank: int = 0) -> Path:
    """Write ``table`` (with ``key`` in its metadata) atomically; only rank 0 writes. Returns the path."""
    path = cache_path(cache_dir, key)
    if rank != 0:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and lookup(cache_dir, key).status == "corrupt":
        # never overwrite a corrupt cache silently: keep it beside the new one for inspection
        path.replace(path.with_name(path.name + ".corrupt"))
    text = with_key(table, key).to_csv()
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; a cache is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
