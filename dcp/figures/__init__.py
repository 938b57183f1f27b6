"""``dcp figures --out DIR``: regenerate every paper figure (PNG + CSV) from the simulator and stored results.

Figures: fig4 (imbalance of bucket parallel over 140 datasets), fig5 (all-to-all overhead), fig8 (throughput
and imbalance, 2 models x 3 datasets x 4 methods, 32 GPUs), fig9 (weak scaling 8..1024 GPUs), fig10
(DCP-intra over DCP-inter by length). ``--quick`` uses small sample counts (seconds; for tests). Library
code: ``from dcp.figures import make_figures``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

FIGURES = {
    "fig4": "dcp.figures.fig4_imbalance",
    "fig5": "dcp.figures.fig5_alltoall",
    "fig8": "dcp.figures.fig8_throughput",
    "fig9": "dcp.figures.fig9_scaling",
    "fig10": "dcp.figures.fig10_intra_speedup",
}


class FiguresError(ValueError):
    """An unknown figure name or unusable output folder."""


def make_figures(out_dir: str | Path, *, names: list[str] | None = None, quick: bool = False) -> list[Path]:
    """Build the named figures (default: all) into ``out_dir``; returns the written PNG and CSV paths."""
    from dcp.figures.common import FULL, QUICK, progress

    names = names or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise FiguresError(f"figure ({unknown[0]!r}) is not known: pick from {list(FIGURES)}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FiguresError(f"--out ({str(out)!r}) is a file: pass a folder")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for n in names:
        t0 = time.perf_counter()
        written += importlib.import_module(FIGURES[n]).make(out, QUICK if quick else FULL)
        progress(f"{n} done in {time.perf_counter() - t0:.1f}s")
    return written


def main_for(name: str, argv: list[str] | None = None) -> int:
    """Entry point of one ``paper_figures/<figure>.py`` script: ``--out DIR`` and ``--quick`` as for all figures."""
    parser = argparse.ArgumentParser(description=f"regenerate paper figure {name} (PNG + CSV)")
    parser.add_argument("--out", default="paper_figures/out", help="output folder")
    parser.add_argument("--quick", action="store_true", help="small sample counts")
    args = parser.parse_args(argv)
    return run(argparse.Namespace(out=args.out, only=[name], quick=args.quick, json=False))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="paper_figures/out", help="output folder for the PNG and CSV files")
    parser.add_argument("--only", nargs="*", choices=list(FIGURES), help="build only these figures")
    parser.add_argument("--quick", action="store_true", help="small sample counts (seconds, for smoke tests)")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        written = make_figures(args.out, names=args.only, quick=args.quick)
    except (ValueError, OSError) as exc:
        print(f"dcp figures: {exc}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    wall = time.perf_counter() - t0
    print(f"{len(written)} files in {args.out} ({wall:.1f}s)")
    if args.json:
        print(json.dumps({"files": [str(p) for p in written], "wall_s": wall}))
    return 0
