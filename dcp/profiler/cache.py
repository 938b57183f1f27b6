"""The profile-table cache: one CSV per full key in ``profiling.cache_dir``, so several tables coexist.

A table is cached under ``<model>-<model_hash[:8]>-w<world_size>-<key digest[:12]>.csv``: the digest covers
the whole key (model name and config hash, world size, hardware, dtype, dcp version, and the profiling
inputs that shape the table: seq_group edges, SP sizes, largest b, memory capacity), so profiling with
other edges, another dtype or a new dcp version writes a new file beside the old ones instead of
replacing them. Outcomes of :func:`lookup`:

- ``hit``: the file exists and proves its content (below); the table is returned;
- ``miss``: no file for this key; profile (inside the run) and :func:`store` the result;
- ``stale``: the file at this key's path holds a table made for another key (copied or renamed by hand);
- ``corrupt``: the file does not prove its content.

A cached table proves its content: its metadata carries the key (``cache_key``), the row count and a
SHA-256 of the rows (``rows_sha256``, over their canonical text), and the table's own top-level metadata
(model, hardware, dtype, world size, seq_group edges, version; memory capacity and SP sizes in ``extra``)
must equal the key. Every field is parsed strictly (``feasible`` is ``True`` or ``False``; integers are
ASCII digits; times and bytes are finite except in infeasible rows), so a truncated, edited or widened file
is ``corrupt``, never a hit.

Stale and corrupt caches are refused: :func:`load_or_refuse` raises :class:`StaleCacheError` /
:class:`CorruptCacheError` whose message names the file and says how to refresh it (delete it or run
``dcp profile --refresh``). Storing over a corrupt file first moves it aside (``<name>.corrupt``),
so nothing is lost silently.

Only rank 0 writes, through a temporary file in the same folder and ``os.replace`` (atomic on POSIX):
a reader never sees half a table. A cache folder that cannot be written never costs the profiled table:
:func:`store` then writes it to :func:`fallback_dir` (in the system's temporary folder), warns with both
paths, and returns where the table went.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp.files import write_text
from dcp.planner.table import ProfileTable, TableError

KEY_FIELD = "cache_key"


class CacheError(ValueError):
    """A cached profile table cannot be used; the message says why and how to refresh it."""


class StaleCacheError(CacheError):
    """The cached table was profiled for another model, world size, hardware, dtype or dcp version."""


class CorruptCacheError(CacheError):
    """The cached table does not parse strictly, or its rows, row count or metadata do not match its key."""


class CacheWriteWarning(UserWarning):
    """The cache folder could not be written; the table went to the fallback folder (the message says where)."""


class CacheWriteError(CacheError, OSError):
    """Neither the cache folder nor the fallback folder could be written."""


CHECKSUM_FIELD = "rows_sha256"
COUNT_FIELD = "row_count"


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
    clock: str
    """advanced.clock the rows were timed with, resolved on the device ('wall', 'cpu' or 'pipelined')."""
    compile: str = "off"
    """runtime.compile of the profiled layers (dcp.runtime.compiled). Left out of the stored key (and of its
    digest) when "off", so tables profiled before the field existed, all eager, are still found."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seq_group_edges"] = list(self.seq_group_edges)
        d["sp_sizes"] = list(self.sp_sizes)
        if d["compile"] == "off":
            del d["compile"]
        return d

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CacheKey:
        """The key stored in a table's metadata, every field type-checked (CorruptCacheError otherwise)."""
        if not isinstance(raw, dict):
            raise CorruptCacheError(f"cache key ({raw!r}) is not a JSON object: delete the file or run "
                                    "`dcp profile --refresh`")
        names = {f.name for f in dataclasses.fields(cls)}
        if set(raw) not in (names, names - {"compile"}):
            raise CorruptCacheError(
                f"cache key fields ({sorted(raw)}) differ from {sorted(names)}: delete the file or run "
                "`dcp profile --refresh`"
            )
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:  # compile, left out when "off"
                continue
            value, kind = raw[f.name], str(f.type)
            if kind.startswith("tuple"):
                ok = isinstance(value, list) and all(type(v) is int for v in value)
                value = tuple(value) if ok else value
            elif kind == "int":
                ok = type(value) is int
            elif kind == "float":
                ok = type(value) in (int, float) and math.isfinite(value)
                value = float(value) if ok else value
            else:
                ok = isinstance(value, str)
            if not ok:
                raise CorruptCacheError(f"cache key field {f.name} ({value!r}) is not a valid {kind}: delete the "
                                        "file or run `dcp profile --refresh`")
            kw[f.name] = value
        return cls(**kw)

    def diff(self, other: CacheKey) -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ: name -> (self's, other's)."""
        a, b = dataclasses.asdict(self), dataclasses.asdict(other)
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cache_dir: str | Path, key: CacheKey) -> Path:
    """``<cache_dir>/<model>-<model_hash[:8]>-w<world_size>-<digest[:12]>.csv``: one file per full key."""
    if not str(cache_dir).strip():  # Path("") is the current folder: never scatter tables there
        raise CacheError(f"cache_dir ({str(cache_dir)!r}) is empty: set profiling.cache_dir to a folder, e.g. "
                         "\".dcp_cache\"")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", key.model)
    return Path(cache_dir) / f"{safe}-{key.model_hash[:8]}-w{key.world_size}-{key.digest()[:12]}.csv"


def fallback_dir(cache_dir: str | Path) -> Path:
    """Where :func:`store` writes when ``cache_dir`` cannot be written: a per-user folder in the system's
    temporary folder, one sub-folder per cache folder (named by a hash of its absolute path)."""
    tag = hashlib.sha256(str(Path(cache_dir).absolute()).encode()).hexdigest()[:8]
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"dcp-cache-{user}" / tag


def rows_checksum(table: ProfileTable) -> str:
    """SHA-256 of the rows' canonical text (the CSV cells ``ProfileTable.to_csv`` writes)."""
    h = hashlib.sha256()
    for r in table.rows:
        cells = [repr(v) if isinstance(v, float) else str(v) for v in dataclasses.astuple(r)]
        h.update((",".join(cells) + "\n").encode())
    return h.hexdigest()


def verify(table: ProfileTable, key: CacheKey) -> None:
    """Raise CorruptCacheError unless ``table`` proves it is the table of ``key`` (the key stored in it, already
    parsed by the caller): its own metadata agrees with ``key`` where it has the field, and its row count and
    checksum match."""
    meta, extra = table.meta, table.meta.extra
    for name, value in key.to_dict().items():
        if hasattr(meta, name):
            actual = getattr(meta, name)
            actual = list(actual) if isinstance(actual, tuple) else actual
        elif name in extra:
            actual = extra[name]
        else:
            continue
        if actual != value:
            raise CorruptCacheError(f"the table's metadata {name} ({actual!r}) differs from its cache key's "
                                    f"({value!r})")
    count, digest = extra.get(COUNT_FIELD), extra.get(CHECKSUM_FIELD)
    if type(count) is not int or not isinstance(digest, str):
        raise CorruptCacheError(f"metadata has no valid {COUNT_FIELD} / {CHECKSUM_FIELD} ({count!r}, {digest!r})")
    if count != len(table):
        raise CorruptCacheError(f"the file holds {len(table)} rows, its metadata says {count}")
    if rows_checksum(table) != digest:
        raise CorruptCacheError(f"the rows do not match their {CHECKSUM_FIELD} (edited or damaged)")
    for r in table.rows:
        if r.sp_size not in key.sp_sizes or r.micro_batch_size > key.max_micro_batch_size:
            raise CorruptCacheError(f"a row's (b={r.micro_batch_size}, p={r.sp_size}) lies outside the key's "
                                    f"sp_sizes {list(key.sp_sizes)} / max_micro_batch_size "
                                    f"{key.max_micro_batch_size}")


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
        verify(table, stored)
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
    """A copy of ``table`` whose metadata carries ``key``, the row count and the rows' checksum (what
    :func:`lookup` verifies). Raises CacheError when the table's own metadata contradicts ``key``."""
    extra = {**table.meta.extra, KEY_FIELD: key.to_dict(), COUNT_FIELD: len(table),
             CHECKSUM_FIELD: rows_checksum(table)}
    out = ProfileTable(table.rows, dataclasses.replace(table.meta, extra=extra))
    try:
        verify(out, key)
    except CorruptCacheError as exc:
        raise CacheError(f"cannot cache this table under its key: {exc}: profile with the config the key was "
                         "made from") from None
    return out


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)  # temporary file + fsync + os.replace: a reader never sees half a table


def store(table: ProfileTable, cache_dir: str | Path, key: CacheKey, *, rank: int = 0) -> Path:
    """Write ``table`` (with ``key``, row count and checksum in its metadata) atomically; only rank 0 writes.

    Returns the path the table was written to: the cache path, or, when ``cache_dir`` cannot be written,
    the same file name in :func:`fallback_dir` (with a :class:`CacheWriteWarning` naming both). Raises
    :class:`CacheWriteError` only when neither folder can be written.
    """
    path = cache_path(cache_dir, key)
    if rank != 0:
        return path
    text = with_key(table, key).to_csv()
    try:
        if path.exists() and lookup(cache_dir, key).status == "corrupt":
            # never overwrite a corrupt cache silently: keep it beside the new one for inspection
            path.replace(path.with_name(path.name + ".corrupt"))
        _write_atomic(path, text)
        return path
    except OSError as exc:
        first = exc
    spare = fallback_dir(cache_dir) / path.name
    try:
        _write_atomic(spare, text)
    except OSError as exc:
        raise CacheWriteError(
            f"profile table could not be written to {path} ({first.strerror or first}) nor to {spare} "
            f"({exc.strerror or exc}): make profiling.cache_dir writable, or pass `dcp profile --out FILE`"
        ) from None
    warnings.warn(
        f"cache folder {path.parent} is not writable ({first.strerror or first}): the profiled table was "
        f"written to {spare} instead; copy it to {path} or set profiling.cache_dir to a writable folder so "
        "later runs reuse it",
        CacheWriteWarning, stacklevel=2,
    )
    return spare
