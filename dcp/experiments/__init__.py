"""``dcp sweep``: real-run experiment sweeps (bucket, packed, DCP-inter, DCP-intra) and their plots.

    dcp sweep experiments/cpu_small.toml [--out DIR]          # W CPU processes per run group, gloo
    dcp sweep experiments/cpu_small.toml --update-committed   # refresh experiments/results/cpu_small
    dcp sweep experiments/gpu_paper.toml --launcher torchrun  # torchrun per node, NCCL
    dcp sweep --plot DIR                                      # rebuild plots from DIR/runs.csv only
    dcp sweep --plot experiments/results/cpu_small            # its plot into runs/plots/cpu_small/
    dcp sweep --plot experiments/results/cpu_small --update-committed   # the committed summary.png itself

Results: DIR/runs.csv, DIR/steps.csv, DIR/config.json (see dcp.experiments.results) and DIR/summary.png,
with the table printed at the end; DIR defaults to runs/sweeps/NAME (git-ignored). A sweep always leaves a
consistent set: the old summary.png is removed before the runs and rebuilt from runs.csv afterwards (also
after a failed group, from the groups that finished). Nothing heavy is imported here: the CLI imports this
module at start-up.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dcp.argtypes import nonneg_int, positive_int, positive_int_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="sweep definition (TOML), e.g. experiments/cpu_small.toml")
    parser.add_argument("--out", default=None, help="output folder (default: sweep.out_dir, else runs/sweeps/NAME)")
    parser.add_argument("--update-committed", action="store_true",
                        help="write the committed results folder experiments/results/NAME instead (with --plot: "
                             "redraw a committed folder's own summary.png)")
    parser.add_argument("--launcher", choices=("local", "torchrun"), default=None,
                        help="local: spawn CPU processes here; torchrun: run inside (or start) torchrun (default: sweep.launcher)")
    parser.add_argument("--steps", type=positive_int, default=None, help="override sweep.steps (measured steps per run)")
    parser.add_argument("--warmup-steps", type=nonneg_int, default=None, help="override sweep.warmup_steps")
    parser.add_argument("--world-sizes", type=positive_int_list, default=None, help="comma list overriding sweep.world_sizes, e.g. 2")
    parser.add_argument("--models", default=None, help="comma list overriding sweep.models")
    parser.add_argument("--datasets", default=None, help="comma list overriding sweep.datasets")
    parser.add_argument("--methods", default=None, help="comma list overriding sweep.methods")
    parser.add_argument("--refresh-profile", action="store_true",
                        help="profile every (model, W) again instead of using the cache (same conditions as the runs)")
    parser.add_argument("--nproc-per-node", type=nonneg_int, default=0,
                        help="torchrun launcher outside torchrun: ranks per node (default: visible GPUs)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their config hashes, run nothing")
    parser.add_argument("--print-config", action="store_true", help="print the resolved sweep as JSON and exit")
    parser.add_argument("--plot", metavar="RESULTS_DIR", default=None,
                        help="rebuild the plot and the table of RESULTS_DIR from its runs.csv and exit (a committed "
                             "folder's plot is drawn in runs/plots/NAME/ unless --update-committed)")


def overrides_from_args(args: argparse.Namespace) -> dict:
    """[sweep] keys replaced by command-line flags."""
    out: dict = {}
    if args.out:
        out["out_dir"] = args.out
    if args.launcher:
        out["launcher"] = args.launcher
    if args.steps is not None:
        out["steps"] = args.steps
    if getattr(args, "refresh_profile", False):
        out["refresh_profile"] = True
    if args.warmup_steps is not None:
        out["warmup_steps"] = args.warmup_steps
    if args.world_sizes:
        sizes = args.world_sizes
        out["world_sizes"] = list(positive_int_list(sizes) if isinstance(sizes, str) else sizes)
    for key in ("models", "datasets", "methods"):
        value = getattr(args, key)
        if value:
            out[key] = [x.strip() for x in value.split(",") if x.strip()]
    return out


def report(results_dir: str | Path, png_path: str | Path | None = None) -> Path:
    """Rebuild summary.png (default: in results_dir) from results_dir/runs.csv and print the table with its
    legend; returns the PNG."""
    from dcp.experiments.plot import TABLE_LEGEND, format_table, plot_results
    from dcp.experiments.results import read_runs

    png = plot_results(results_dir, png_path)
    print(format_table(read_runs(results_dir)))
    print(TABLE_LEGEND)
    print(f"plot: {png}")
    return png


def plot_target(results_dir: str | Path, update_committed: bool) -> Path | None:
    """Where ``--plot`` draws: beside the CSV (None), except for a committed results folder without
    ``--update-committed``, whose plot is redrawn in runs/plots/NAME/ (a committed file changes only on request; not
    runs/sweeps/NAME/, the default folder of the user's own sweep of that name, whose plot it would replace)."""
    from dcp.experiments.sweep import COMMITTED_RESULTS_ROOT

    folder = Path(results_dir).resolve()
    # the committed folder of the checkout this package runs from, and of the current directory's checkout
    roots = {(Path(__file__).resolve().parents[2] / COMMITTED_RESULTS_ROOT).resolve(),
             Path(COMMITTED_RESULTS_ROOT).resolve()}
    if update_committed or not any(folder.is_relative_to(root) for root in roots):
        return None
    return Path("runs") / "plots" / folder.name / "summary.png"


def run(args: argparse.Namespace) -> int:
    import json

    if args.plot:
        target = plot_target(args.plot, args.update_committed)
        try:
            report(args.plot, target)
        except ValueError as exc:  # ResultsError names the file and the fix
            print(f"dcp sweep --plot: error: {exc}", file=sys.stderr)
            return 2
        if target is not None:
            print(f"({args.plot} is committed: its own summary.png changes only with --plot ... --update-committed)")
        return 0
    if not args.spec:
        print("dcp sweep: error: pass a sweep file (e.g. experiments/cpu_small.toml) or --plot RESULTS_DIR",
              file=sys.stderr)
        return 2
    from dcp.experiments.sweep import COMMITTED_RESULTS_ROOT, load_sweep

    overrides = overrides_from_args(args)
    try:
        spec = load_sweep(args.spec, overrides=overrides)
        if getattr(args, "update_committed", False):
            if args.out:
                raise ValueError(f"--out ({args.out!r}) and --update-committed disagree: --update-committed writes "
                                 f"{COMMITTED_RESULTS_ROOT}/{spec.name}; drop one of them")
            overrides["out_dir"] = f"{COMMITTED_RESULTS_ROOT}/{spec.name}"  # torchrun children get it as --out
            spec = load_sweep(args.spec, overrides=overrides)
    except ValueError as exc:
        print(f"dcp sweep: error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(spec.to_dict(), indent=2, sort_keys=True))
        return 0
    for warning in spec.environment_warnings():
        print(f"dcp sweep: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        runs = spec.expand()
        for i, r in enumerate(runs):
            print(f"[{i + 1}/{len(runs)}] {r.label} config_hash={r.config_hash()}")
        print(f"{len(runs)} runs; results would go to {Path(spec.output_dir)}")
        return 0
    from dcp.distributed.launch import DistributedFailure
    from dcp.experiments.launch import claim_output, launch
    from dcp.experiments.plot import PLOT_NAME

    inside_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if not inside_torchrun or os.environ.get("RANK") == "0":
        try:
            claim_output(spec)  # before any work: a foreign or read-only folder is refused in one line
        except ValueError as exc:
            print(f"dcp sweep: error: {exc}", file=sys.stderr)
            return 2
        (spec.output_dir / PLOT_NAME).unlink(missing_ok=True)  # never leave a plot of older results beside new CSVs
    try:
        rc = launch(spec, spec_path=args.spec, nproc_per_node=args.nproc_per_node, cli_overrides=overrides)
    except DistributedFailure as exc:
        # the groups that finished before are already written; the failing rank's traceback follows
        detail = str(exc) if os.environ.get("DCP_TRACEBACK") else \
            f"{exc.summary()} (set DCP_TRACEBACK=1 for the ranks' tracebacks)"
        print(f"dcp sweep: error: a run failed (the finished runs' results are in {spec.output_dir}; the same command "
              f"resumes after them): {detail}", file=sys.stderr)
        rc = 1
    except KeyboardInterrupt:  # Ctrl-C: each finished run's row is already written; the next call resumes after them
        print(f"\ndcp sweep: interrupted: the finished runs' results are in {spec.output_dir}; the same command "
              "resumes after them", file=sys.stderr)
        rc = 130
    if (inside_torchrun and os.environ.get("RANK") != "0") or (not inside_torchrun and spec.launcher == "torchrun"):
        return rc  # other ranks write nothing; torchrun's rank 0 has already printed the report
    if (spec.output_dir / "runs.csv").exists():
        print()
        try:
            report(spec.output_dir)
        except ValueError as exc:
            print(f"dcp sweep: error: no plot: {exc}", file=sys.stderr)
            rc = rc or 1
    return rc
