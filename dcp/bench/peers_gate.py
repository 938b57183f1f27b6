"""``dcp bench peers --against FILE``: a planner change judged by plan quality, not by plan hashes.

FILE is an earlier ``dcp bench peers --json`` output (the whole output or its last line). Every cell of this run
that FILE also holds (same dataset, seed and method) is compared: the change of its ideal fraction in points, and
whether its steps stay within the batch's bounds (``planning.step_tokens_bounds``' default). The run fails (exit
1, one line per cell) when a cell loses more than GATE_POINTS of its ideal fraction or leaves the bounds it held.

    dcp bench peers --methods dcp-intra --seeds 0,1,2,3 --json > before.json    # on the code before the change
    dcp bench peers --methods dcp-intra --seeds 0,1,2,3 --against before.json    # after it
"""

from __future__ import annotations

import json
from pathlib import Path

GATE_POINTS = 1.0
"""The most a cell's ideal fraction may fall, in points (0.01 of the ideal bound): the planner's quality gate."""


class GateFileError(ValueError):
    """An ``--against`` file that cannot be read as ``dcp bench peers --json`` output."""


def load_rows(path: str) -> dict[tuple[str, int, str], dict]:
    """The rows of a ``dcp bench peers --json`` output, by (dataset, seed, method)."""
    fix = "write one with dcp bench peers ... --json > FILE"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise GateFileError(f"--against {path}: cannot read it ({exc.strerror}); {fix}") from None
    lines = [line for line in text.strip().splitlines() if line.strip()]
    try:
        rows = json.loads(lines[-1])["rows"] if lines else None
        keyed = {(r["dataset"], int(r["seed"]), r["method"]): r for r in rows}
        for r in keyed.values():  # (the figures compare() reads: numbers, or the file is refused here)
            for k in ("ideal_fraction", "step_tokens_min_frac", "step_tokens_max_frac"):
                r[k] = float(r[k])
    except (ValueError, KeyError, TypeError, IndexError):
        raise GateFileError(f"--against {path}: its last line is not a JSON object with \"rows\" of dcp bench "
                            f"peers (dataset, seed, method, ideal_fraction, step_tokens_min_frac/max_frac); {fix}"
                            ) from None
    if not keyed:
        raise GateFileError(f"--against {path}: it holds no rows; {fix}")
    return keyed


def compare(rows: list[dict], before: dict[tuple[str, int, str], dict], path: str,
            bounds: tuple[float, float]) -> tuple[list[str], list[str]]:
    """(report lines, failure lines) of ``rows`` (this run's) against ``before`` (``load_rows``)."""
    low, high = bounds

    def held(r: dict) -> bool:
        return low - 1e-9 <= r["step_tokens_min_frac"] and r["step_tokens_max_frac"] <= high + 1e-9

    deltas, fails = [], []
    for r in rows:
        key = (r["dataset"], r["seed"], r["method"])
        b = before.get(key)
        if b is None:
            continue
        d = 100.0 * (r["ideal_fraction"] - b["ideal_fraction"])
        deltas.append((d, key))
        name = f"{key[0]} seed {key[1]} {key[2]}"
        if d < -GATE_POINTS:
            fails.append(f"{name}: ideal fraction {b['ideal_fraction']:.4f} -> {r['ideal_fraction']:.4f} "
                         f"({d:+.2f} points; the gate allows -{GATE_POINTS:g})")
        if held(b) and not held(r):
            fails.append(f"{name}: steps {r['step_tokens_min_frac']:.3f}-{r['step_tokens_max_frac']:.3f} x the batch, "
                         f"outside the bounds [{low:g}, {high:g}] that {path} held")
    if not deltas:
        return [], [f"--against {path}: none of this run's cells (dataset, seed, method) is in it; run the same "
                    "--datasets, --seeds and --methods"]
    worst, best = min(deltas), max(deltas)
    mean = sum(d for d, _ in deltas) / len(deltas)
    report = [f"# against {path}: {len(deltas)} cells, ideal fraction {mean:+.2f} points on average, worst "
              f"{worst[0]:+.2f} ({' '.join(map(str, worst[1]))}), best {best[0]:+.2f} ({' '.join(map(str, best[1]))})"]
    return report, fails


__all__ = ["GATE_POINTS", "GateFileError", "compare", "load_rows"]
