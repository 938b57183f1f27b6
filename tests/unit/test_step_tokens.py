"""Tokens per step as a setting: rounds grouped into optimizer steps near the target, within the bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.step_tokens import (
    group_rounds,
    micro_batch_tokens,
    round_token_cap,
    slot_steps,
    step_tokens,
    summary,
    token_target,
)


def _rounds(tokens: list[int]) -> list[StepPlan]:
    return [StepPlan(0, k, 2, "dcp-intra", [GroupPlan(0, 2, 0, (MicroBatch((k,), (t,), 0, 0.1),))])
            for k, t in enumerate(tokens)]


def test_unset_keeps_the_planners_steps():
    rounds = _rounds([5, 7, 9])
    assert list(group_rounds(rounds, 0, (0.5, 2.0))) == rounds


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=30, max_size=120), st.integers(300, 1200))
def test_steps_hold_the_target_within_bounds(tokens, target):
    rounds = _rounds(tokens)
    out = list(group_rounds(rounds, target, (0.5, 2.0)))
    assert [p.sample_ids for p in out] == [p.sample_ids for p in rounds]  # every round once, in order
    steps = [p.step for p in out]
    assert steps == sorted(steps) and set(steps) == set(range(steps[-1] + 1))
    tok = step_tokens(out)
    if sum(tokens) >= 20 * target:  # >= 20 steps: whole rounds (<= 1.33 x target) let the mean hold within 5%
        assert abs(tok.mean() / target - 1) <= 0.05
        assert (tok <= 2.0 * target).all() and (tok[:-1] >= 0.5 * target).all()


def test_a_short_last_step_joins_the_one_before():
    out = list(group_rounds(_rounds([100] * 10 + [20]), 500, (0.5, 2.0)))
    tok = step_tokens(out)
    assert tok.tolist() == [500, 520]


def test_a_round_above_the_cap_stays_alone_and_the_cap_helper():
    out = list(group_rounds(_rounds([100, 2500, 100, 100, 100, 100]), 500, (0.5, 2.0)))
    assert step_tokens(out).tolist() == [100, 2500, 400]  # the planner must cap rounds: round_token_cap
    assert round_token_cap(500, (0.5, 2.0)) == 1000 and round_token_cap(0, (0.5, 2.0)) == 0


def test_summary_line():
    text = summary(_rounds([10, 30, 20]), 20)
    assert text == "tokens/step min 10 / median 20 / max 30 (mean 20, 3 steps), target 20"
    assert summary([]) == "tokens/step: no steps"


@pytest.mark.parametrize("target", [150, 1000])
def test_grouping_is_lazy(target):
    seen = []

    def stream():
        for p in _rounds([100] * 50):
            seen.append(p.step)
            yield p

    it = group_rounds(stream(), target, (0.5, 2.0))
    next(it)
    assert len(seen) < 50  # the first step is out before the stream is read to its end
    assert np.isfinite(target)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=40, max_size=150), st.integers(400, 900), st.sampled_from([1, 2]))
def test_fixed_sp_baselines_at_a_global_batch(tokens, target, p):
    mbs = [MicroBatch((k,), (t,), 0, t / 100) for k, t in enumerate(tokens)]
    slots = list(range(0, 8 - 8 % p, p))
    plans = list(slot_steps(mbs, slots, p, 4, world_size=8, epoch=0, method="bucket", tokens_per_step=target,
                            bounds=(0.5, 2.0)))
    assert sorted(i for pl in plans for i in pl.sample_ids) == list(range(len(tokens)))
    assert [pl.step for pl in plans] == list(range(len(plans)))
    tok = step_tokens(plans)
    assert (tok <= 2.0 * target).all() and (tok >= 0.5 * target).all() or len(tok) == 1
    if sum(tokens) >= 20 * target:
        assert abs(tok.mean() / target - 1) <= 0.05
    for pl in plans:  # every slot's ranks form one group of p; balanced longest first
        busy = [g for g in pl.groups if g.micro_batches]
        assert all(g.sp_size == p and g.recompute_layers == 4 for g in busy)
        loads = sorted(g.time_s for g in pl.groups if g.sp_size == p)
        assert loads[-1] - loads[0] <= max(mb.time_s for g in busy for mb in g.micro_batches) + 1e-9


def test_micro_batch_tokens_and_token_target():
    assert micro_batch_tokens(np.array([1, 2, 3, 4, 5]), np.array([0, 2, 4]), np.array([2, 2, 1])).tolist() == [3, 7, 5]
    t = np.array([1.0, 1.0, 4.0, 1.0, 1.0, 9.0, 1.0])
    tok = np.array([100, 100, 100, 100, 100, 100, 100])
    work = np.cumsum(t * 2)  # p = 2
    t_star, m, j_long = token_target(work, t, tok, 4, desired=300, cap=600, window_factor=1.5)
    assert t_star == max(4.0, work[2] / 4)  # the batch is the first 3: its longest (4 s) bounds T*
    assert m == 5 and j_long == 2  # choice up to the 9 s micro-batch (longer than T*), within 600 tokens
    t_star, m, _ = token_target(work, t, tok, 4, desired=300, cap=150, window_factor=1.5)
    assert m == 1 and t_star == 1.0  # the cap leaves only the head
