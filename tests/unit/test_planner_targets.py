"""A DCP step at a global batch that still idles after balancing is planned again at other targets
(dcp.planner.step._other_targets): the plan that fills the most of the step's GPU-time with work at the
micro-batches' own settings is kept, its tokens near the wanted ones; the epoch is shorter, every sample once,
every step within the bounds, the epoch's mean on the target."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_planner_assemble import check_plans, make
from test_planner_balance import _long_tail

import dcp.planner.step as step_mod
from dcp.planner import EpochPlanner, plan_epoch
from dcp.planner.build import placed_groups
from dcp.planner.group import Group
from dcp.planner.step import fill_share
from dcp.planner.step_tokens import TOKEN_LAG, step_tokens, thin_window, window_at


def _at(cfg, tokens_per_step: int):
    # the bounds these figures were measured at (the default is +-10%)
    return cfg.replace(planning=dataclasses.replace(cfg.planning, tokens_per_step=tokens_per_step,
                                                    step_tokens_bounds=(0.5, 2.0)))


@pytest.mark.parametrize("world", [4, 8])
def test_other_targets_shorten_the_epoch_and_keep_the_batch(monkeypatch, world):
    cfg, table = make(world, method="dcp-intra")
    times = {"searched": 0.0, "one": 0.0}
    for seed in range(3):
        lengths = _long_tail(seed, n=800)
        target = int(lengths.sum() / 25)
        for kind in ("searched", "one"):
            if kind == "one":
                monkeypatch.setattr(step_mod, "TOKEN_TARGETS", ())
            plans = plan_epoch(lengths, table, _at(cfg, target), world)
            monkeypatch.undo()
            times[kind] += sum(p.step_time_s for p in plans)
            if kind == "searched":  # (the one-target epoch of seed 2 at W = 8 ends on a step below the bound)
                check_plans(plans, lengths, cfg, world)
                tok = step_tokens(plans)
                assert (tok >= 0.5 * target).all() and (tok <= 2.0 * target).all(), (seed, tok.min(), tok.max())
                assert abs(tok.mean() / target - 1) <= 0.05, (seed, tok.mean() / target)
    assert times["searched"] < times["one"], times


def test_running_total_stays_near_the_target(monkeypatch):
    # every target tried (even far shorter ones): the running total may lag step x target by at most
    # TOKEN_LAG of it (plus the last step's slack), so the epoch's mean stays on the target
    monkeypatch.setattr(step_mod, "TOKEN_TARGETS", (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9))
    cfg, table = make(8, method="dcp-intra")
    lengths = _long_tail(1, n=3000)
    target = int(lengths.sum() / 100)
    tok = step_tokens(plan_epoch(lengths, table, _at(cfg, target), 8))
    assert abs(tok.mean() / target - 1) <= 2 * TOKEN_LAG, tok.mean() / target
    behind = np.arange(1, len(tok) + 1) * target - np.cumsum(tok)
    assert (behind[:-1] <= (TOKEN_LAG * np.arange(1, len(tok)) + 2.0) * target).all()


def test_window_at_stops_before_a_longer_micro_batch():
    cumw = np.cumsum([1.0, 1.0, 5.0, 1.0])
    t_all = np.array([1.0, 1.0, 5.0, 1.0])
    tok = np.array([10, 10, 50, 10])
    assert window_at(cumw, t_all, tok, 2, 2.0, 1000, 1.5) == (2.0, 2, 0)  # the 5.0 one is longer than T*
    assert window_at(cumw, t_all, tok, 2, 0.5, 1000, 1.5) is None  # the head itself is longer
    assert window_at(cumw, t_all, tok, 2, 5.0, 25, 1.5)[1] == 2  # at most 25 tokens


def test_fill_share_counts_idle_ranks_and_costlier_settings():
    cfg, table = make(8, method="dcp-intra")
    lengths = _long_tail(0)
    pl = EpochPlanner(lengths, table, _at(cfg, int(lengths.sum() / 20)), 8)
    ep = pl.arrays
    k = int(np.flatnonzero(ep.mb_p_np == 1)[0])
    t = float(ep.mb_t[k])
    assert fill_share(ep, placed_groups(ep, [Group(1, int(ep.mb_r[k]), t, [k])], k)[0]) == pytest.approx(1 / 8)  # 7 ranks idle
    assert fill_share(ep, placed_groups(ep, [Group(1, int(ep.mb_r[k]), 2 * t, [k])], k)[0]) == pytest.approx(1 / 16)  # at twice its time


def test_thin_window_defers_the_widest_kind_beyond_one_group():
    cfg, table = make(8, method="dcp-intra")
    lengths = _long_tail(0)
    ep = EpochPlanner(lengths, table, _at(cfg, int(lengths.sum() / 20)), 8).arrays
    wide = np.flatnonzero(ep.mb_p_np == ep.mb_p_np.max())[:3]
    short = np.flatnonzero(ep.mb_p_np == ep.mb_p_np.min())[:5]
    win = np.concatenate([short[:1], wide, short[1:]])
    t = ep.mb_t[wide]
    out = thin_window(ep, win, float(t[0] + t[1]) * 1.001, int(short[0]))
    assert out is not None and out.tolist() == [int(short[0]), *wide[:2].tolist(), *short[1:].tolist()]
    assert thin_window(ep, win, float(t.sum()) * 1.001, int(short[0])) is None  # nothing to cut
    head = int(wide[2])  # the head always stays
    assert head in thin_window(ep, win, float(t[0]) * 1.001, head).tolist()
