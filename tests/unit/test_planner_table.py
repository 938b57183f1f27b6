"""Profile table: CSV and parquet round trips and every error path."""

from __future__ import annotations

import json
import sys

import pytest

from dcp.config import ModelShapeConfig
from dcp.planner import CPU_SMALL, ProfileRow, ProfileTable, TableError, TableMeta, analytic_table

MODEL = ModelShapeConfig(name="m", num_layers=2, hidden_size=64, num_heads=8)


@pytest.fixture
def table() -> ProfileTable:
    return analytic_table(
        MODEL,
        (128, 512),
        sp_sizes=(1, 2),
        max_micro_batch_size=4,
        world_size=2,
        hardware=CPU_SMALL,
        mem_capacity_bytes=2**22,
    )


def test_csv_round_trip(table, tmp_path):
    path = tmp_path / "t.csv"
    table.save(path)
    back = ProfileTable.load(path)
    assert back == table and back.rows == table.rows
    assert ProfileTable.from_csv(table.to_csv(), text=True) == table
    assert any(not r.feasible for r in back.rows)  # booleans survive


def test_parquet_round_trip(table, tmp_path):
    path = tmp_path / "t.parquet"
    table.save(path)
    assert ProfileTable.load(path) == table


def test_lookups(table):
    assert table.group_of(1) == 0 and table.group_of(128) == 0 and table.group_of(129) == 1
    assert table.group_of(513) is None
    assert table.max_len == 512 and table.num_layers == 2
    assert all(r.seq_group == 1 for r in table.rows_for(1))


def _csv(table) -> str:
    return table.to_csv()


def test_malformed_metadata_line(table):
    text = _csv(table).replace("# dtype: ", "# dtype=", 1)
    with pytest.raises(TableError, match="lacks ': '"):
        ProfileTable.from_csv(text, text=True)


def test_metadata_not_json(table):
    text = _csv(table).replace('# dtype: "float32"', "# dtype: float32", 1)
    with pytest.raises(TableError, match="metadata dtype .* is not JSON"):
        ProfileTable.from_csv(text, text=True)


def test_wrong_format_version(table):
    text = _csv(table).replace("# format_version: 1", "# format_version: 99", 1)
    with pytest.raises(TableError, match=r"format_version \(99\) is not 1"):
        ProfileTable.from_csv(text, text=True)


def test_missing_and_unknown_metadata(table):
    text = "\n".join(ln for ln in _csv(table).splitlines() if not ln.startswith("# hardware"))
    with pytest.raises(TableError, match=r"lacks \['hardware'\]"):
        ProfileTable.from_csv(text, text=True)
    text = _csv(table).replace("# dtype:", '# colour: "red"\n# dtype:', 1)
    with pytest.raises(TableError, match=r"unknown keys \['colour'\]"):
        ProfileTable.from_csv(text, text=True)


def test_missing_column(table):
    lines = _csv(table).splitlines()
    hdr = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    cols = lines[hdr].split(",")
    drop = cols.index("t_b_s")
    lines = lines[:hdr] + [
        ",".join(c for j, c in enumerate(ln.split(",")) if j != drop) for ln in lines[hdr:]
    ]
    with pytest.raises(TableError, match=r"lacks columns \['t_b_s'\]"):
        ProfileTable.from_csv("\n".join(lines), text=True)


def test_non_numeric_value(table):
    lines = _csv(table).splitlines()
    hdr = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    cells = lines[hdr + 1].split(",")
    cells[4] = "fast"
    lines[hdr + 1] = ",".join(cells)
    with pytest.raises(TableError, match=r"table text:\d+: t_f_s \('fast'\) is not a number"):
        ProfileTable.from_csv("\n".join(lines), text=True)


def test_row_outside_groups_and_mixed_layers():
    meta = TableMeta(model="m", hardware="h", dtype="float32", world_size=1, seq_group_edges=(10,))
    r = ProfileRow(0, 10, 1, 1, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 2)
    with pytest.raises(TableError, match=r"row seq_group \(1\) is outside the 1 seq_groups"):
        ProfileTable([ProfileRow(1, 10, 1, 1, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 2)], meta)
    with pytest.raises(TableError, match="disagree on num_layers"):
        ProfileTable([r, ProfileRow(0, 10, 2, 1, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 3)], meta)


def test_parquet_without_metadata(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a": [1]}), str(path))
    with pytest.raises(TableError, match="has no dcp metadata"):
        ProfileTable.load(path)


def test_parquet_wrong_version(table, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    table.save(path)
    tbl = pq.read_table(str(path))
    meta = json.loads(tbl.schema.metadata[b"dcp_meta"])
    meta["format_version"] = 0
    pq.write_table(tbl.replace_schema_metadata({b"dcp_meta": json.dumps(meta).encode()}), str(path))
    with pytest.raises(TableError, match=r"format_version \(0\)"):
        ProfileTable.load(path)


def test_parquet_without_pyarrow_names_the_extra(table, tmp_path, monkeypatch):
    # pyarrow is an extra (dcp[parquet]): without it a .parquet path is one clear line, a .csv still works
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "old.parquet").write_bytes(b"PAR1")
    for call in (lambda: table.save(tmp_path / "t.parquet"), lambda: ProfileTable.load(tmp_path / "old.parquet")):
        with pytest.raises(TableError, match=r"needs pyarrow \(not installed\): pip install 'dcp\[parquet\]'"):
            call()
    table.save(tmp_path / "t.csv")
    assert ProfileTable.load(tmp_path / "t.csv") == table
