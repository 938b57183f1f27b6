"""Fingerprint the planner's output: one sha256 per (setup, world size, method) over every StepPlan of an epoch.

A refactor of ``dcp.planner`` must leave plans byte-identical. This script plans one epoch for
W = 8, 32, 256, 1024, 4096 and every planning method (``dcp.config.METHODS``) on fixed simulated setups (the
simulator's analytic paper tables, ``dcp.sim.scenario``, and seeded draws of ``datasets/`` distributions) and
hashes, per StepPlan, its epoch, step, world size, method and every array: per group its first rank (its ranks),
p, r and ga_steps; per micro-batch its predicted time (float64 bytes, so exact), seq_group and size b; per
sample its id and length.

    python scripts/plan_hash.py                       # table of hashes and a combined one
    python scripts/plan_hash.py --json > scripts/plan_hashes.json
    python scripts/plan_hash.py --check scripts/plan_hashes.json   # exit 1 naming the first difference

Three setups: t1d-5b on H200 with t1d-long (1D, a heavy tail: fillers, recompute, no re-pack passes
from 512 ranks), t2d-1.2b on H100 with t2d-balanced (2D shapes), and t1d-5b on H100 with t1d-short at Gmin =
Gmax = 2 and a fixed look-ahead of 24 samples per rank (the Gmin rescaling, a tight window). A planner error is part of
the fingerprint (its type and message are hashed and shown), so a refactor must not change an error either (until
the planner split, dcp-intra at Gmin = 2 and W = 8 failed with "ValueError: True is not in list": the Gmin re-pack
could leave the head without a group; fixed since, that one entry changed). Sample counts shrink with W where a
step takes many samples, but every (setup, W, method) still plans several steps (the step count is printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time

WORLD_SIZES = (8, 32, 256, 1024, 4096)
SETUPS = {
    # name: (model, hardware, dataset, samples per W, gmin, gmax, look-ahead samples per rank (0: default))
    "t1d": ("t1d-5b", "h200", "t1d-long", {8: 6000, 32: 12000, 256: 60000, 1024: 200000, 4096: 600000}, 1, 4, 0),
    "t2d": ("t2d-1.2b", "h100", "t2d-balanced", {8: 3000, 32: 8000, 256: 40000, 1024: 150000, 4096: 500000},
            1, 4, 0),
    "t1d-gmin": ("t1d-5b", "h100", "t1d-short", {8: 3000, 32: 8000, 256: 30000, 1024: 100000, 4096: 300000},
                 2, 2, 24),
}
SEED = 0


def plan_digest(plan) -> str:
    """sha256 of one StepPlan: every decision and time, as raw little-endian bytes."""
    h = hashlib.sha256()
    h.update(json.dumps([plan.epoch, plan.step, plan.world_size, plan.method]).encode())
    for arr in (plan.first_rank, plan.sp_size, plan.recompute_layers, plan.ga_steps, plan.mb_time_s,
                plan.mb_seq_group, plan.mb_size, plan.sample_id_array, plan.seq_len_array):
        h.update(arr.dtype.str.encode())
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    if plan.mb_recompute_layers is not None:  # (absent: the hash of a plan without the field, as before it existed)
        h.update(b"mb_recompute_layers")
        h.update(plan.mb_recompute_layers.tobytes())
    return h.hexdigest()


def hash_all(setups=tuple(SETUPS), world_sizes=WORLD_SIZES, methods=None, progress=True) -> dict[str, dict]:
    """{'setup/W/method': {'sha256': .., 'steps': .., 'seconds': ..}} in a fixed order."""
    from dcp.config import METHODS
    from dcp.data_dists import load_lengths
    from dcp.planner import EpochPlanner
    from dcp.sim.scenario import paper_config, paper_table, scenario

    out: dict[str, dict] = {}
    for name in setups:
        model, hw, dataset, samples, gmin, gmax, per_rank = SETUPS[name]
        sc = scenario(model, hw)
        for w in world_sizes:
            data = load_lengths(dataset, num_samples=samples[w], seed=SEED)
            table = paper_table(sc, w, shapes=data.shapes)
            for m in methods or METHODS:
                cfg = paper_config(sc, m, gmin=gmin, gmax=gmax, seed=SEED)
                cfg = cfg.replace(advanced=dataclasses.replace(cfg.advanced, lookahead_samples=per_rank * w))
                t0 = time.perf_counter()
                h, steps, error = hashlib.sha256(), 0, None
                try:
                    for plan in EpochPlanner(data.tokens, table, cfg, w, 0, shapes=data.shapes):
                        h.update(plan_digest(plan).encode())
                        steps += 1
                except Exception as exc:  # noqa: BLE001 - a planner error is part of its behaviour: hash it too
                    error = f"{type(exc).__name__}: {exc}"
                    h.update(f"error after {steps} steps: {error}".encode())
                key = f"{name}/W={w}/{m}"
                out[key] = {"sha256": h.hexdigest(), "steps": steps, "seconds": round(time.perf_counter() - t0, 2)}
                if error is not None:
                    out[key]["error"] = error
                if progress:
                    print(f"{key:<28} {out[key]['sha256'][:16]}  steps {steps:>5}  {out[key]['seconds']:>6.2f} s"
                          + (f"  ERROR {error}" if error else ""), file=sys.stderr, flush=True)
    return out


def combined(hashes: dict[str, dict]) -> str:
    h = hashlib.sha256()
    for key in sorted(hashes):
        h.update(f"{key}={hashes[key]['sha256']}\n".encode())
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print {'plans': {...}, 'combined': ...} as JSON")
    ap.add_argument("--check", metavar="FILE", help="compare with a saved --json output; exit 1 on a difference")
    args = ap.parse_args(argv)
    want: dict = {}
    if args.check:  # read before the minute of planning, so a bad path fails at once
        try:
            with open(args.check) as f:
                want = json.load(f)["plans"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"plan_hash: --check {args.check}: cannot read saved hashes ({exc}): write one with --json",
                  file=sys.stderr)
            return 2
    hashes = hash_all()
    total = combined(hashes)
    if args.json:
        print(json.dumps({"plans": {k: {x: v[x] for x in ("sha256", "steps", "error") if x in v}
                                    for k, v in hashes.items()},
                          "combined": total}, indent=1))
    else:
        for k, v in hashes.items():
            print(f"{k:<28} {v['sha256']}  steps {v['steps']}" + (f"  error {v['error']}" if "error" in v else ""))
        print(f"combined {total}")
    if args.check:
        for key in [*want, *(k for k in hashes if k not in want)]:
            got = hashes.get(key, {}).get("sha256")
            if got != want.get(key, {}).get("sha256"):
                print(f"plan_hash: DIFFERENT at {key}: saved {want.get(key, {}).get('sha256')} now {got}",
                      file=sys.stderr)
                return 1
        print(f"plan_hash: all {len(want)} plans identical to {args.check} (combined {total})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
