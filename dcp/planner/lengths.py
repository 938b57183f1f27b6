"""Sample-length inputs of the planner CLI and benchmark: length files and seeded synthetic streams."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


class LengthsFileError(ValueError):
    """A lengths file is missing or malformed; the message names the file, line, value and fix."""


_FIX = "write a CSV with a 'tokens' column (one row per sample) or one positive integer per line"


def read_lengths(path: str | Path) -> list[int]:
    """Token count of every sample id, from a CSV with a ``tokens`` column or one integer per line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise LengthsFileError(
            f"lengths file ({str(path)!r}) does not exist: pass an existing file; {_FIX}"
        ) from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise LengthsFileError(f"lengths file ({str(path)!r}) is not a text file ({exc}): {_FIX}") from None
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        raise LengthsFileError(f"lengths file ({str(path)!r}) is empty: {_FIX}")
    if _is_int(lines[first].strip()):
        values = [(i + 1, ln.strip()) for i, ln in enumerate(lines) if ln.strip()]
    else:
        reader = csv.DictReader(lines[first:])
        if reader.fieldnames is None or "tokens" not in [f.strip() for f in reader.fieldnames]:
            raise LengthsFileError(
                f"lengths file ({str(path)!r}) line {first + 1}: header {lines[first]!r} has no 'tokens' column: {_FIX}"
            )
        key = next(f for f in reader.fieldnames if f.strip() == "tokens")
        values = [(first + 2 + i, (rec.get(key) or "").strip()) for i, rec in enumerate(reader)]
    out = []
    for line_no, raw in values:
        if not _is_int(raw) or int(raw) < 1:
            raise LengthsFileError(
                f"lengths file ({str(path)!r}) line {line_no}: value {raw!r} is not a positive integer token count: {_FIX}"
            )
        out.append(int(raw))
    if not out:
        raise LengthsFileError(f"lengths file ({str(path)!r}) has a header but no rows: {_FIX}")
    return out


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def synthetic_lengths(n: int, max_len: int, seed: int = 0, *, min_len: int = 16) -> np.ndarray:
    """n seeded lengths in [min_len, max_len], log-uniform (many short, few long: a mixed long-context set)."""
    if n < 1 or max_len < 1:
        raise ValueError(f"n ({n}) and max_len ({max_len}) must be >= 1: ask for at least one sample")
    lo = min(min_len, max_len)
    rng = np.random.default_rng([int(seed), 7919])
    x = np.exp(rng.uniform(np.log(lo), np.log(max_len), size=n))
    return np.clip(np.round(x), lo, max_len).astype(np.int64)
