"""How much of the ddp engine's gradient all-reduce DCP-intra's steps leave exposed, by the simulator's rule and by
one that counts every group, at ``dcp bench peers``'s setup (32 simulated H200, 30k samples, seed 0,
tokens_per_step = bucket's mean tokens per step, micro_batch_tokens auto).

    python scripts/sync_overlap.py [dataset ...]

Until 2026-11-26 the simulator (``dcp.sim.cluster.exposed_sync_s``) overlapped the sync with the backward of the
slowest group's last micro-batch only. Every rank's buckets take part in every all-reduce, so a bucket's all-reduce
starts once the last rank to produce it has (``dcp.sim.cluster.exposed_sync_groups_s``, the simulator's rule since):
with group g ending at T_g after a last backward of B_g, its buckets ready evenly over [T_g - B_g, T_g] and n
buckets of sync / n each run one after another, the sync ends at max_i (max_g (T_g - B_g (1 - (i + 1) / n)) +
(n - i) sync / n), at least T* + the last bucket. Printed: both as shares of the epoch's compute time, summed over
the steps.
"""

from __future__ import annotations

import sys

import numpy as np

from dcp.bench.peers import DATASETS, dataset_setup, method_config
from dcp.planner.analytic import grad_sync_time_s
from dcp.planner.assemble import EpochPlanner
from dcp.sim.cluster import _mem_row, backward_share, exposed_sync_groups_s, exposed_sync_s, row_lookup


def overlap(ds: str, world: int = 32, seed: int = 0) -> str:
    lengths, sc, table, target = dataset_setup(ds, world, seed)
    cfg = method_config(sc, "dcp-intra", seed, target, world)
    rows, edges, model = row_lookup(table), table.seq_group_edges, cfg.model
    sync = grad_sync_time_s(model, sc.hardware, world)
    grad_bytes = model.num_params * model.param_bytes
    compute = by_sim = by_all = 0.0
    for p in EpochPlanner(lengths.tokens, table, cfg, world, 0, shapes=lengths.shapes):
        ends, last_bw = [], []
        for g in p.groups:
            if g.micro_batches:
                mb = g.micro_batches[-1]
                ends.append(sum(m.time_s for m in g.micro_batches))
                last_bw.append(mb.time_s * backward_share(_mem_row(mb, g.sp_size, rows, edges), g.recompute_layers))
        e, b = np.asarray(ends), np.asarray(last_bw)
        compute += float(e.max())
        by_sim += exposed_sync_s(sync, float(b[int(np.argmax(e))]), grad_bytes)
        by_all += exposed_sync_groups_s(sync, e, b, grad_bytes)
    return (f"{ds}: sync {sync:.3f} s per step; exposed over the epoch's compute: "
            f"slowest group only {by_sim / compute:.4f}, every group (the simulator since 2026-11-26) "
            f"{by_all / compute:.4f}")


if __name__ == "__main__":
    for name in sys.argv[1:] or DATASETS:
        print(overlap(name), flush=True)
