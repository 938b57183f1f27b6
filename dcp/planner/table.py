"""The profile table: measured rows (seq_group, b, p) -> t_f, t_b, m, m_inp, T_C, M_C, L.

Pure data (no torch). Times are seconds, memory is bytes per rank. CSV files carry a metadata header of
``# key: value`` lines (values JSON-encoded) before the column header; parquet files keep the same
metadata in the schema's key/value metadata (needs pyarrow).
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp.config import MAX_TOKENS, read_text_file
from dcp.files import write_text, write_with
from dcp.memory import staging_bytes

TABLE_FORMAT_VERSION = 1


class TableError(ValueError):
    """A profile table is malformed or does not cover what was asked of it."""


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One profiled candidate: b samples of one seq_group on an SP group of p ranks (values per rank)."""

    seq_group: int
    """Index of the seq_group (position in TableMeta.seq_group_edges)."""
    seq_len: int
    """Tokens per sample the row was measured at (the seq_group's upper bound)."""
    micro_batch_size: int
    """b: samples in the micro-batch."""
    sp_size: int
    """p: ranks sharing each sequence."""
    t_f_s: float
    """Forward time of one layer."""
    t_b_s: float
    """Backward time of one layer (without its recompute)."""
    m_act_bytes: float
    """m: activation bytes one non-recomputed layer keeps for backward (beyond its input): Eq. 6's slope per
    layer. The CUDA allocator meter fits it with M_C so that Eq. 6 is exact at r = 0 and r = L of this
    table's L (``dcp.profiler.measure.eq6_terms``): it can read up to a layer's activations / L below the
    raw per-layer figure, so do not carry it to a model of another depth."""
    m_inp_bytes: float
    """m_inp: bytes of one layer's input, kept even under checkpointing."""
    t_const_s: float
    """T_C: time outside the repeated layers (embedding, head, loss, optimizer share)."""
    m_const_bytes: float
    """M_C: memory outside the layers' activations (parameters, gradients, optimizer state, buffers)."""
    num_layers: int
    """L: repeated layers of the model."""
    feasible: bool = True
    """False when the candidate ran out of memory while profiling, or exceeds mem_capacity_gib even with full
    recompute (its times are inf); kept so it is not profiled again."""

    @property
    def tokens(self) -> int:
        return self.seq_len * self.micro_batch_size


COLUMNS = tuple(f.name for f in dataclasses.fields(ProfileRow))
_INT_COLUMNS = {"seq_group", "seq_len", "micro_batch_size", "sp_size", "num_layers"}


@dataclass(frozen=True, slots=True)
class TableMeta:
    """Where a table comes from; the profiler's cache keys on these fields."""

    model: str
    """Model name (and a hash of its config when profiled for real)."""
    hardware: str
    """Device description, e.g. 'cpu-gloo' or 'NVIDIA H200'."""
    dtype: str
    """Profiled tables: the parameters' dtype (as their cache key); the compute precision is
    ``extra["precision"]``. Analytic tables: the compute dtype. E.g. 'float32' or 'bfloat16'."""
    world_size: int
    """Ranks of the job the table was profiled for."""
    seq_group_edges: tuple[int, ...]
    """Upper token bound of every seq_group."""
    version: str = ""
    """dcp version that wrote the table."""
    source: str = "analytic"
    """'analytic' (generated) or 'profiled' (measured)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form facts (model config hash, profiling wall time, ...)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "seq_group_edges", tuple(int(e) for e in self.seq_group_edges))


def _pyarrow(path: str | Path) -> tuple[Any, Any]:
    """(pyarrow, pyarrow.parquet); a TableError naming the extra to install when pyarrow is missing."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TableError(f"profile table ({str(path)!r}) is a .parquet file, which needs pyarrow (not installed): "
                         "pip install 'dcp[parquet]', or use a .csv table") from None
    return pa, pq


class ProfileTable:
    """Rows indexed by seq_group, plus metadata. Immutable once built."""

    def __init__(self, rows: Iterable[ProfileRow], meta: TableMeta) -> None:
        self.meta = meta
        self.rows: tuple[ProfileRow, ...] = tuple(
            sorted(rows, key=lambda r: (r.seq_group, r.sp_size, r.micro_batch_size))
        )
        n = len(meta.seq_group_edges)
        self._by_group: list[list[ProfileRow]] = [[] for _ in range(n)]
        for r in self.rows:
            if not 0 <= r.seq_group < n:
                raise TableError(
                    f"row seq_group ({r.seq_group}) is outside the {n} seq_groups of the metadata: "
                    "regenerate the table with matching seq_group_edges"
                )
            self._by_group[r.seq_group].append(r)
        layers = {r.num_layers for r in self.rows}
        if len(layers) > 1:
            raise TableError(f"rows disagree on num_layers ({sorted(layers)}): a table describes one model")
        for r in self.rows:
            _check_row(r, meta.seq_group_edges)

    # ----- lookups -----------------------------------------------------------------------------
    @property
    def seq_group_edges(self) -> tuple[int, ...]:
        return self.meta.seq_group_edges

    @property
    def num_layers(self) -> int:
        return self.rows[0].num_layers if self.rows else 0

    @property
    def max_len(self) -> int:
        return self.meta.seq_group_edges[-1]

    def group_of(self, length: int) -> int | None:
        """Index of the seq_group holding a sample of ``length`` tokens, or None if longer than every bound."""
        i = bisect.bisect_left(self.meta.seq_group_edges, length)
        return i if i < len(self.meta.seq_group_edges) else None

    def rows_for(self, seq_group: int) -> Sequence[ProfileRow]:
        return self._by_group[seq_group]

    def __len__(self) -> int:
        return len(self.rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProfileTable) and self.rows == other.rows and self.meta == other.meta

    def __repr__(self) -> str:
        return f"ProfileTable({len(self.rows)} rows, {len(self.seq_group_edges)} seq_groups, meta={self.meta})"

    # ----- CSV ---------------------------------------------------------------------------------
    def to_csv(self, path: str | Path | None = None) -> str:
        buf = io.StringIO()
        meta = dataclasses.asdict(self.meta)
        meta["format_version"] = TABLE_FORMAT_VERSION
        for k in sorted(meta):
            buf.write(f"# {k}: {json.dumps(meta[k], sort_keys=True)}\n")
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in self.rows:
            w.writerow([repr(v) if isinstance(v, float) else v for v in dataclasses.astuple(r)])
        text = buf.getvalue()
        if path is not None:
            write_text(path, text)  # atomic: a reader never sees half a table, a failed write keeps the old one
        return text

    @classmethod
    def from_csv(cls, path_or_text: str | Path, *, text: bool = False) -> ProfileTable:
        """Parse a CSV table strictly; every error names the file (and line) and says how to fix it."""
        where = "table text" if text else str(path_or_text)
        src = str(path_or_text) if text else read_text_file(path_or_text, what="profile table", error=TableError)
        meta_raw: dict[str, Any] = {}
        body: list[tuple[int, str]] = []
        for n, line in enumerate(src.splitlines(), start=1):
            if line.startswith("# "):
                key, sep, val = line[2:].partition(": ")
                if not sep:
                    raise TableError(f"{where}:{n}: metadata line ({line!r}) lacks ': ': expected '# key: json-value'")
                try:
                    meta_raw[key] = json.loads(val)
                except json.JSONDecodeError:
                    raise TableError(f"{where}:{n}: metadata {key} ({val!r}) is not JSON: regenerate the table") from None
            elif line.strip():
                body.append((n, line))
        if not body:
            raise TableError(f"{where}: has no column header line: regenerate the table")
        header = next(csv.reader([body[0][1]]))
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TableError(f"{where}:{body[0][0]}: header lacks columns {missing}: expected columns {list(COLUMNS)}")
        if header != list(COLUMNS):
            raise TableError(f"{where}:{body[0][0]}: columns {header} are not {list(COLUMNS)}: regenerate the table")
        records = []
        for (n, _), rec in zip(body[1:], csv.reader(ln for _, ln in body[1:]), strict=True):
            if len(rec) != len(COLUMNS):
                raise TableError(f"{where}:{n}: row has {len(rec)} fields, the header {len(COLUMNS)}: "
                                 "fix or regenerate the table")
            records.append((f"{where}:{n}", dict(zip(COLUMNS, rec, strict=True))))
        try:
            meta = _meta_from_dict(meta_raw)
        except TableError as exc:
            raise TableError(f"{where}: {exc}") from None
        rows = _rows_from_records(records)
        try:
            return cls(rows, meta)
        except TableError as exc:
            raise TableError(f"{where}: {exc}") from None

    # ----- parquet -----------------------------------------------------------------------------
    def to_parquet(self, path: str | Path) -> None:
        pa, pq = _pyarrow(path)
        meta = dataclasses.asdict(self.meta)
        meta["format_version"] = TABLE_FORMAT_VERSION
        tbl = pa.table({c: [getattr(r, c) for r in self.rows] for c in COLUMNS})
        tbl = tbl.replace_schema_metadata({b"dcp_meta": json.dumps(meta).encode()})
        write_with(path, lambda tmp: pq.write_table(tbl, str(tmp)))

    @classmethod
    def from_parquet(cls, path: str | Path) -> ProfileTable:
        _pa, pq = _pyarrow(path)
        _check_readable(path, "profile table")
        try:
            tbl = pq.read_table(str(path))
        except (OSError, ValueError) as exc:
            raise TableError(f"profile table ({str(path)!r}) is not a readable parquet file ({exc}): "
                             "regenerate it") from None
        raw = (tbl.schema.metadata or {}).get(b"dcp_meta")
        if raw is None:
            raise TableError(f"parquet file ({str(path)!r}) has no dcp metadata: it was not written by ProfileTable")
        try:
            meta = _meta_from_dict(json.loads(raw))
        except (TableError, json.JSONDecodeError) as exc:
            raise TableError(f"{path}: {exc}") from None
        return cls(_rows_from_records((f"{path} row {i}", r) for i, r in enumerate(tbl.to_pylist())), meta)

    # ----- generic -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        if str(path).endswith(".parquet"):
            self.to_parquet(path)
        else:
            self.to_csv(path)

    @classmethod
    def load(cls, path: str | Path) -> ProfileTable:
        """Read a .csv or .parquet table; errors (TableError) name the file, the line and the fix."""
        _check_readable(path, "profile table")
        return cls.from_parquet(path) if str(path).endswith(".parquet") else cls.from_csv(path)

    def with_rows(self, rows: Iterable[ProfileRow]) -> ProfileTable:
        return ProfileTable(rows, self.meta)


_NONNEG = ("t_f_s", "t_b_s", "m_act_bytes", "m_inp_bytes", "t_const_s", "m_const_bytes")


def _check_row(r: ProfileRow, edges: tuple[int, ...]) -> None:
    """A row's own consistency: times and bytes >= 0, seq_len inside its seq_group's interval."""
    where = f"row (seq_group={r.seq_group}, b={r.micro_batch_size}, p={r.sp_size})"
    for name in _NONNEG:
        value = getattr(r, name)
        if not value >= 0:  # also refuses nan
            raise TableError(f"{where}: {name} ({value!r}) must be >= 0 (a time or a byte count): fix or regenerate "
                             "the table")
    low = edges[r.seq_group - 1] if r.seq_group > 0 else 0
    if not low < r.seq_len <= edges[r.seq_group]:
        raise TableError(f"{where}: seq_len ({r.seq_len}) is outside its seq_group's interval ({low}, "
                         f"{edges[r.seq_group]}] of seq_group_edges {list(edges)}: regenerate the table with these "
                         "edges")


def check_table_for_model(table: ProfileTable, *, num_layers: int, model_hash: str | None = None,
                          model_name: str = "the model") -> None:
    """Raise TableError unless ``table`` was measured for this model: the same layer count and, where both
    are known, the same config hash (a table of another width or depth prices every step wrongly)."""
    if len(table) and table.num_layers != num_layers:
        raise TableError(f"profile table of {table.meta.model!r} has num_layers ({table.num_layers}), but "
                         f"{model_name} has {num_layers}: profile this model (mgr.init_profiler() or `dcp profile`) "
                         "or pass its own table")
    stored = table.meta.extra.get("model_hash")
    if model_hash and isinstance(stored, str) and stored != model_hash:
        raise TableError(f"profile table of {table.meta.model!r} was measured for model config hash {stored!r}, "
                         f"but {model_name}'s is {model_hash!r} (another width, head count or vocabulary): profile "
                         "this model (mgr.init_profiler() or `dcp profile`) or pass its own table")


def _check_readable(path: str | Path, what: str) -> None:
    p = Path(path)
    if not p.exists():
        raise TableError(f"{what} ({str(p)!r}) does not exist: pass the path of a table written by `dcp profile "
                         "--out` or ProfileTable.save")
    if p.is_dir():
        raise TableError(f"{what} ({str(p)!r}) is a directory: pass the path of a .csv or .parquet table file")


_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": str, "hardware": str, "dtype": str, "world_size": int, "seq_group_edges": list, "version": str,
    "source": str, "extra": dict,
}


def _meta_from_dict(raw: dict[str, Any]) -> TableMeta:
    raw = dict(raw)
    version = raw.pop("format_version", None)
    if version != TABLE_FORMAT_VERSION:
        raise TableError(
            f"table format_version ({version!r}) is not {TABLE_FORMAT_VERSION}: regenerate the table with this dcp"
        )
    names = {f.name for f in dataclasses.fields(TableMeta)}
    missing = sorted({"model", "hardware", "dtype", "world_size", "seq_group_edges"} - set(raw))
    if missing:
        raise TableError(f"table metadata lacks {missing}: regenerate the table")
    unknown = sorted(set(raw) - names)
    if unknown:
        raise TableError(f"table metadata has unknown keys {unknown}: valid keys are {sorted(names)}")
    for key, value in raw.items():
        expected = _META_TYPES[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise TableError(f"table metadata {key} ({value!r}) must be a {getattr(expected, '__name__', expected)}: "
                             "regenerate the table")
    if raw["world_size"] < 1:
        raise TableError(f"table metadata world_size ({raw['world_size']}) must be >= 1: regenerate the table")
    edges = raw["seq_group_edges"]
    if (not edges or not all(type(e) is int and 1 <= e <= MAX_TOKENS for e in edges)
            or any(b <= a for a, b in zip(edges, edges[1:], strict=False))):
        raise TableError(f"table metadata seq_group_edges ({edges!r}) must be strictly increasing integers in "
                         f"[1, {MAX_TOKENS}]: regenerate the table")
    return TableMeta(**raw)


_INT_TEXT = re.compile(r"[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?|[+]?inf")


def _cell(where: str, column: str, value: Any, feasible: bool) -> Any:
    """One strictly parsed cell: ints are ASCII digits, floats are finite (inf only in an infeasible row)."""
    if column == "feasible":
        if isinstance(value, bool):
            return value
        if value in ("True", "False"):
            return value == "True"
        raise TableError(f"{where}: feasible ({value!r}) is not True or False: fix or regenerate the table")
    if column in _INT_COLUMNS:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str)
                                                                       and _INT_TEXT.fullmatch(value))):
            raise TableError(f"{where}: {column} ({value!r}) is not a non-negative integer: fix or regenerate "
                             "the table")
        v = int(value)
        low = 0 if column == "seq_group" else 1
        if not low <= v <= MAX_TOKENS:
            raise TableError(f"{where}: {column} ({v}) must be in [{low}, {MAX_TOKENS}]: fix or regenerate the table")
        return v
    if isinstance(value, bool) or not (isinstance(value, int | float) or (isinstance(value, str)
                                                                          and _FLOAT_TEXT.fullmatch(value))):
        raise TableError(f"{where}: {column} ({value!r}) is not a number: fix or regenerate the table")
    v = float(value)
    if math.isnan(v) or (feasible and not math.isfinite(v)) or v == -math.inf:
        raise TableError(f"{where}: {column} ({v!r}) must be finite (inf only in a row with feasible=False): fix "
                         "or regenerate the table")
    return v


def _rows_from_records(records: Iterable[tuple[str, dict[str, Any]]]) -> list[ProfileRow]:
    rows = []
    for where, rec in records:
        missing = [c for c in COLUMNS if c not in rec]
        if missing:
            raise TableError(f"{where}: row lacks columns {missing}: expected columns {list(COLUMNS)}")
        feasible = _cell(where, "feasible", rec["feasible"], True)
        rows.append(ProfileRow(**{c: _cell(where, c, rec[c], feasible) for c in COLUMNS}))
    return rows


def engine_state_bytes(whole_bytes: float, model: Any, engine: str, world_size: int,
                       precision: str = "fp32") -> float:
    """Bytes of parameters, gradients and optimizer state a rank holds under ``engine``, from the ``whole_bytes``
    measured on the unsharded model: fsdp2 engines hold their memory model's share at ``world_size`` in the run's
    ``precision`` (``ModelShapeConfig.constant_mem_bytes``), the others the whole. The share is capped at the
    whole except fsdp2's under bf16, whose gathered bf16 copy comes on top of the fp32 shards (at W = 1 the
    whole fp32 state; measured on an H200: docs/engines.md)."""
    if not engine.startswith("fsdp2"):
        return whole_bytes
    compute = 2 if precision == "bf16" else None
    held = float(model.constant_mem_bytes(engine, dp_size=world_size, compute_bytes=compute)
                 - staging_bytes(model, engine))  # the state held through the step, as measured: no staging
    return held if engine == "fsdp2" and precision == "bf16" else min(whole_bytes, held)


def with_engine_state(table: ProfileTable, model: Any, engine: str, world_size: int) -> ProfileTable:
    """``table`` with each row's M_C holding the state ``engine`` keeps per rank (``engine_state_bytes``). A
    profiled table records the whole state it measured (``state_bytes_whole``) and the part its M_C counts
    (``state_bytes``), so a table cached under one engine serves another; a table without those records
    (analytic: priced per engine already) is returned as it is. Likewise m_act: a table profiled under autocast
    records its layers' bf16 weight copies (``weight_copy_bytes``) and whether m_act counts them
    (``weight_copies_in_m_act``); fsdp2 engines make none, the others keep them."""
    extra = table.meta.extra if isinstance(table, ProfileTable) else {}
    if "state_bytes" not in extra:
        return table
    whole = float(extra.get("state_bytes_whole", extra["state_bytes"]))
    want = engine_state_bytes(whole, model, engine, world_size, str(extra.get("precision", "fp32")))
    delta = want - float(extra["state_bytes"])
    copies, counted = float(extra.get("weight_copy_bytes", 0.0)), bool(extra.get("weight_copies_in_m_act", False))
    keep = copies > 0 and not engine.startswith("fsdp2")
    act = 0.0 if copies <= 0 or keep == counted else (copies if keep else -copies)
    if abs(delta) < 1.0 and act == 0.0:
        return table
    rows = [dataclasses.replace(r, m_const_bytes=r.m_const_bytes + delta, m_act_bytes=r.m_act_bytes + act)
            for r in table.rows]
    return ProfileTable(rows, dataclasses.replace(table.meta, extra={
        **extra, "state_bytes": want, "state_bytes_whole": whole,
        **({"weight_copies_in_m_act": keep} if copies > 0 else {})}))
