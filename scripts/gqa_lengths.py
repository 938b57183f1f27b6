"""Write the lengths of docs/context_parallel.md's figure: 3,920 lognormal lengths (median 8,192 tokens, sigma
1.0, at least 128, at most 131,072), 80 log-uniform in 131,072-1,048,576 and one of 1,048,576 (4,001), seeded.

    python scripts/gqa_lengths.py lengths.csv [--seed 0]

With ``--log-uniform N``: N lengths log-uniform in 1,024-131,072 tokens instead (docs/engines.md's figures of
the sharded engines: N = 1000 for the 8B shape, 4000 for the 70B one).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dcp.data_dists import Lengths, write_lengths_csv


def lengths(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    body = np.clip(np.exp(rng.normal(np.log(8192), 1.0, 3920)), 128, 131072)
    tail = np.exp(rng.uniform(np.log(131072), np.log(1048576), 80))
    return np.concatenate([body, tail, [1048576]]).astype(np.int64)


def log_uniform(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.exp(rng.uniform(np.log(1024), np.log(131072), n)).astype(np.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="CSV to write (a 'tokens' column); an existing file is refused")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-uniform", type=int, default=0, metavar="N",
                    help="N lengths log-uniform in 1,024-131,072 tokens (0: the long-context mix)")
    args = ap.parse_args(argv)
    if args.log_uniform < 0:
        ap.error(f"--log-uniform ({args.log_uniform}) must be >= 0: pass a sample count, or 0 for the default mix")
    if Path(args.out).exists():
        ap.error(f"{args.out} exists: pass a new path (this script never overwrites a file)")
    write_lengths_csv(args.out, Lengths(tokens=tuple(int(n) for n in (
        log_uniform(args.log_uniform, args.seed) if args.log_uniform else lengths(args.seed)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
