"""``dcp figures``: regenerate every paper figure (PNG + CSV) from the simulator and stored results.

Figures: fig4 (imbalance of bucket parallel over 140 datasets), fig5 (all-to-all overhead), fig8 (throughput
and imbalance, 2 models x 3 datasets x 4 methods, 32 GPUs), fig9 (weak scaling 8..4096 GPUs, control plane
charged), fig10 (DCP-intra over DCP-inter by length). ``--quick`` uses small sample counts (seconds; for
tests). Library code: ``from dcp.figures import make_figures``.

Output: ``runs/figures`` by default (git-ignored), so trying the command never changes the checkout. The
committed figures in ``paper_figures/out`` are refreshed only on purpose, with ``--update-committed`` (or
``bash paper_figures/make_all.sh``); they are deterministic (seeded simulations, no wall-clock columns), so
a refresh of unchanged code changes nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from pathlib import Path

from dcp.files import claim_dir

DEFAULT_OUT = "runs/figures"
"""Where ``dcp figures`` writes unless told otherwise (git-ignored)."""
COMMITTED_OUT = "paper_figures/out"
"""The committed figures, written only with ``--update-committed``."""

FIGURES = {
    "fig4": "dcp.figures.fig4_imbalance",
    "fig5": "dcp.figures.fig5_alltoall",
    "fig8": "dcp.figures.fig8_throughput",
    "fig9": "dcp.figures.fig9_scaling",
    "fig10": "dcp.figures.fig10_intra_speedup",
}


class FiguresError(ValueError):
    """An unknown figure name or unusable output folder."""


def make_figures(out_dir: str | Path, *, names: list[str] | None = None, quick: bool = False,
                 progress: bool = True) -> list[Path]:
    """Build the named figures (default: all) into ``out_dir``; returns the written PNG and CSV paths.

    A progress bar (one step per figure, with an ETA) goes to stderr; ``progress=False`` silences it."""
    from tqdm.auto import tqdm

    from dcp.figures.common import FULL, QUICK

    names = names or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise FiguresError(f"figure ({unknown[0]!r}) is not known: pick from {list(FIGURES)}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FiguresError(f"--out ({str(out)!r}) is a file: pass a folder")
    # a new, empty or dcp-made folder (or one of figures only, e.g. paper_figures/out), writable: checked before
    # the figures are computed, and a folder of the user's own files is never written into
    claim_dir(out, flag="--out", command="dcp figures", adopt=_only_figures)
    written: list[Path] = []
    with tqdm(total=len(names), desc="figures", unit="figure", disable=not progress, file=sys.stderr) as bar:
        for n in names:
            bar.set_postfix_str(n)
            written += importlib.import_module(FIGURES[n]).make(out, QUICK if quick else FULL)
            bar.update()
    return written


def _only_figures(folder: Path) -> bool:
    """True when ``folder`` holds only figure files (fig<N>_<name>.png / .csv) of an unmarked older run."""
    return all(re.fullmatch(r"fig[0-9]+_[a-z0-9_]+\.(png|csv)", e.name) for e in folder.iterdir())


def output_dir(out: str | None, update_committed: bool) -> str:
    """The folder to write: --out if given, the committed folder with --update-committed, else runs/figures."""
    if out and update_committed and Path(out) != Path(COMMITTED_OUT):
        raise FiguresError(f"--out ({out!r}) and --update-committed disagree: --update-committed writes "
                           f"{COMMITTED_OUT}; drop one of them")
    if update_committed:
        return COMMITTED_OUT
    return out or DEFAULT_OUT


def main_for(name: str, argv: list[str] | None = None) -> int:
    """Entry point of one ``paper_figures/<figure>.py`` script: ``--out DIR`` and ``--quick`` as for all figures."""
    from dcp.argtypes import HelpFormatter

    parser = argparse.ArgumentParser(description=f"regenerate paper figure {name} (PNG + CSV)",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--update-committed", action="store_true", help=f"write the committed {COMMITTED_OUT}")
    parser.add_argument("--quick", action="store_true", help="small sample counts")
    args = parser.parse_args(argv)
    return run(argparse.Namespace(out=args.out, update_committed=args.update_committed, only=[name],
                                  quick=args.quick, json=False))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help=f"output folder for the PNG and CSV files (default {DEFAULT_OUT}, git-ignored)")
    parser.add_argument("--update-committed", action="store_true",
                        help=f"refresh the committed figures in {COMMITTED_OUT} (full sizes only)")
    parser.add_argument("--only", nargs="*", choices=list(FIGURES), help="build only these figures (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sample counts (seconds, for smoke tests)")
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    try:
        out = output_dir(args.out, args.update_committed)
        if args.update_committed and args.quick:
            raise FiguresError("--update-committed with --quick would commit quick-size figures: drop --quick")
        written = make_figures(out, names=args.only, quick=args.quick)
    except (ValueError, OSError) as exc:
        print(f"dcp figures: {exc}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    wall = time.perf_counter() - t0
    print(f"{len(written)} files in {out} ({wall:.1f}s)")
    if args.json:
        print(json.dumps({"files": [str(p) for p in written], "wall_s": wall}))
    return 0
