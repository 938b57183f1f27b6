"""Garbage-collector work while ``dcp bench planner``'s workload plans (DCP-intra, default model, synthetic lengths).

Counts the cyclic collector's collections per generation with ``gc.callbacks`` and their process CPU time
(``time.process_time``, not wall time: on a shared machine wall time charges preemption to whichever collection
it lands in), and samples where the tracked allocations come from: the planner frame running at each collection.

    python scripts/planner_gc.py [W] [steps]        # defaults 4096 20
"""

from __future__ import annotations

import collections
import gc
import sys
import time


def main(argv: list[str]) -> int:
    from dcp.config import DCPConfig, PlanningConfig
    from dcp.planner.analytic import CPU_SMALL, analytic_table_for
    from dcp.planner.assemble import EpochPlanner
    from dcp.planner.lengths import synthetic_lengths

    W = int(argv[0]) if argv else 4096
    steps = int(argv[1]) if len(argv) > 1 else 20
    config = DCPConfig(planning=PlanningConfig(method="dcp-intra"))
    table = analytic_table_for(config, W, mem_capacity_bytes=CPU_SMALL.mem_capacity_bytes)
    lengths = synthetic_lengths((64 * (steps + 1) + 128) * W, table.max_len, seed=1)  # as dcp bench planner
    planner = EpochPlanner(lengths, table, config, W)
    next(planner)  # the epoch's preparation
    sites: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    cpu: collections.Counter = collections.Counter()
    open_at = [0.0, 0]

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            open_at[:] = [time.process_time(), info["generation"]]
            count[info["generation"]] += 1
            f = sys._getframe(1)
            while f is not None and "dcp/" not in f.f_code.co_filename:
                f = f.f_back
            if f is not None:
                sites[f"{f.f_code.co_filename.split('dcp/')[-1]}:{f.f_lineno} {f.f_code.co_name}"] += 1
        else:
            cpu[open_at[1]] += time.process_time() - open_at[0]

    gc.collect()
    gc.callbacks.append(watch)
    c0 = time.process_time()
    for _ in range(steps):
        next(planner)
    total = time.process_time() - c0
    gc.callbacks.remove(watch)
    gc_s = sum(cpu.values())
    print(f"W={W} steps={steps}: planning CPU {total / steps * 1e3:.1f} ms/step, collector {gc_s / steps * 1e3:.2f} "
          f"ms/step ({gc_s / total:.1%})")
    for g in sorted(count):
        print(f"  gen {g}: {count[g] / steps:.2f} collections/step, {cpu[g] / steps * 1e3:.2f} ms/step")
    print("collections (any generation) per step by the planner line whose allocation triggered them:")
    for site, n in sites.most_common(8):
        print(f"  {n / steps:6.2f}  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
