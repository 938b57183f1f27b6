"""Output files that are never lost or half-written, in folders dcp owns.

- :func:`write_text` / :func:`write_bytes`: a temporary file in the same folder, flushed and fsynced, then
  ``os.replace`` (atomic on POSIX): a reader sees the old file or the new one, never a torn one, also when
  the disk fills or the process is killed mid-write; a failed write leaves the old file and no temporary.
- :func:`append_csv`: appends rows by writing the whole file again atomically (result files are small), after
  checking that the existing file is complete and has the same columns.
- :func:`claim_dir`: an ``--out`` folder is written only when it is new, empty, or marked by dcp (a
  ``.dcp-output`` file dcp writes into every folder it makes); a folder holding a user's own files is refused
  with one line before any work starts, and so is a folder that cannot be written.
- :func:`check_writable_file`: the folder of an output file accepts a new file, checked before long work.
- :func:`read_json` / :func:`read_csv_text`: readers that name the file and say when it is empty or truncated
  (a full disk, a killed writer of an older dcp) and how to fix it, instead of a parser's message.

Only the standard library: the CLI, the profiler cache, the experiments and the demo import this.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

MARKER = ".dcp-output"
"""File dcp writes into every output folder it makes (JSON: which command, and command-specific state)."""


class OutputError(ValueError):
    """An output path cannot be used (not writable, holds files dcp did not write); names flag, path and fix."""


class TruncatedFileError(ValueError):
    """A result file is empty or ends mid-record (a full disk or a killed writer); names the file and the fix."""


def write_bytes(path: str | Path, data: bytes, *, fsync: bool = True, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file + ``os.replace``); returns the path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600 files; results and caches are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)
    return path


def write_text(path: str | Path, text: str, *, fsync: bool = True) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically; see :func:`write_bytes`."""
    return write_bytes(path, text.encode("utf-8"), fsync=fsync)


def write_with(path: str | Path, writer: Callable[[Path], Any]) -> Path:
    """Atomically produce ``path`` with a writer that takes a file path (``savefig``, a parquet writer): it
    writes a temporary path in the same folder, which then replaces ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable: fsync the folder (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----- readers that name the file ------------------------------------------------------------------
def _fix(fix: str) -> str:
    return fix or "delete it and run the command that wrote it again"


def _read_text(p: Path, what: str, fix: str, error: type[ValueError]) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{what} ({str(p)!r}) cannot be read ({getattr(exc, 'strerror', None) or exc}): "
                    f"{_fix(fix)}") from None


def read_json(path: str | Path, *, what: str, fix: str = "", error: type[ValueError] = TruncatedFileError) -> Any:
    """Parse a JSON file; an empty, truncated or malformed file raises ``error`` naming it and the fix."""
    p = Path(path)
    text = _read_text(p, what, fix, error)
    if not text.strip():
        raise error(f"{what} ({str(p)!r}) is empty (0 bytes of JSON: a full disk or a killed writer): {_fix(fix)}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # the parser ran out of text: at the end, or inside a string that never closes
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        kind = "is truncated (it ends mid-document: a full disk or a killed writer)" if cut else \
            f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        raise error(f"{what} ({str(p)!r}) {kind}: {_fix(fix)}") from None


def read_csv_text(path: str | Path, *, what: str, fix: str = "", error: type[ValueError] = TruncatedFileError) -> str:
    """A CSV file's text; an empty file, or one whose last line has no line end (cut mid-row), raises
    ``error`` naming it and the fix."""
    p = Path(path)
    text = _read_text(p, what, fix, error)
    if not text:
        raise error(f"{what} ({str(p)!r}) is empty (0 bytes: a full disk or a killed writer): {_fix(fix)}")
    if not text.endswith("\n"):
        line = text.count("\n") + 1
        raise error(f"{what} ({str(p)!r}) is truncated: line {line} ends mid-row (a full disk or a killed writer): "
                    f"{_fix(fix)}")
    return text


def append_csv(path: str | Path, columns: Sequence[str], rows: Iterable[dict[str, Any]], *,
               fmt: Callable[[Any], Any] = lambda v: v, error: type[ValueError] = OutputError) -> Path:
    """Append ``rows`` (dicts holding every column) to the CSV at ``path``, rewriting it atomically; a new file
    gets the header. An existing file must be complete and have ``columns`` (``error`` otherwise)."""
    import csv
    import io

    path = Path(path)
    rows = list(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="raise")
    if path.exists() and path.stat().st_size > 0:
        old = read_csv_text(path, what="results file", error=error,
                            fix="delete its last, cut line (or the file) and run again")
        header = next(csv.reader(io.StringIO(old)), [])
        if tuple(header) != tuple(columns):
            raise error(f"{path} has columns {header}, not {list(columns)}: write to a new --out folder or move the "
                        "old file")
        buf.write(old)
    else:
        w.writeheader()
    for row in rows:
        missing = [c for c in columns if c not in row]
        if missing:
            raise error(f"row for {path.name} lacks columns {missing}: the writer must fill every column")
        w.writerow({c: fmt(row[c]) for c in columns})
    return write_text(path, buf.getvalue())


# ----- output folders ------------------------------------------------------------------------------
def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """The marker of a folder dcp made (its JSON), None when there is none; a damaged marker reads as {}."""
    p = Path(folder) / MARKER
    if not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_marker(folder: str | Path, doc: dict[str, Any]) -> Path:
    """Write (atomically) the marker of a folder dcp owns, with command-specific state in ``doc``."""
    return write_text(Path(folder) / MARKER, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def holds_only(folder: Path, names: Iterable[str], headers: dict[str, Sequence[str]], config_name: str,
               config_ok: Callable[[Any], bool]) -> bool:
    """True when ``folder`` holds only files named in ``names``, each CSV of ``headers`` has that header row, and
    ``config_name`` (when present) is JSON that ``config_ok`` accepts: the check by content that recognises an
    output folder of a dcp that did not mark its folders (``claim_dir``'s ``adopt``)."""
    import csv

    present = {e.name for e in folder.iterdir()}
    if not present <= set(names):
        return False
    for name, columns in headers.items():
        if name in present:
            with (folder / name).open(newline="", errors="replace") as f:
                if tuple(next(csv.reader(f), [])) != tuple(columns):
                    return False
    if config_name in present:
        try:
            doc = json.loads((folder / config_name).read_text(errors="replace"))
        except json.JSONDecodeError:
            return False
        return bool(config_ok(doc))
    return True


def claim_dir(folder: str | Path, *, flag: str, command: str,
              adopt: Callable[[Path], bool] | None = None) -> dict[str, Any]:
    """Make ``folder`` an output folder of ``command`` before any work: it is created if missing and must be
    writable; an existing non-empty folder must carry dcp's marker (or be recognised by ``adopt``, e.g. a
    results folder of an older dcp, whose files ``adopt`` checks by content). Returns the folder's marker (its
    state, {} for a new folder). Raises OutputError naming ``flag``, the folder, the rule and the fix."""
    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} ({str(p)!r}) is a file: pass a folder (dcp writes several files into it)")
    marker = read_marker(p) if p.is_dir() else None
    if marker is None and p.is_dir():
        entries = sorted(e.name for e in p.iterdir())
        if entries and not (adopt is not None and adopt(p)):
            shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
            raise OutputError(f"{flag} ({str(p)!r}) is a non-empty folder that dcp did not make (it holds {shown}): "
                              f"dcp never writes over files it did not write; pass a new or empty folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        doc = {**(marker or {}), "made_by": (marker or {}).get("made_by", command)}
        write_marker(p, doc)
    except OSError as exc:
        raise OutputError(f"{flag} ({str(p)!r}) is not writable ({exc.strerror or exc}): pass a folder you can "
                          "write, checked before any work starts") from None
    return marker or {}


def check_writable_file(path: str | Path, *, flag: str) -> Path:
    """An output file path whose folder exists and accepts a new file (a temporary file is made and removed),
    and which is not a folder or a read-only file: checked before long work, so nothing is computed and lost."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} ({str(p)!r}) is a directory: pass a file path, e.g. {p / 'table.csv'}")
    if not p.parent.is_dir():
        raise OutputError(f"{flag} ({str(p)!r}): folder {str(p.parent)!r} does not exist: create it first")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{flag} ({str(p)!r}) exists and is read-only: pass another path or make it writable")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=p.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise OutputError(f"{flag} ({str(p)!r}): folder {str(p.parent)!r} is not writable "
                          f"({exc.strerror or exc}): pass a path in a folder you can write") from None
    return p
