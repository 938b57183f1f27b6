"""Load-balanced dynamic batching: budget, coverage, strategies, step-based looping, resume, config errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import ConfigError
from dcp.loaders import LoadBalancedBatcher, LoadBalancedConfig, LoaderError, lockstep_steps


def lognormal_lengths(n: int = 2000, seed: int = 0, cap: int = 4096) -> list[int]:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.5, 1.0, n), 1, cap).astype(int).tolist()


def finite(**kw) -> LoadBalancedConfig:
    return LoadBalancedConfig(infinite_loop=False, **kw)


def flat(steps):
    return [b for step in steps for b in step]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=4, max_size=120),
    budget=st.integers(300, 2000),
    pool=st.integers(1, 40),
    strategy=st.sampled_from(["prefer_closest", "prefer_first"]),
    packing=st.booleans(),
    world_size=st.integers(1, 4),
)
def test_budget_respected_and_every_sample_once(lengths, budget, pool, strategy, packing, world_size):
    cfg = finite(load_balanced_max_tokens_for_batch=budget, load_balanced_pool_size=pool,
                 load_balanced_batching_strategy=strategy, sequence_packing=packing)
    seen = []
    for rank in range(world_size):
        for b in flat(LoadBalancedBatcher(lengths, cfg, rank=rank, world_size=world_size)):
            assert 1 <= b.size <= pool
            assert b.padded_tokens <= budget
            if packing:
                assert b.rows == 1 and b.padded_len == b.tokens
            else:
                assert b.padded_len == max(b.seq_lens) and b.rows == b.size
            assert all(lengths[i] == n for i, n in zip(b.sample_ids, b.seq_lens, strict=True))
            seen += b.sample_ids
    assert sorted(seen) == list(range(len(lengths)))


def test_shards_are_disjoint_interleaved_slices_of_a_per_epoch_shuffle():
    lengths = lognormal_lengths(101)
    cfg = finite()
    shards = [LoadBalancedBatcher(lengths, cfg, rank=r, world_size=3).shard_for_epoch(0) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(101))
    assert [len(s) for s in shards] == [34, 34, 33]
    b = LoadBalancedBatcher(lengths, cfg, rank=0, world_size=3)
    e0, e1 = list(b.shard_for_epoch(0)), list(b.shard_for_epoch(1))
    assert e0 != e1 and sorted(e0) != sorted(e1)  # another epoch: another shuffle and another shard
    other_seed = LoadBalancedBatcher(lengths, finite(dataloader_seed=5), rank=0, world_size=3)
    assert other_seed.shard_for_epoch(0) != e0


def test_prefer_closest_pads_less_than_prefer_first_and_packing_not_at_all():
    lengths = lognormal_lengths()
    waste = {}
    for name, kw in {"closest": {}, "first": {"load_balanced_batching_strategy": "prefer_first"},
                     "packed": {"sequence_packing": True}}.items():
        bs = flat(LoadBalancedBatcher(lengths, finite(load_balanced_max_tokens_for_batch=8192, **kw),
                                      rank=0, world_size=2))
        waste[name] = 1 - sum(b.tokens for b in bs) / sum(b.padded_tokens for b in bs)
    assert waste["packed"] == 0.0
    assert waste["closest"] < waste["first"] - 0.15, waste


def test_prefer_first_takes_oldest_fitting_and_closest_the_least_padding():
    lengths = [100, 10, 90, 50]
    picks = {}
    for strategy in ("prefer_closest", "prefer_first"):
        b = LoadBalancedBatcher(lengths, finite(load_balanced_max_tokens_for_batch=200,
                                                load_balanced_batching_strategy=strategy), rank=0, world_size=1)
        b.pool = [0, 1, 2, 3]  # oldest first
        picks[strategy] = [b.pool[p] for p in b._best_fit(200)]
    # both start from the oldest sample (100 tokens); a third row would need 3 * 100 > 200 tokens
    assert picks["prefer_closest"] == [0, 2]  # 90 adds 10 padding tokens, 50 adds 50, 10 adds 90
    assert picks["prefer_first"] == [0, 1]


def test_batches_per_optimizer_step_and_max_num_steps():
    lengths = lognormal_lengths(500)
    cfg = LoadBalancedConfig(load_balanced_batches_per_optimizer_step=3, max_num_steps=50,
                             load_balanced_max_tokens_for_batch=4096)
    steps = list(LoadBalancedBatcher(lengths, cfg, rank=1, world_size=2))
    assert len(steps) == 50 and all(len(s) == 3 for s in steps)
    # 150 batches of a 250-sample shard: the data looped, the epoch advanced, every epoch's shard was used
    epochs = sorted({b.epoch for b in flat(steps)})
    assert epochs[0] == 0 and len(epochs) >= 2
    ids = [i for b in flat(steps) for i in b.sample_ids]
    assert len(ids) > 250


def test_finite_run_yields_a_last_partial_step_instead_of_dropping_it():
    lengths = [10] * 7
    cfg = finite(load_balanced_max_tokens_for_batch=20, load_balanced_batches_per_optimizer_step=3)
    steps = list(LoadBalancedBatcher(lengths, cfg, rank=0, world_size=1))
    assert [len(s) for s in steps] == [3, 1]
    assert sum(b.size for b in flat(steps)) == 7


def test_resume_from_state_dict_continues_with_identical_batches():
    lengths = lognormal_lengths(400)
    cfg = LoadBalancedConfig(max_num_steps=60, load_balanced_batches_per_optimizer_step=2,
                             load_balanced_max_tokens_for_batch=4096, load_balanced_pool_size=16, dataloader_seed=9)
    full = list(LoadBalancedBatcher(lengths, cfg, rank=1, world_size=3))
    first = LoadBalancedBatcher(lengths, cfg, rank=1, world_size=3)
    head = [next(first) for _ in range(37)]  # crosses at least one epoch boundary (133-sample shard)
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    resumed = LoadBalancedBatcher(lengths, cfg, rank=1, world_size=3)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    assert resumed.steps == 60
    replay = LoadBalancedBatcher(lengths, cfg, rank=1, world_size=3)
    replay.skip_steps(37)
    assert list(replay) == full[37:]


def test_set_epoch_restarts_deterministically():
    lengths = lognormal_lengths(300)
    b = LoadBalancedBatcher(lengths, finite(), rank=0, world_size=2)
    b.set_epoch(4)
    a = list(b)
    b.set_epoch(4)
    assert list(b) == a and a[0][0].epoch == 4


def test_load_state_dict_refuses_other_rank_world_or_config():
    lengths = lognormal_lengths(100)
    state = LoadBalancedBatcher(lengths, finite(), rank=0, world_size=2).state_dict()
    with pytest.raises(LoaderError, match=r"state_dict\['rank'\] \(0\) differs .*resume with the same"):
        LoadBalancedBatcher(lengths, finite(), rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(LoaderError, match=r"state_dict\['world_size'\] \(2\)"):
        LoadBalancedBatcher(lengths, finite(), rank=0, world_size=4).load_state_dict(state)
    with pytest.raises(LoaderError, match=r"state_dict\['num_samples'\] \(100\)"):
        LoadBalancedBatcher(lengths[:50], finite(), rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(LoaderError, match=r"state_dict\['config'\]"):
        LoadBalancedBatcher(lengths, finite(dataloader_seed=1), rank=0, world_size=2).load_state_dict(state)


def test_token_balance_across_ranks_beats_fixed_size_batches():
    lengths = lognormal_lengths(4000)
    ratio = {}
    for name, packing in (("padded", False), ("packed", True)):
        cfg = LoadBalancedConfig(max_num_steps=40, load_balanced_pool_size=64, load_balanced_max_tokens_for_batch=8192,
                                 sequence_packing=packing)
        steps = list(lockstep_steps(lengths, cfg, world_size=4))
        # the work a rank computes is its padded tokens (= real tokens when packing)
        work = np.array([[sum(b.padded_tokens for b in rank_step) for rank_step in step] for step in steps])
        assert work.shape == (40, 4)
        ratio[name] = float(np.mean(work.max(axis=1) / work.mean(axis=1)))
    # fixed-size batches of 16 samples (about as many tokens), same shuffle and shards, padded to the longest
    order = np.random.default_rng([0, 0]).permutation(len(lengths))
    fixed = np.array([[16 * max(lengths[i] for i in order[r::4][s * 16:(s + 1) * 16]) for r in range(4)]
                      for s in range(40)])
    ratio["fixed"] = float(np.mean(fixed.max(axis=1) / fixed.mean(axis=1)))
    assert ratio["padded"] < 1.1 and ratio["packed"] < 1.02 and ratio["fixed"] > 1.3, ratio


def test_sample_id_batches_feed_a_torch_batch_sampler():
    lengths = lognormal_lengths(64)
    b = LoadBalancedBatcher(lengths, finite(load_balanced_max_tokens_for_batch=2048), rank=0, world_size=1)
    batches = list(b.sample_id_batches())
    assert sorted(i for ids in batches for i in ids) == list(range(64))
    assert all(isinstance(ids, list) for ids in batches)


def test_oversized_sample_errors_or_runs_alone():
    lengths = [50, 5000, 60]
    with pytest.raises(LoaderError, match=r"lengths\[1\] \(5000\) exceeds .*load_balanced_max_tokens_for_batch \(1000\)"):
        flat(LoadBalancedBatcher(lengths, finite(load_balanced_max_tokens_for_batch=1000), rank=0, world_size=1))
    steps = flat(LoadBalancedBatcher(lengths, finite(load_balanced_max_tokens_for_batch=1000, oversized_samples="alone"),
                                     rank=0, world_size=1))
    assert [b.sample_ids for b in steps if 1 in b.sample_ids] == [(1,)]
    assert sorted(i for b in steps for i in b.sample_ids) == [0, 1, 2]


# ----- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"load_balanced_pool_size": 0}, r"train\.train_policy\.load_balanced_pool_size \(0\) must be >= 1: set"),
        ({"load_balanced_max_tokens_for_batch": -1}, r"train\.train_policy\.load_balanced_max_tokens_for_batch \(-1\) must be >= 1"),
        ({"load_balanced_batches_per_optimizer_step": 0}, r"load_balanced_batches_per_optimizer_step \(0\) must be >= 1"),
        ({"load_balanced_batching_strategy": "best"}, r"load_balanced_batching_strategy \('best'\) is not one of \['prefer_closest', 'prefer_first'\]"),
        ({"max_num_steps": -2}, r"train\.max_num_steps \(-2\) must be >= 0"),
        ({"max_num_steps": 0}, r"train\.max_num_steps \(0\) must be >= 1 when .*infinite_loop is true.*set max_num_steps"),
        ({"dataloader_seed": -1, "max_num_steps": 1}, r"train\.train_policy\.dataloader_seed \(-1\) must be >= 0"),
        ({"oversized_samples": "drop", "max_num_steps": 1}, r"oversized_samples \('drop'\) is not one of \['error', 'alone'\]"),
    ],
)
def test_config_errors_name_field_value_rule_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LoadBalancedConfig(**kwargs)


def test_from_dict_reads_the_documented_toml_layout():
    cfg = LoadBalancedConfig.from_dict({
        "train": {"max_num_steps": 1000, "sequence_packing": False, "train_policy": {
            "enable_dp_load_balancing": True, "load_balanced_pool_size": 64,
            "load_balanced_max_tokens_for_batch": 65536, "load_balanced_batching_strategy": "prefer_closest",
            "load_balanced_batches_per_optimizer_step": 4, "dataloader_seed": 42}}})
    assert (cfg.load_balanced_pool_size, cfg.load_balanced_batches_per_optimizer_step, cfg.max_num_steps) == (64, 4, 1000)
    alias = LoadBalancedConfig.from_dict({"max_num_steps": 5, "load_balanced_accumulate_steps": 2})
    assert alias.load_balanced_batches_per_optimizer_step == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"train": {"max_num_steps": 5}, "model": {}}, r"model \(\{\}\) is not a known section"),
        ({"max_num_steps": 5, "pool_size": 3}, r"train\.train_policy\.pool_size \(3\) is not a known key: valid keys are \[.*load_balanced_pool_size"),
        ({"max_num_steps": 5, "enable_dp_load_balancing": False}, r"enable_dp_load_balancing \(False\) is false: set it to true"),
        ({"max_num_steps": 5, "load_balanced_accumulate_steps": 2, "load_balanced_batches_per_optimizer_step": 3},
         r"load_balanced_accumulate_steps \(2\) contradicts load_balanced_batches_per_optimizer_step \(3\)"),
        ({"max_num_steps": "5"}, r"train\.max_num_steps \('5'\) must be of type int: write 5, an int without quotes"),
        ({"max_num_steps": 5, "sequence_packing": 1}, r"train\.sequence_packing \(1\) must be of type bool"),
        ({"max_num_steps": True}, r"train\.max_num_steps \(True\) must be of type int"),
    ],
)
def test_from_dict_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        LoadBalancedConfig.from_dict(raw)


@pytest.mark.parametrize(
    ("lengths", "rank", "world_size", "message"),
    [
        ([], 0, 1, r"lengths \(\[\]\) is empty"),
        ([3, 0, 2], 0, 1, r"lengths\[1\] \(0\) must be >= 1"),
        ([3, 5.7], 0, 1, r"lengths\[1\] \(5.7\) is not an integer"),  # refused, never truncated to 5
        ([3, 4], 2, 2, r"rank \(2\) must be in \[0, 2\)"),
        ([3, 4], 0, 0, r"world_size \(0\) must be >= 1"),
        ([3, 4], 0, 3, r"len\(lengths\) \(2\) is below world_size \(3\)"),
    ],
)
def test_batcher_argument_errors(lengths, rank, world_size, message):
    with pytest.raises(LoaderError, match=message):
        LoadBalancedBatcher(lengths, finite(), rank=rank, world_size=world_size)


def test_pool_larger_than_a_shard_is_refused_when_looping():
    with pytest.raises(LoaderError, match=r"load_balanced_pool_size \(32\) exceeds the smallest rank shard \(10 samples\)"):
        LoadBalancedBatcher([5] * 21, LoadBalancedConfig(max_num_steps=3), rank=0, world_size=2)
    assert LoadBalancedBatcher([5] * 21, finite(), rank=0, world_size=2).steps == 0  # fine without looping


def test_set_epoch_rejects_negative():
    b = LoadBalancedBatcher([1, 2], finite(), rank=0, world_size=1)
    with pytest.raises(LoaderError, match=r"epoch \(-1\) must be >= 0"):
        b.set_epoch(-1)
