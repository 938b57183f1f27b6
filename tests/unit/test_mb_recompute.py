"""Recompute per micro-batch (``StepPlan.mb_recompute_layers``): a group runs its micro-batches one after another
and frees each one's activations after its backward, so each runs its own minimal r at the group's p. The planner
places a micro-batch in a group of its p at another r at its own time, the plan says which r each runs, and the
simulator prices and bounds memory per micro-batch."""

from __future__ import annotations

import numpy as np
import pytest
from test_planner_assemble import check_plans
from test_planner_balance import _at, _check_memory_and_prices

from dcp.data_dists import load_lengths
from dcp.planner import EpochPlanner
from dcp.planner.cost import micro_batch_mem_bytes
from dcp.planner.group import Group
from dcp.planner.improve import join_head
from dcp.planner.packing import pack
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.stream import TimeLookup
from dcp.sim.cluster import row_lookup, step_cost
from dcp.sim.scenario import paper_config, paper_table, scenario


def _epoch(world: int = 8, tokens: bool = True, n: int = 1500):
    """One DCP-intra epoch of t1d-long on the simulator's t1d-5b / H200 table (primary settings of several
    recompute depths at one p), at about 12 steps' tokens per step."""
    data = load_lengths("t1d-long", num_samples=n, seed=0)
    sc = scenario("t1d-5b", "h200")
    table = paper_table(sc, world)
    cfg = paper_config(sc, "dcp-intra", seed=0)
    if tokens:
        cfg = _at(cfg, int(sum(data.tokens) / 12))
    pl = EpochPlanner(data.tokens, table, cfg, world)
    plans = list(pl)
    return pl, plans, data.tokens, cfg, table


def _pair(ep):
    """Two micro-batches of one p and different primary r: (the one of more recompute, the other)."""
    for p in sorted(set(ep.mb_p)):
        ks = [k for k in range(ep.num_micro_batches) if ep.mb_p[k] == p]
        rs = {ep.mb_r[k]: k for k in ks}
        if len(rs) > 1:
            return rs[max(rs)], rs[min(rs)]
    raise AssertionError("the table gives no p two recompute depths: pick another capacity")


def test_a_micro_batch_joins_a_group_of_its_p_at_another_r_and_pays_its_own_time():
    pl, *_ = _epoch()
    ep = pl.arrays
    hi, lo = _pair(ep)
    assert ep.mb_r[hi] > ep.mb_r[lo]
    for first, second in ((hi, lo), (lo, hi)):  # more recompute in a group of less, and the other way round
        head = first if ep.mb_t_list[first] >= ep.mb_t_list[second] else second
        groups = pack(ep, np.array(sorted((first, second))), ep.mb_t_list[hi] + ep.mb_t_list[lo], head)
        assert len(groups) == 1 and sorted(groups[0].items) == sorted((hi, lo))
        assert groups[0].load == pytest.approx(ep.mb_t_list[hi] + ep.mb_t_list[lo], rel=1e-12)
    # the head left out joins the other's group at any r, at its own time
    for k, other in ((hi, lo), (lo, hi)):
        groups = [Group(ep.mb_p[other], ep.mb_r[other], ep.mb_t_list[other], [other])]
        assert join_head(ep, groups, k, 1e9) == (0, ep.mb_t_list[k])


def test_plans_carry_each_micro_batchs_own_r():
    pl, plans, lengths, cfg, _ = _epoch()
    check_plans(plans, lengths, cfg, 8)
    _check_memory_and_prices(pl, plans)
    ep = pl.arrays
    mixed = [p for p in plans if p.mb_recompute_layers is not None]
    assert mixed, "no step put micro-batches of two recompute depths in one group"
    for plan in mixed:
        for g in plan.groups:
            rs = [g.recompute_of(mb) for mb in g.micro_batches]
            assert not rs or g.recompute_layers == max(rs)  # the group's r: the most its micro-batches run
            for mb, r in zip(g.micro_batches, rs, strict=True):
                prim = ep.settings[mb.seq_group]
                if prim.sp_size == g.sp_size and mb.size <= prim.micro_batch_size:
                    # at its own p: no more recompute than its primary's (a filler's setting may differ)
                    assert r <= max(prim.recompute_layers, ep.by_sp[mb.seq_group][g.sp_size].recompute_layers)
    # plans where every micro-batch runs its group's r carry no array (their digest is as before)
    assert any(p.mb_recompute_layers is None for p in plans)


def test_simulator_prices_and_bounds_memory_per_micro_batch():
    _, _, _, _, table = _epoch()
    rows = row_lookup(table)
    row = next(r for rs in rows.values() for r in rs if r.micro_batch_size == 1 and r.num_layers > 1)
    lens = (row.seq_len,)
    a = MicroBatch((0,), lens, row.seq_group, 1.0, 0)
    b = MicroBatch((1,), lens, row.seq_group, 1.0)
    own = StepPlan(0, 0, row.sp_size, "dcp-intra", (GroupPlan(0, row.sp_size, row.num_layers, (a, b)),))
    same = StepPlan(0, 0, row.sp_size, "dcp-intra",
                    (GroupPlan(0, row.sp_size, row.num_layers, (a._replace(recompute_layers=-1), b)),))
    assert own.mb_recompute_layers.tolist() == [0, row.num_layers] and same.mb_recompute_layers is None
    times = TimeLookup(table)
    kw = dict(sync_s=0.0, optimizer_s=0.0, edges=table.seq_group_edges)
    c_own, c_same = step_cost(own, times, rows, **kw), step_cost(same, times, rows, **kw)
    t0, t_l = (times.lengths_time_s(row.seq_group, row.sp_size, r, lens) for r in (0, row.num_layers))
    assert t0 < t_l
    assert c_own.compute_time_s == pytest.approx(t0 + t_l) and c_same.compute_time_s == pytest.approx(2 * t_l)
    # memory: the most of any micro-batch at its own r (the r = 0 one keeps all its activations)
    assert c_own.peak_mem_bytes == pytest.approx(micro_batch_mem_bytes(row, 0))
    assert c_same.peak_mem_bytes == pytest.approx(micro_batch_mem_bytes(row, row.num_layers))


def test_experiments_predicted_peak_reads_each_micro_batchs_r():
    from dcp.experiments.execute import predicted_peak

    _, _, _, _, table = _epoch()
    row = next(r for r in table.rows if r.micro_batch_size == 1 and r.num_layers > 1)
    mbs = (MicroBatch((0,), (row.seq_len,), row.seq_group, 1.0, 0), MicroBatch((1,), (row.seq_len,), row.seq_group))
    own = StepPlan(0, 0, row.sp_size, "dcp-intra", (GroupPlan(0, row.sp_size, row.num_layers, mbs),))
    one = StepPlan(0, 0, row.sp_size, "dcp-intra", (GroupPlan(0, row.sp_size, row.num_layers, mbs[1:]),))
    rows = sorted((r for r in table.rows if (r.seq_group, r.sp_size) == (row.seq_group, row.sp_size)),
                  key=lambda r: r.micro_batch_size)
    assert predicted_peak([own], table) == pytest.approx(micro_batch_mem_bytes(rows[0], 0))
    assert predicted_peak([one], table) == pytest.approx(micro_batch_mem_bytes(rows[0], row.num_layers))

