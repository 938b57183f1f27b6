"""The Gmin re-pack always places the step's head.

At W = 8 with Gmin = Gmax = 2, a step whose first packing had to put the head first (the window's longest
micro-batch took the ranks the head needed) was re-packed for Gmin without that rule, so the head could end
in no group and placement failed with "ValueError: True is not in list". These are the setups it failed on.
"""

from __future__ import annotations

import dataclasses

import pytest

from dcp.data_dists import load_lengths
from dcp.planner import plan_epoch
from dcp.planner import step as step_mod
from dcp.sim.scenario import paper_config, paper_table, scenario
from tests.unit.test_planner_assemble import check_plans

W = 8


@pytest.mark.parametrize(("model", "dataset"), [("t1d-5b", "t1d-short"), ("t1d-5b", "t1d-balanced"),
                                                ("t2d-1.2b", "t2d-short")])
def test_gmin_repack_keeps_the_head(model, dataset, monkeypatch):
    sc = scenario(model, "h100")
    data = load_lengths(dataset, num_samples=3000, seed=0)
    table = paper_table(sc, W, shapes=data.shapes)
    cfg = paper_config(sc, "dcp-intra", gmin=2, gmax=2, seed=0)
    cfg = cfg.replace(advanced=dataclasses.replace(cfg.advanced, lookahead_samples=24 * W))
    head_first: list[bool] = []
    real_pack = step_mod.pack

    def spy(*args, **kwargs):
        head_first.append(kwargs.get("head_first", False))
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(step_mod, "pack", spy)
    plans = plan_epoch(data.tokens, table, cfg, W, shapes=data.shapes)
    assert any(head_first), "the setup no longer reaches the head-first packing: the test lost its case"
    check_plans(plans, data.tokens, cfg, W)  # the whole epoch planned: every sample exactly once
