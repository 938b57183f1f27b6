"""Fingerprint epochs that ``scripts/plan_hash.py`` does not plan: a global batch (``planning.tokens_per_step``)
and the realistic text documents, on the t1d-5b H200 table, seed 0.

One sha256 per epoch over ``plan_hash.plan_digest`` of every StepPlan. Run it on two trees and compare the
lines: a planner refactor must print the same. The target is ``factor`` x the bucket baseline's mean tokens per
step on the same data (factor 0: no global batch).

    PYTHONPATH=. python scripts/plan_hash_batch.py            # every case
    PYTHONPATH=. python scripts/plan_hash_batch.py 4 5        # cases by index
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import time
from pathlib import Path

CASES = (  # dataset, W, samples, method, target factor (0: no global batch)
    ("t1d-long", 32, 12000, "dcp-intra", 1.0), ("t1d-long", 1024, 120000, "dcp-intra", 1.0),
    ("t1d-long", 4096, 400000, "dcp-intra", 1.0), ("text", 32, 30000, "dcp-intra", 1.0),
    ("text", 1024, 1500000, "dcp-intra", 1.0), ("text", 4096, 5000000, "dcp-intra", 1.0),
    ("t1d-short", 256, 60000, "dcp-intra", 2.0), ("t1d-long", 256, 60000, "dcp-intra", 0.5),
    ("text", 256, 120000, "dcp-inter", 1.0),
    ("text", 4096, 6000000, "dcp-intra", 0.0), ("text", 1024, 1500000, "dcp-intra", 0.0),
)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from plan_hash import plan_digest

    from dcp.data_dists import load_lengths
    from dcp.planner import EpochPlanner
    from dcp.planner.peers import bucket_tokens_per_step
    from dcp.sim.scenario import paper_config, paper_table, scenario

    bad = [a for a in argv if not a.isdigit() or int(a) >= len(CASES)]
    if bad:
        print(f"plan_hash_batch: error: case {bad[0]!r} is not an index in [0, {len(CASES) - 1}]: pass indices "
              "or nothing for every case", file=sys.stderr)
        return 2
    sc = scenario("t1d-5b", "h200")
    chosen = {int(a) for a in argv}  # "04" is case 4
    for i, (ds, w, n, method, factor) in enumerate(CASES):
        if chosen and i not in chosen:
            continue
        data = load_lengths(ds, num_samples=n, seed=0)
        table = paper_table(sc, w)
        cfg = paper_config(sc, method, seed=0)
        if factor:
            target = round(factor * bucket_tokens_per_step(data.tokens, table, paper_config(sc, "bucket", seed=0), w))
            cfg = cfg.replace(planning=dataclasses.replace(cfg.planning, tokens_per_step=target))
        t0, h, steps = time.process_time(), hashlib.sha256(), 0
        for plan in EpochPlanner(data.tokens, table, cfg, w, 0):
            h.update(plan_digest(plan).encode())
            steps += 1
        print(f"{ds}/{w}/{method}/x{factor} {steps} {h.hexdigest()[:16]} {time.process_time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
