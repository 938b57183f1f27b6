"""Micro-batches sized in tokens (advanced.micro_batch_tokens, dcp.planner.tokens): greedy packs, the per-seq_group
choice, exactly-once epochs with packed micro-batches, their prices and memory in the simulator, and the option's
default and errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import AdvancedConfig, ConfigError
from dcp.planner import EpochPlanner, plan_epoch
from dcp.planner.source import epoch_input
from dcp.planner.stream import TimeLookup
from dcp.planner.tokens import token_pack_settings, token_runs
from tests.unit.test_planner_ahead import _check_epoch_properties
from tests.unit.test_planner_assemble import EDGES, check_plans, make


def text_lengths(n: int, seed: int = 0, hi: int = 4096) -> np.ndarray:
    """Documents far below their seq_group bounds (lognormal body, mean ~80 tokens) with a 2% tail to ``hi``."""
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(np.log(80) - 0.5, 1.0, n))
    tail = rng.random(n) < 0.02
    x[tail] = 600 / (1 - rng.random(int(tail.sum())) * (1 - 600 / hi))
    return np.clip(x, 1, hi).astype(np.int64)


def _auto(cfg, mode: str = "auto"):
    return cfg.replace(advanced=dataclasses.replace(cfg.advanced, micro_batch_tokens=mode))


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 50), max_size=60), budget=st.integers(1, 120))
def test_token_runs_are_greedy_packs_in_order(lens, budget):
    arr = np.asarray(lens, dtype=np.int64)
    starts = token_runs(arr, budget).tolist()
    ends = [*starts[1:], len(lens)] if lens else []
    assert starts[:1] == ([0] if lens else []) and all(a < e for a, e in zip(starts, ends, strict=True))
    for a, e in zip(starts, ends, strict=True):
        assert sum(lens[a:e]) <= budget or e - a == 1  # only a sample longer than the budget goes alone
        if e < len(lens):
            assert sum(lens[a : e + 1]) > budget  # greedy: the next sample did not fit


def test_default_is_auto_and_off_packs_nothing():
    assert AdvancedConfig().micro_batch_tokens == "auto"
    cfg, table = make(16, cap_mib=48)
    lengths = text_lengths(3000)
    off = EpochPlanner(lengths, table, _auto(cfg, "off"), 16)
    plans = [p.digest() for p in off]
    assert off.arrays.mbq.token_budget == {}
    assert plans == [p.digest() for p in plan_epoch(lengths, table, _auto(cfg, "off"), 16)]
    assert EpochPlanner(lengths, table, _auto(cfg), 16).arrays.mbq.token_budget  # "auto" packs these short documents


@pytest.mark.parametrize("method", ["dcp-intra", "dcp-inter"])
def test_short_documents_pack_by_tokens_and_are_priced_from_real_lengths(method):
    cfg, table = _auto(make(16, method=method, cap_mib=48)[0]), make(16, method=method, cap_mib=48)[1]
    lengths = text_lengths(6000)
    pl = EpochPlanner(lengths, table, cfg, 16)
    plans = list(pl)
    check_plans(plans, lengths, cfg, 16, pl)
    ep = pl.arrays
    assert 0 in ep.mbq.token_budget  # the shortest seq_group holds documents far below its bound
    budget, s = ep.mbq.token_budget[0], ep.settings[0]
    assert budget == s.micro_batch_size * s.seq_len
    times = TimeLookup(table)
    packed = [(g, mb) for p in plans for g in p.groups for mb in g.micro_batches if mb.seq_group == 0
              and g.sp_size == s.sp_size and g.recompute_layers == s.recompute_layers]
    assert max(mb.size for _, mb in packed) > table.rows[-1].micro_batch_size  # more samples than any profiled b
    for _, mb in packed:
        assert mb.tokens <= budget
        lens = np.asarray(mb.seq_lens, dtype=np.float64)
        want = times.lengths_times_s(0, s.sp_size, s.recompute_layers, s.micro_batch_size,
                                     np.array([lens.sum()]), np.array([np.square(lens).sum()]))[0]
        assert mb.time_s == pytest.approx(want, rel=1e-12)
    # fewer micro-batches and less predicted GPU time than the sample-count plans of the same epoch
    off = plan_epoch(lengths, table, _auto(cfg, "off"), 16)
    work = [sum(mb.time_s * g.sp_size for p in ps for g in p.groups for mb in g.micro_batches) for ps in (plans, off)]
    assert sum(len(p.mb_size) for p in plans) < sum(len(p.mb_size) for p in off)
    assert work[0] < work[1]


def test_documents_at_their_bounds_keep_sample_count_micro_batches():
    """A pack of b x bound tokens of documents at the bound is b samples: no gain, so nothing changes."""
    cfg, table = make(16, cap_mib=48)
    lengths = np.random.default_rng(1).choice(np.asarray(EDGES), 3000, p=[0.5, 0.2, 0.15, 0.1, 0.05])
    pl = EpochPlanner(lengths, table, _auto(cfg), 16)
    got = [p.digest() for p in pl]
    assert pl.arrays.mbq.token_budget == {}
    assert got == [p.digest() for p in plan_epoch(lengths, table, cfg, 16)]


def test_2d_samples_never_pack():
    cfg, table = make(8, cap_mib=48)
    lengths = np.full(200, 60, dtype=np.int64)
    inp = epoch_input(lengths, table, _auto(cfg), 8, shapes=[(6, 10)] * 200)
    from dcp.planner.epoch import _settings

    primary, _ = _settings(inp, [0])
    assert token_pack_settings(inp, primary, TimeLookup(table)) == {}
    assert token_pack_settings(dataclasses.replace(inp, shapes=None), primary, TimeLookup(table)) != {}


@settings(max_examples=25, deadline=None)
@given(world=st.integers(1, 24), rpn=st.sampled_from([1, 2, 4, 8]), n=st.integers(0, 400),
       seed=st.integers(0, 3), method=st.sampled_from(["dcp-inter", "dcp-intra"]), gmax=st.integers(1, 4),
       lookahead=st.sampled_from([0, 7, 64]))
def test_token_packed_epochs_keep_the_assembly_properties(world, rpn, n, seed, method, gmax, lookahead):
    """Exactly once, rank coverage, node alignment, Gmax, window bound (token packs released at their last
    sample) and determinism, with token-packed micro-batches."""
    cfg, table = make(world, method=method, rpn=rpn, gmax=gmax, lookahead=lookahead, seed=seed)
    _check_epoch_properties(text_lengths(n, seed), table, _auto(cfg), world, seed)


def test_simulator_bounds_pack_memory_and_ideal_allows_packs():
    from dcp.sim.cluster import ideal_tokens_per_s, simulate

    cfg, table = make(16, cap_mib=48)
    lengths = text_lengths(4000)
    on = simulate(lengths, table, _auto(cfg), 16, hardware=None, return_steps=True)
    res, steps = on
    assert res.mem_violations == 0 and all(s.peak_mem_bytes > 0 for s in steps)
    off = _auto(cfg, "off")
    assert ideal_tokens_per_s(lengths, table, _auto(cfg), 16) > ideal_tokens_per_s(lengths, table, off, 16)
    assert ideal_tokens_per_s(lengths, table, _auto(cfg), 16, two_d=True) == ideal_tokens_per_s(lengths, table, off, 16)


def test_bad_option_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"advanced.micro_batch_tokens \('tokens'\) is not one of \['off', 'auto'\]"):
        AdvancedConfig(micro_batch_tokens="tokens")


@settings(max_examples=30, deadline=None)
@given(world=st.sampled_from([512, 576, 1024]), rpn=st.sampled_from([4, 8]), per_rank=st.integers(0, 40),
       seed=st.integers(0, 3), method=st.sampled_from(["dcp-inter", "dcp-intra"]), gmax=st.integers(1, 4),
       cap_mib=st.sampled_from([6.0, 8.0, 24.0]), text=st.booleans())
def test_token_packed_large_worlds_keep_the_assembly_properties(world, rpn, per_rank, seed, method, gmax, cap_mib,
                                                                 text):
    """The numpy packer's worlds with token packs, memory limits that give one p several recompute depths, and
    fillers at a smaller p that run a pack in token chunks (a filler once priced a pack's chunks at the bound and
    broke the Gmax bound: 0.286 s beside a longest micro-batch of 0.254 s at gmax 1)."""
    from tests.unit.test_planner_ahead import _long_tailed

    cfg, table = make(world, method=method, rpn=rpn, gmax=gmax, seed=seed, cap_mib=cap_mib)
    n = per_rank * world + seed
    lengths = text_lengths(n, seed) if text else _long_tailed(n, seed)
    _check_epoch_properties(lengths, table, _auto(cfg), world, seed)
