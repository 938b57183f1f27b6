"""The dense window (dcp.planner.dense) of a step at a global batch whose T* a long micro-batch sets: the head and
the scanned micro-batches of the most work per token, within the step's most tokens; the epochs that use it keep
every sample once, every step within the bounds and the epoch's mean on the target."""

from __future__ import annotations

import dataclasses

import numpy as np
from test_planner_assemble import check_plans, make
from test_planner_balance import _long_tail

import dcp.planner.dense as dense_mod
import dcp.planner.step as step_mod
from dcp.planner import EpochPlanner, plan_epoch
from dcp.planner.epoch import EpochProgress
from dcp.planner.step_tokens import micro_batch_tokens, step_tokens
from dcp.planner.window import scan


def _at(cfg, tokens_per_step: int):
    # the bounds these figures were measured at (the default is +-10%)
    return cfg.replace(planning=dataclasses.replace(cfg.planning, tokens_per_step=tokens_per_step,
                                                    step_tokens_bounds=(0.5, 2.0)))


def _arrays(world: int = 8):
    cfg, table = make(world, method="dcp-intra")
    lengths = _long_tail(0)
    ep = EpochPlanner(lengths, table, _at(cfg, int(lengths.sum() / 20)), world).arrays
    return ep, micro_batch_tokens(ep.flat_lens, ep.mb_flat, ep.mb_count)


def test_dense_window_takes_the_most_work_per_token_within_the_most_tokens():
    ep, mb_tok = _arrays()
    prog = EpochProgress(ep.num_micro_batches)
    t_star = float(np.median(ep.mb_t)) * 4
    head = int(np.flatnonzero(ep.mb_t <= t_star)[0])
    most = float(mb_tok.sum()) / 30
    win = dense_mod.dense_window(ep, prog, head, t_star, (0.0, most), mb_tok)
    assert win is not None and win[0] == head and (np.diff(win) > 0).all()
    assert mb_tok[win].sum() <= most and (ep.mb_t[win] <= t_star * (1 + 1e-9)).all()
    # every micro-batch it left out within its reach holds less work per token than each one it took
    sc = scan(ep, prog, head, lambda t: dense_mod.DENSE_WORK * ep.world_size * t_star)
    reach = sc.idx[: int(np.searchsorted(np.cumsum(mb_tok[sc.idx]), dense_mod.DENSE_REACH * most, side="right"))]
    density = ep.mb_work / np.maximum(mb_tok, 1)
    left = np.setdiff1d(reach[ep.mb_t[reach] <= t_star * (1 + 1e-9)], win)
    taken = win[win != head]
    assert len(left) and len(taken) and density[left].max() <= density[taken].min() + 1e-12
    # it reorders: a plain release-order window of those tokens would end earlier
    assert win[-1] > sc.idx[int(np.searchsorted(np.cumsum(mb_tok[sc.idx]), most))]


def test_dense_window_only_for_a_long_step_and_a_head_within_t_star():
    ep, mb_tok = _arrays()
    prog = EpochProgress(ep.num_micro_batches)
    head = int(np.argmax(ep.mb_t))
    t = float(ep.mb_t[head])
    most = float(mb_tok.sum()) / 30
    assert dense_mod.dense_window(ep, prog, head, t * 0.9, (0.0, most), mb_tok) is None  # the head is longer
    want_work = t * ep.world_size / dense_mod.DENSE_LONG
    assert dense_mod.dense_window(ep, prog, head, t, (want_work * 1.01, most), mb_tok) is None  # T* not long
    assert dense_mod.dense_window(ep, prog, head, t, (want_work * 0.99, most), mb_tok) is not None


def test_epochs_with_dense_windows_keep_samples_bounds_and_mean(monkeypatch):
    world = 8  # (at 4 ranks these epochs build none)
    cfg, table = make(world, method="dcp-intra")
    used = []
    real = dense_mod.dense_window

    def spy(*args):
        out = real(*args)
        used.append(out is not None)
        return out

    monkeypatch.setattr(step_mod, "dense_window", spy)
    for seed in range(3):
        lengths = _long_tail(seed, n=800)
        target = int(lengths.sum() / 25)
        plans = plan_epoch(lengths, table, _at(cfg, target), world)
        check_plans(plans, lengths, cfg, world)
        tok = step_tokens(plans)
        assert (tok >= 0.5 * target).all() and (tok <= 2.0 * target).all(), (seed, tok.min(), tok.max())
        assert abs(tok.mean() / target - 1) <= 0.05, (seed, tok.mean() / target)
    assert any(used), "no step of these epochs built a dense window: pick a longer tail"


def test_a_scan_says_whether_the_look_ahead_bound_ended_it():
    cfg, table = make(8, method="dcp-intra")
    cfg = cfg.replace(advanced=dataclasses.replace(cfg.advanced, lookahead_samples=100))
    lengths = _long_tail(0)
    ep = EpochPlanner(lengths, table, _at(cfg, int(lengths.sum() / 20)), 8).arrays
    prog = EpochProgress(ep.num_micro_batches)
    assert ep.ready[0] + ep.lookahead_samples < ep.num_samples  # the bound lies before the epoch's end
    # the work goal met first: not capped; a goal no look-ahead meets: capped at the bound, before the end
    assert not scan(ep, prog, 0, lambda t: 1e-9).capped
    sc = scan(ep, prog, 0, lambda t: float("inf"))
    assert sc.capped and not sc.all and sc.idx[-1] < ep.num_micro_batches - 1
    # a scan that reached the epoch's end is not capped (``Scan.all`` says it)
    last = ep.num_micro_batches - 1
    end = scan(ep, prog, last, lambda t: float("inf"))
    assert end.all and not end.capped
