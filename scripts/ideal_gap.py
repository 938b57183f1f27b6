"""Where DCP-intra's time goes against the ideal bound, per dataset, at ``dcp bench peers``'s setup (32 simulated
H200, 30k samples, seed 0, tokens_per_step = bucket's mean tokens per step, micro_batch_tokens auto).

    python scripts/ideal_gap.py [dataset ...]

W x the epoch's time = the ideal GPU-s (each sample at its best per-GPU efficiency, token packs included: the bound
of ``dcp.sim.cluster.ideal_tokens_per_s``) + excess GPU-s of micro-batches at their seq_group's primary setting
(padding, partial micro-batches) + excess of micro-batches run at another (p, r) (moved by the balance to
another p; each runs its own r since ``StepPlan.mb_recompute_layers``) + idle GPU-s in the compute phases (the
last step's share shown) + W x (exposed sync + optimizer + control plane). Each printed as a share of W x the time, so fraction of ideal = 1 - their sum.

"sync floor": what of sync+optimizer+control no plan of these steps' groups can avoid under the simulator's ddp rule
(``dcp.sim.cluster.exposed_sync_groups_s``): per step W x (the last bucket, S / n, which starts only after the
last backward, + the optimizer + the control plane), plus, for groups whose longest possible last backward b_max
(the largest micro-batch of their seq_groups that fits memory at their p, at its minimal r, at most the group's
tokens) is shorter than the sync S, min over E >= 0 of W x E + sum_g p_g x max(0, S - b_max,g (1 - 1/n) - E)
(exposing E to every rank, or ending those groups early and idling them).
"""

from __future__ import annotations

import collections
import sys

import numpy as np

from dcp.bench.peers import DATASETS, dataset_setup, method_config
from dcp.config import GRAD_BUCKET_MIB
from dcp.planner.analytic import grad_sync_time_s, optimizer_step_time_s
from dcp.planner.assemble import EpochPlanner
from dcp.planner.cost import micro_batch_time_s, min_recompute_layers
from dcp.planner.intra import best_settings, candidate_settings
from dcp.planner.stream import TimeLookup, seq_groups_of
from dcp.planner.syncend import backward_share
from dcp.planner.tokens import best_token_pack
from dcp.sim.cluster import simulate


def sample_ideal_gpu_s(lengths, table, cfg, world: int, two_d: bool) -> np.ndarray:
    """Per sample, its GPU-seconds in the ideal bound (the same rule as ``ideal_tokens_per_s``)."""
    pc = cfg.planning
    kw = dict(mem_capacity_bytes=pc.mem_capacity_bytes, sp_sizes=pc.sp_sizes, world_size=world,
              ranks_per_node=pc.ranks_per_node, dynamic_recompute=True)
    best = best_settings(table, **kw)
    packs = None if two_d else candidate_settings(table, **kw)
    arr, groups = seq_groups_of(lengths, table)
    times = TimeLookup(table)
    out = np.zeros(len(arr))
    for g in sorted(set(groups.tolist())):
        s, m = best[g], groups == g
        per = times.padded_times_s(g, s.sp_size, s.recompute_layers, s.micro_batch_size, arr[m])
        per = per * s.sp_size / s.micro_batch_size
        if packs is not None:
            pick, per_token = best_token_pack(times, s, packs.get(g, []), arr[m])
            if pick is not None and per_token * arr[m].sum() < per.sum():
                per = per_token * arr[m].astype(float)
        out[m] = per
    return out


def longest_backward_s(table, cap: float, p: int, seq_groups: set[int], tokens: int) -> float:
    """The longest last backward a group of p ranks holding ``tokens`` of ``seq_groups`` could run: the largest
    row of those seq_groups at p that fits memory at its minimal r, scaled down to the group's tokens."""
    best = 0.0
    for row in table.rows:
        if row.sp_size != p or row.seq_group not in seq_groups:
            continue
        r = min_recompute_layers(row, cap)
        if r is not None:
            t = micro_batch_time_s(row, r) * min(1.0, tokens / (row.micro_batch_size * row.seq_len))
            best = max(best, t * backward_share(row, r))
    return best


def sync_floor_s(plan, table, cfg, sync: float, buckets: int) -> float:
    """GPU-seconds of the step's sync no plan of its groups avoids (module docstring), without the optimizer."""
    W, cap = plan.world_size, cfg.planning.mem_capacity_bytes
    short = [(g.sp_size, max(0.0, sync - longest_backward_s(table, cap, g.sp_size, {m.seq_group for m in
                                                                                    g.micro_batches}, g.tokens)
                             * (1 - 1 / buckets)))
             for g in plan.groups if g.micro_batches]
    cuts = sorted({0.0, *(d for _, d in short)})
    return W * sync / buckets + min(W * e + sum(q * max(0.0, d - e) for q, d in short) for e in cuts)


def gap(ds: str, world: int = 32, seed: int = 0) -> str:
    lengths, sc, table, target = dataset_setup(ds, world, seed)
    cfg = method_config(sc, "dcp-intra", seed, target, world)
    planner = EpochPlanner(lengths.tokens, table, cfg, world, 0, shapes=lengths.shapes)
    plans = list(planner)
    primary = {g: (s.sp_size, s.recompute_layers) for g, s in planner.settings.items()}
    ideal = sample_ideal_gpu_s(lengths.tokens, table, cfg, world, lengths.shapes is not None)
    parts = collections.Counter()
    last = max(p.step for p in plans)
    sync = grad_sync_time_s(cfg.model, sc.hardware, world)
    grad_bytes = cfg.model.num_params * cfg.model.param_bytes
    buckets = max(1, round(grad_bytes / (GRAD_BUCKET_MIB * 2**20)))
    opt = optimizer_step_time_s(cfg.model, sc.hardware, world) + sc.hardware.step_overhead_s
    for p in plans:
        loads = []
        for g in p.groups:
            for mb in g.micro_batches:
                at_primary = primary.get(mb.seq_group) == (g.sp_size, g.recompute_of(mb))
                excess = g.sp_size * mb.time_s - ideal[np.asarray(mb.sample_ids)].sum()
                parts["excess at primary" if at_primary else "excess moved"] += excess
                parts["ideal"] += ideal[np.asarray(mb.sample_ids)].sum()
            loads.append((g.sp_size, sum(mb.time_s for mb in g.micro_batches)))
        t_step = max(t for _, t in loads)
        idle = sum(q * (t_step - t) for q, t in loads)
        parts["idle"] += idle
        parts["idle of the last step"] += idle if p.step == last else 0.0
        parts["sync floor"] += sync_floor_s(p, table, cfg, sync, buckets) + world * opt
    res = simulate(lengths.tokens, table, cfg, world, hardware=sc.hardware, shapes=lengths.shapes)
    parts["sync+optimizer+control"] = world * (res.total_time_s - res.compute_time_s)
    parts["sync floor"] += world * res.control_time_s
    total = world * res.total_time_s
    shares = ", ".join(f"{k} {parts[k] / total:.4f}" for k in ("excess at primary", "excess moved", "idle",
                                                                "idle of the last step", "sync+optimizer+control",
                                                                "sync floor"))
    return (f"{ds}: fraction of ideal {res.ideal_fraction:.4f} (from the parts {parts['ideal'] / total:.4f}), "
            f"idle {res.idle_ratio:.4f}, {res.num_steps} steps | shares of W x time: {shares}")


if __name__ == "__main__":
    for name in sys.argv[1:] or DATASETS:
        print(gap(name), flush=True)
