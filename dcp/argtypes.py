"""argparse value types shared by the ``dcp`` subcommands: a bad value is one clear line and exit 2.

``parser.add_argument("--nproc", type=positive_int)`` makes ``--nproc 0`` print
``dcp profile: error: argument --nproc: invalid positive_int value: '0'`` ... with the rule and a fix (argparse
calls the function and turns its ArgumentTypeError into that line). Only the standard library: the CLI
imports this at start-up.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from dcp.config import MAX_TOKENS

_INT = re.compile(r"[+-]?[0-9]+")


def _int(text: str) -> int:
    s = text.strip()
    if not _INT.fullmatch(s):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (ASCII digits): e.g. 2")
    value = int(s)
    if abs(value) > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r} is beyond {MAX_TOKENS}: use a realistic value")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts: processes, samples, GPUs, world sizes)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1: zero or negative counts are not defaults")
    return value


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (capacities, timeouts)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: e.g. 0.5") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0: e.g. 0.5")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1, e.g. ``256,512,1024``."""
    parts = [p for p in text.split(",")]
    if not parts or any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} must be integers separated by commas: e.g. 256,512")
    return tuple(positive_int(p) for p in parts)


def check_output_file(path: str, flag: str) -> Path:
    """An output file path whose folder exists and which is not a folder (raises ValueError naming ``flag``):
    checked before long work, so a typo does not cost a profile."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} ({path!r}) is a directory: pass a file path, e.g. {p / 'table.csv'}")
    if not p.parent.is_dir():
        raise ValueError(f"{flag} ({path!r}): folder {str(p.parent)!r} does not exist: create it first")
    return p


def int_list(text: str, flag: str) -> list[int]:
    """Positive integers separated by commas (a flag read inside run()); ValueError names the flag."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} ({text!r}) must be integers separated by commas: e.g. 1,2") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{flag} ({text!r}) must list positive integers: e.g. 1,2")
    return vals


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows every option's default: appended as "(default: X)" unless the help text already names
    its default (e.g. "default: the sweep's value") or there is nothing to show (flags, options without one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.nargs == 0 or action.default is argparse.SUPPRESS:
            return text
        if action.default is None:
            # "override sweep.steps" and the like: unset means the config's or the sweep file's value
            return text + " (default: the configured value)" if "overrid" in text else text
        return text + " (default: %(default)s)"
