"""A user's own sample lengths from a CSV file.

Transformer-1D: a column ``tokens`` (or no header and one token count per line). Transformer-2D: columns ``frames`` and ``spatial_tokens`` (a ``tokens``
column may be present too and must then equal frames * spatial_tokens). Other columns are ignored; blank
lines and lines starting with ``#`` are skipped. Errors name the file, the line, the value, the rule and a fix.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from dcp.config import MAX_TOKENS, read_text_file
from dcp.data_dists.spec import DistributionError
from dcp.files import write_with

_ASCII_INT = re.compile(r"\+?[0-9]+")
# a first line that is a number of any spelling (1_000, 5.7, nan, non-ASCII digits) means "no header"
_NUMBER_LIKE = re.compile(r"[+-]?[\d_.]+([eE][+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE)


class LengthsFileError(DistributionError):
    """A lengths CSV file breaks a rule; the message names file, line, value, rule and fix."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Lengths:
    """Sample lengths read from a file or drawn from a distribution."""

    tokens: tuple[int, ...]
    """Total tokens of every sample (frames * spatial_tokens for 2d)."""
    shapes: tuple[tuple[int, int], ...] | None = None
    """2d only: (frames, spatial_tokens) of every sample; None for 1d."""

    @property
    def dims(self) -> str:
        return "1d" if self.shapes is None else "2d"


def _parse_int(path: Path, line: int, column: str, value: str) -> int:
    text = value.strip()
    if text.startswith("-") and _ASCII_INT.fullmatch(text[1:]):
        raise LengthsFileError(f"{path}:{line}: column {column} value {text} must be >= 1: drop empty samples")
    if not _ASCII_INT.fullmatch(text):
        raise LengthsFileError(
            f"{path}:{line}: column {column} value {value!r} is not an integer (ASCII digits only, no '_', '.', "
            "exponent or NaN): write a whole number of tokens"
        )
    v = int(text)
    if v < 1:
        raise LengthsFileError(f"{path}:{line}: column {column} value {v} must be >= 1: drop empty samples")
    if v > MAX_TOKENS:
        raise LengthsFileError(f"{path}:{line}: column {column} value {text} is beyond {MAX_TOKENS} tokens: "
                               "check the units of the column")
    return v


def load_lengths_csv(path: str | Path) -> Lengths:
    """Read sample lengths; raises LengthsFileError (a ValueError) on any malformed content."""
    path = Path(path)
    text = read_text_file(path, what="lengths file", error=LengthsFileError,
                          missing_fix="pass the path of a CSV with a 'tokens' column")
    numbered = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.startswith("#")]
    if not numbered:
        raise LengthsFileError(f"{path}: file is empty: write a header line 'tokens' and one length per line")
    header_line, header = numbered[0]
    if _NUMBER_LIKE.fullmatch(header.strip()):  # headerless: one token count per line (as `dcp plan` accepts)
        return Lengths(tokens=tuple(_parse_int(path, n, "tokens", ln) for n, ln in numbered))
    columns = [c.strip() for c in next(csv.reader([header]))]
    has_tokens = "tokens" in columns
    has_2d = "frames" in columns and "spatial_tokens" in columns
    if not has_tokens and not has_2d:
        raise LengthsFileError(
            f"{path}:{header_line}: header {columns} has neither 'tokens' nor 'frames' and 'spatial_tokens': "
            "name the length column 'tokens' (1d) or give 'frames' and 'spatial_tokens' (2d)"
        )
    if len(set(columns)) != len(columns):
        raise LengthsFileError(f"{path}:{header_line}: header {columns} repeats a column name: make names unique")
    tokens: list[int] = []
    shapes: list[tuple[int, int]] = []
    for line, row in zip((n for n, _ in numbered[1:]), csv.reader(ln for _, ln in numbered[1:]), strict=True):
        if len(row) != len(columns):
            raise LengthsFileError(
                f"{path}:{line}: row {row} has {len(row)} fields, the header has {len(columns)}: "
                "give every row one value per header column"
            )
        rec = dict(zip(columns, row, strict=True))
        if has_2d:
            f = _parse_int(path, line, "frames", rec["frames"])
            s = _parse_int(path, line, "spatial_tokens", rec["spatial_tokens"])
            if has_tokens and _parse_int(path, line, "tokens", rec["tokens"]) != f * s:
                raise LengthsFileError(
                    f"{path}:{line}: column tokens value {rec['tokens'].strip()} != frames * spatial_tokens "
                    f"({f} * {s} = {f * s}): fix the row or drop the tokens column"
                )
            shapes.append((f, s))
            tokens.append(f * s)
        else:
            tokens.append(_parse_int(path, line, "tokens", rec["tokens"]))
    if not tokens:
        raise LengthsFileError(f"{path}: file has a header but no rows: add one sample length per line")
    return Lengths(tokens=tuple(tokens), shapes=tuple(shapes) if has_2d else None)


def write_lengths_csv(path: str | Path, lengths: Lengths) -> None:
    """Write lengths in the format load_lengths_csv reads (2d files keep frames and spatial_tokens), atomically
    (``dcp.files.write_with``: a cut run leaves no half-written file)."""
    write_with(path, lambda tmp: _write_csv(tmp, lengths))


def _write_csv(path: Path, lengths: Lengths) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        if lengths.shapes is None:
            w.writerow(["tokens"])
            w.writerows([t] for t in lengths.tokens)
        else:
            w.writerow(["frames", "spatial_tokens", "tokens"])
            w.writerows([f, s, f * s] for f, s in lengths.shapes)
