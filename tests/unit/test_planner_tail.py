"""The epoch's last two steps at a global batch planned together (``dcp.planner.tail``) and every group's longest
micro-batch run last (``dcp.planner.build._longest_last``)."""

from __future__ import annotations

import dataclasses

import numpy as np
from test_planner_assemble import make

from dcp.planner import plan_epoch
from dcp.planner import tail as tail_mod
from dcp.planner.build import _longest_last
from dcp.planner.tail import is_penultimate


def _at(cfg, tokens_per_step, bounds=(0.5, 2.0)):
    return cfg.replace(planning=dataclasses.replace(cfg.planning, tokens_per_step=tokens_per_step,
                                                    step_tokens_bounds=bounds))


def _long_tail(seed: int, n: int = 300) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.1, rng.integers(3000, 4096, n), rng.integers(1, 400, n))


def test_is_penultimate():
    # target 100, bounds [50, 200], step 8 with 800 done; the epoch takes round(total / 100) steps
    assert not is_penultimate(8, 800, 1100, 100, (0.5, 2.0))  # 300 left: three steps
    assert is_penultimate(8, 800, 1000, 100, (0.5, 2.0))  # 100 now, then 100: the next one is the last
    assert is_penultimate(8, 800, 960, 100, (0.5, 2.0))  # 10 steps of 96: 64 now (ahead by 32), then 96
    assert not is_penultimate(8, 800, 940, 100, (0.5, 2.0))  # 9 steps: this one is the last and takes all 140
    # behind by 80: 144 now (what leaves the mean, 96, for the last), then 96
    assert is_penultimate(8, 720, 960, 100, (0.5, 2.0))
    # ahead by 40 with 250 left of 11 steps: three steps left
    assert not is_penultimate(8, 840, 1090, 100, (0.5, 2.0))


def _tails_against(monkeypatch, seeds, off: tuple[str, ...]) -> int:
    """Plans each seed's epoch with the tail rule and with ``off`` (tail_mod constants emptied); checks the rule's
    epoch takes its planned 20 steps (the epoch's mean tokens per step on the target), and where the other one
    does too, that the steps before the tail are the same plans and the tail is never longer; returns on how many
    seeds it is shorter by TAIL_GAIN."""
    cfg, table = make(8, method="dcp-intra")
    shorter = 0
    for seed in seeds:
        lengths = _long_tail(seed)
        target = int(lengths.sum() / 20)
        plans = plan_epoch(lengths, table, _at(cfg, target), 8)
        with monkeypatch.context() as m:
            for name in off:
                m.setattr(tail_mod, name, ())
            other = plan_epoch(lengths, table, _at(cfg, target), 8)
        assert len(plans) == 20
        if len(other) != len(plans):
            continue  # (the plain tail ended the epoch in 19 steps, its last at 1.95 x: the rule kept 20)
        n = len(plans) - 2
        assert [p.digest() for p in plans[:n]] == [p.digest() for p in other[:n]]
        t, t0 = (sum(p.step_time_s for p in ps[n:]) for ps in (plans, other))
        assert t <= t0 * (1 + 1e-9), (seed, t, t0)
        shorter += t < t0 * (1 - tail_mod.TAIL_GAIN)
    return shorter


def test_tail_is_never_longer_and_sometimes_shorter(monkeypatch):
    # against the plain tail only (no other wanted tokens tried); every step's bounds:
    # test_planner_tokens_per_step.test_long_tail_every_step_within_the_bounds, on these data
    assert _tails_against(monkeypatch, range(8), ("TAIL_WANTS", "TAIL_REACH")) >= 1  # the rule acts on these data


def test_reaching_all_that_is_left_is_never_longer_and_sometimes_shorter(monkeypatch):
    # the penultimate step planned with no lower bound of its own (TAIL_REACH): its window may take a long
    # micro-batch late in the release order that would otherwise run alone in the last step
    # (seeds 31 and 33 since each step's budget leaves the epoch's mean to the steps after it; 0-8 before)
    assert _tails_against(monkeypatch, (31, 33), ("TAIL_REACH",)) >= 1


def test_longest_last_moves_each_groups_longest_to_its_end():
    kk = np.array([10, 11, 12, 20, 30, 31, 32, 33])
    times = np.array([1.0, 3.0, 2.0, 5.0, 2.0, 4.0, 4.0, 1.0])
    gidx = np.array([0, 0, 0, 1, 3, 3, 3, 3])  # group 2 is empty
    k2, t2 = _longest_last(kk, times, gidx)
    assert k2.tolist() == [10, 12, 11, 20, 30, 32, 33, 31]  # ties: the first of the longest goes last
    assert t2.tolist() == [1.0, 2.0, 3.0, 5.0, 2.0, 4.0, 1.0, 4.0]
    empty = np.array([], dtype=np.int64)
    assert _longest_last(empty, np.array([]), empty)[0].tolist() == []


def _last_is_longest(plans) -> list[bool]:
    return [g.micro_batches[-1].time_s == max(mb.time_s for mb in g.micro_batches)
            for p in plans for g in p.groups if len(g.micro_batches) > 1]


def test_plans_at_a_global_batch_run_the_longest_micro_batch_last():
    cfg, table = make(8, method="dcp-intra")
    lengths = _long_tail(1)
    at_batch = _last_is_longest(plan_epoch(lengths, table, _at(cfg, int(lengths.sum() / 20)), 8))
    assert at_batch and all(at_batch)
    # without a global batch the groups keep release order (scripts/plan_hash.py): there it is not always so
    assert not all(_last_is_longest(plan_epoch(lengths, table, cfg, 8)))
