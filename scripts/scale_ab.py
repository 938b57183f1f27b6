"""``dcp bench scale`` of two source trees, interleaved A B A B, with medians: how the 4096-rank host figures are
compared on a noisy shared host (one run of the same code reads ~2.0-3.3 ms at W 4096 rank 2048 within minutes).

    python scripts/scale_ab.py TREE_A TREE_B [--pairs 8] [--keys host_ms_per_step,plan_cpu_ms_per_step] \
        [-- bench scale arguments; default: --world-sizes 4096 --ranks 2048 --steps 10 --mb-ms 0]

Each tree is a checkout or a ``git archive`` of one commit (``git archive REV | tar -x -C DIR``); each run is
``python -m dcp.cli bench scale ... --json`` with ``PYTHONPATH`` set to the tree, under this interpreter. Prints
one line per run as it ends, then each key's median, min and max per tree and in how many pairs B was lower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

DEFAULT_BENCH = ["--world-sizes", "4096", "--ranks", "2048", "--steps", "10", "--mb-ms", "0"]


def run(tree: str, bench: list[str]) -> dict:
    """The first row of the bench's JSON line for ``tree`` (the first rank's when several were asked)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, "-m", "dcp.cli", "bench", "scale", *bench, "--json"], cwd=tree, env=env,
                         capture_output=True, text=True, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        sys.exit(f"scale_ab: dcp bench scale failed in {tree} (exit {out.returncode}): {out.stderr.strip()[-800:]}")
    return json.loads(lines[-1])["rows"][0]


def main() -> None:
    argv = sys.argv[1:]
    bench = DEFAULT_BENCH
    if "--" in argv:
        cut = argv.index("--")
        argv, bench = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree_a")
    parser.add_argument("tree_b")
    parser.add_argument("--pairs", type=int, default=8, help="A B pairs to run (default 8)")
    parser.add_argument("--keys", default="host_ms_per_step,plan_cpu_ms_per_step,plan_exposed_ms",
                        help="comma-separated JSON keys to print and summarise")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs ({args.pairs}) must be >= 1")
    for tree in (args.tree_a, args.tree_b):
        if not os.path.isfile(os.path.join(tree, "dcp", "cli.py")):
            parser.error(f"{tree} holds no dcp/cli.py: give a checkout or a git archive of this repository")
    keys = args.keys.split(",")
    got: dict[str, list[dict]] = {"A": [], "B": []}
    for i in range(args.pairs):
        for name, tree in (("A", args.tree_a), ("B", args.tree_b)):
            row = run(tree, bench)
            missing = [k for k in keys if k not in row]
            if missing:
                sys.exit(f"scale_ab: {tree}'s bench rows have no {missing}: pick --keys from {sorted(row)}")
            got[name].append(row)
            print(f"pair {i + 1} {name} " + " ".join(f"{k} {row[k]}" for k in keys), flush=True)
    for k in keys:
        a, b = ([r[k] for r in got[n]] for n in ("A", "B"))
        lower = sum(y < x for x, y in zip(a, b, strict=True))
        print(f"{k}: A median {statistics.median(a):.4g} [{min(a)}-{max(a)}], B median {statistics.median(b):.4g} "
              f"[{min(b)}-{max(b)}]; B lower in {lower}/{len(a)} pairs")


if __name__ == "__main__":
    main()
