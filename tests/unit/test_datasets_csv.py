"""A user's own lengths from CSV: both layouts, and every error names file, line, value, rule and fix."""

from __future__ import annotations

import pytest

from dcp.data_dists import Lengths, LengthsFileError, load_lengths_csv, write_lengths_csv


def _write(tmp_path, text, name="l.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_1d_tokens_column_with_extras_comments_and_blanks(tmp_path):
    p = _write(tmp_path, "# my data\nid,tokens\n0,1024\n\n1,77\n")
    got = load_lengths_csv(p)
    assert got.tokens == (1024, 77) and got.shapes is None and got.dims == "1d"


def test_headerless_one_count_per_line(tmp_path):
    assert load_lengths_csv(_write(tmp_path, "12\n\n300\n")).tokens == (12, 300)
    with pytest.raises(LengthsFileError, match="l.csv:2: column tokens value 'x'"):
        load_lengths_csv(_write(tmp_path, "12\nx\n"))


def test_2d_frames_and_spatial(tmp_path):
    p = _write(tmp_path, "frames,spatial_tokens\n16,144\n204,3600\n")
    got = load_lengths_csv(p)
    assert got.shapes == ((16, 144), (204, 3600)) and got.tokens == (2304, 734400) and got.dims == "2d"


def test_roundtrip(tmp_path):
    for lengths in (Lengths(tokens=(5, 9)), Lengths(tokens=(6, 20), shapes=((2, 3), (4, 5)))):
        p = tmp_path / "x.csv"
        write_lengths_csv(p, lengths)
        assert load_lengths_csv(p) == lengths


@pytest.mark.parametrize(
    "text,parts",
    [
        ("tokens\n12\nabc\n", ["l.csv:3", "tokens", "'abc'", "not an integer"]),
        ("tokens\n0\n", ["l.csv:2", "tokens", "0", ">= 1"]),
        ("tokens\n-5\n", ["l.csv:2", "-5", ">= 1"]),
        ("length\n12\n", ["l.csv:1", "neither 'tokens'", "name the length column"]),
        ("frames,spatial_tokens,tokens\n2,3,7\n", ["l.csv:2", "tokens value 7", "2 * 3 = 6"]),
        ("frames,spatial_tokens\n2,x\n", ["l.csv:2", "spatial_tokens", "'x'"]),
        ("tokens,id\n12\n", ["l.csv:2", "1 fields", "header has 2"]),
        ("tokens,tokens\n1,1\n", ["l.csv:1", "repeats"]),
        ("", ["l.csv", "empty"]),
        ("tokens\n", ["l.csv", "no rows"]),
    ],
)
def test_errors(tmp_path, text, parts):
    p = _write(tmp_path, text)
    with pytest.raises(LengthsFileError) as exc:
        load_lengths_csv(p)
    msg = str(exc.value)
    for part in parts:
        assert part in msg, (part, msg)
    assert ":" in msg.split(str(p))[-1]  # a fix follows the rule


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(LengthsFileError, match="does not exist"):
        load_lengths_csv(tmp_path / "none.csv")
    with pytest.raises(LengthsFileError, match="is a directory"):
        load_lengths_csv(tmp_path)


def test_error_is_a_value_error(tmp_path):
    with pytest.raises(ValueError):
        load_lengths_csv(_write(tmp_path, "tokens\nx\n"))
