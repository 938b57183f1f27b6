"""The shape of every configuration check: the ConfigError, the one-line message ``path (value) rule: fix``,
strict reading of text and TOML files, and the type and range check of a config dataclass's fields.

Below ``dcp.config`` (which holds the sections themselves) so both it and the modules that validate their own
arguments share one message shape; stdlib only.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import re
import tomllib
from pathlib import Path
from typing import Any

MAX_TOKENS = 2**40
"""Largest token count (a sample length or a seq_group bound) dcp accepts anywhere, and the bound of every
integer setting: far above any real value, small enough that sums and products stay exact in int64."""

class ConfigError(ValueError):
    """A configuration value breaks a rule; the message says which and how to fix it."""


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB for a message: three decimals, or three significant digits below 1 GiB (a tiny capacity
    printed as 0.000)."""
    x = nbytes / 2**30
    return f"{x:,.3f} GiB" if x >= 1 else f"{x:.3g} GiB"


UNIT_SPELLINGS = {"gib": ("gib", "gb", "g"), "mib": ("mib", "mb", "m"), "ms": ("ms",), "s": ("s", "sec")}
"""A key's unit (the last part of its name) and the ways a value may spell it after the number."""


def type_fix(value: Any, type_name: str, key: str) -> str:
    """The fix for ``value`` of the wrong type under ``key``: "write a <type> value", or for a number written as
    text ("80", "80GB" for a ``_gib`` key) the number, unquoted: only when the text is a number the key's type
    takes, bare or followed by the key's own unit."""
    match = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value) if isinstance(value, str) else None
    if (match is None or type_name not in ("int", "float") or (type_name == "int" and "." in match[1])
            or (match[2] and match[2].lower() not in UNIT_SPELLINGS.get(key.rsplit("_", 1)[-1], ()))):
        return f"write {_article(type_name)} {type_name} value"
    return f"write {match[1]}, {_article(type_name)} {type_name} without quotes or units (the key's name gives the unit)"


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def fail(path: str, value: Any, rule: str, fix: str, *, error: type[ValueError] = ConfigError) -> None:
    """Raise ``error`` with the project's message shape ``path (value) rule: fix`` (every module's config
    and argument errors go through here, each with its own ValueError subclass)."""
    raise error(f"{path} ({value!r}) {rule}: {fix}")


def did_you_mean(name: str, valid: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the entry of ``valid`` closest to a misspelt ``name``; "" when none is close
    (or ``name`` is not a string: a dict built in Python may hold any key, which difflib cannot compare)."""
    if not isinstance(name, str):
        return ""
    match = difflib.get_close_matches(name, valid, n=1)
    return f"; did you mean {match[0]!r}?" if match else ""


def read_text_file(
    path: str | Path, *, what: str, missing_fix: str = "check the path", error: type[ValueError] = ConfigError
) -> str:
    """A UTF-8 text file (a leading BOM is dropped); a missing file, a directory, an unreadable file or
    non-UTF-8 content raises ``error`` naming the file (and the line of the first bad byte)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} ({str(p)!r}) does not exist: {missing_fix}") from None
    except IsADirectoryError:
        raise error(f"{what} ({str(p)!r}) is a directory: pass the path of a file") from None
    except OSError as exc:
        raise error(f"{what} ({str(p)!r}) cannot be read ({exc.strerror or exc}): check the path and its "
                    "permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{what} ({str(p)!r}) line {line} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                    "save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def read_toml(
    path: str | Path,
    *,
    what: str = "config file",
    missing_fix: str = "pass the path of a TOML file",
    error: type[ValueError] = ConfigError,
) -> dict[str, Any]:
    """Parse a TOML file; a missing or unreadable file or bad syntax raises ``error`` naming the file."""
    path = Path(path)
    text = read_text_file(path, what=what, missing_fix=missing_fix, error=error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        fix = ("the file is JSON: write it as TOML (the same sections as [tables] of key = value lines)"
               if path.suffix.lower() == ".json" or text.lstrip().startswith("{") else "fix the syntax")
        raise error(f"{what} ({str(path)!r}) is not valid TOML ({exc}): {fix}") from None


def check_fields(obj: Any, section: str, *, int_max: dict[str, int] | None = None) -> None:
    """Type and range of every field of a config dataclass, from its annotations: integers (not bools) in
    [-MAX_TOKENS, MAX_TOKENS] (or ``int_max[name]``), finite floats, strings, bools, tuples of integers
    (stored back as plain ints). Called first by every section's __post_init__, for TOML and Python alike."""
    for f in dataclasses.fields(obj):
        value, kind, path = getattr(obj, f.name), str(f.type), f"{section}.{f.name}"
        top = (int_max or {}).get(f.name, MAX_TOKENS)
        if kind.startswith("tuple[float"):
            items = tuple(value) if isinstance(value, list | tuple) else None
            if items is None or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                                        for v in items):
                fail(path, value, "must be a list of finite numbers", "e.g. [0.5, 2.0]")
            object.__setattr__(obj, f.name, tuple(float(v) for v in items))
        elif kind.startswith("tuple"):
            items = tuple(value) if isinstance(value, list | tuple) else None
            if items is None or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items):
                fail(path, value, "must be a list of integers", "e.g. [1, 2, 4]")
            if any(abs(int(v)) > top for v in items):
                fail(path, list(items), f"holds a value beyond {top}", "use realistic sizes")
            object.__setattr__(obj, f.name, tuple(int(v) for v in items))
        elif kind == "int":
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                fail(path, value, "must be an integer", f"write {f.name} = <whole number>")
            if abs(int(value)) > top:
                fail(path, value, f"is beyond {top}", "use a realistic value")
            object.__setattr__(obj, f.name, int(value))
        elif kind == "float":
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
                fail(path, value, "must be a finite number", f"write {f.name} = <number>, not inf or nan")
        elif kind == "str" and not isinstance(value, str):
            fail(path, value, "must be a string", f'write {f.name} = "..."')
        elif kind == "bool" and not isinstance(value, bool):
            fail(path, value, "must be true or false", f"write {f.name} = true or false")


def check_field_type(section: str, f: dataclasses.Field, value: Any) -> None:
    """A TOML value of a config field, checked against the field's annotation (one line naming it otherwise)."""
    expected = {"int": int, "float": (int, float), "str": str, "bool": bool}.get(str(f.type))
    if str(f.type).startswith("tuple[float"):
        if not isinstance(value, tuple) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{section}.{f.name} ({value!r}) must be a list of numbers: e.g. [0.5, 2.0]")
        return
    if str(f.type).startswith("tuple"):
        if not isinstance(value, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{section}.{f.name} ({value!r}) must be a list of integers: e.g. [1, 2, 4]")
        return
    if expected is None:
        return
    bad_bool = expected is not bool and isinstance(value, bool)
    if bad_bool or not isinstance(value, expected):
        raise ConfigError(f"{section}.{f.name} ({value!r}) must be of type {f.type}: {type_fix(value, str(f.type), f.name)}")
