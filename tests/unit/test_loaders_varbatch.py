"""Variable batch size (token-budget micro-batches) and its LR scaling wrapper."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.config import ConfigError
from dcp.loaders import LoaderError, VariableBatchConfig, plan_variable_batches, shuffled_order
from dcp.loaders.curriculum import curriculum_order
from dcp.loaders.lr_scaling import BatchSizeScaledLR, scale_lr


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=150),
    budget_units=st.integers(8, 40),
    ga=st.integers(1, 3),
    world_size=st.integers(1, 4),
    padding=st.booleans(),
    same_shape=st.booleans(),
    multiple=st.sampled_from([1, 8]),
)
def test_every_sample_once_budget_respected(lengths, budget_units, ga, world_size, padding, same_shape, multiple):
    same_shape = same_shape and padding
    cfg = VariableBatchConfig(max_tokens_per_batch=budget_units * multiple * 8, ga_steps=ga, count_padding=padding,
                              same_shape_micro_batches=same_shape, pad_to_multiple_of=multiple)
    order = shuffled_order(len(lengths), 1, 0)
    steps = plan_variable_batches(order, lengths, cfg, world_size)
    flat = []
    for s in steps:
        assert len(s.micro_batches) == world_size
        assert all(len(mbs) <= ga for mbs in s.micro_batches)
        # dealt round-robin: reading micro-step by micro-step, rank by rank gives the stream order back
        for j in range(ga):
            for r in range(world_size):
                if j < len(s.micro_batches[r]):
                    flat += s.micro_batches[r][j].sample_ids
        for mb in (b for mbs in s.micro_batches for b in mbs):
            assert mb.padded_tokens <= cfg.max_tokens_per_batch
            if padding:
                assert mb.padded_len % multiple == 0 and mb.padded_len >= max(mb.seq_lens, default=0)
        if same_shape:
            assert len({b.shape for mbs in s.micro_batches for b in mbs}) == 1
    assert flat == order
    assert sum(s.batch_size for s in steps) == len(lengths)


def test_short_samples_make_large_batches_and_long_ones_small():
    lengths = [3] * 40 + [15] * 8  # the seed's illustration: 30 tokens per batch
    steps = plan_variable_batches(curriculum_order(lengths), lengths,
                                  VariableBatchConfig(max_tokens_per_batch=30, count_padding=False), world_size=1)
    assert [s.batch_size for s in steps] == [10, 10, 10, 10, 2, 2, 2, 2]
    assert all(s.tokens == 30 for s in steps)


def test_curriculum_order_with_ranks_gives_each_rank_a_budget_of_tokens_per_step():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6, 0.8, 3000), 8, 2048).astype(int).tolist()
    steps = plan_variable_batches(curriculum_order(lengths), lengths,
                                  VariableBatchConfig(max_tokens_per_batch=4096, ga_steps=2), world_size=4)
    sizes = [s.batch_size for s in steps]
    assert sizes[0] > 4 * sizes[-2]  # batches shrink as lengths grow along the curriculum
    full = steps[:-1]
    work = np.array([[sum(b.padded_tokens for b in s.for_rank(r)) for r in range(4)] for s in full])
    assert float(np.mean(work.max(axis=1) / work.mean(axis=1))) < 1.05


def test_same_shape_micro_batches_hold_fewer_samples_and_pad_rows():
    lengths = [10, 10, 10, 20, 20, 20, 20, 20]
    cfg = VariableBatchConfig(max_tokens_per_batch=60, ga_steps=2, same_shape_micro_batches=True)
    steps = plan_variable_batches(list(range(8)), lengths, cfg, world_size=1)
    # step 0: 20-token rows allow 3 per micro-batch, 6 per step; samples 0..5 -> 2 micro-batches of 3 rows
    assert [[b.sample_ids for b in s.for_rank(0)] for s in steps] == [[(0, 1, 2), (3, 4, 5)], [(6,), (7,)]]
    assert [b.shape for b in steps[1].for_rank(0)] == [(1, 20), (1, 20)]
    free = plan_variable_batches(list(range(8)), lengths, VariableBatchConfig(max_tokens_per_batch=60, ga_steps=2), 1)
    assert [[b.sample_ids for b in s.for_rank(0)] for s in free] == [[(0, 1, 2), (3, 4, 5)], [(6, 7)]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens_per_batch": 0}, r"varbatch\.max_tokens_per_batch \(0\) must be >= 1"),
        ({"ga_steps": 0}, r"varbatch\.ga_steps \(0\) must be >= 1"),
        ({"pad_to_multiple_of": 0}, r"varbatch\.pad_to_multiple_of \(0\) must be >= 1"),
        ({"same_shape_micro_batches": True, "count_padding": False},
         r"varbatch\.same_shape_micro_batches \(True\) needs varbatch\.count_padding = true"),
        ({"max_tokens_per_batch": 100, "pad_to_multiple_of": 8},
         r"varbatch\.max_tokens_per_batch \(100\) is not a multiple of varbatch\.pad_to_multiple_of \(8\)"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        VariableBatchConfig(**kwargs)


@pytest.mark.parametrize(
    ("order", "lengths", "world_size", "message"),
    [
        ([0], [5], 0, r"world_size \(0\) must be >= 1"),
        ([0, 3], [5, 6], 1, r"order \(3\) is not a sample id in \[0, 2\)"),
        ([0, 1], [5, 60], 1, r"lengths\[1\] \(60\) exceeds varbatch\.max_tokens_per_batch \(32\)"),
        ([0], [], 1, r"lengths \(\[\]\) is empty"),
    ],
)
def test_plan_argument_errors(order, lengths, world_size, message):
    with pytest.raises(LoaderError, match=message):
        plan_variable_batches(order, lengths, VariableBatchConfig(max_tokens_per_batch=32), world_size)


# ----- LR scaling --------------------------------------------------------------------------------------
def test_scale_lr_exact_values():
    # reference LR 1e-3 tuned for 2 samples; batches of 10 and 4 samples (the seed's example)
    assert scale_lr(2, 10, 1e-3, "linear") == pytest.approx(5e-3, rel=1e-15)
    assert scale_lr(2, 4, 1e-3, "linear") == pytest.approx(2e-3, rel=1e-15)
    assert scale_lr(2, 8, 1e-3, "sqrt") == pytest.approx(2e-3, rel=1e-15)
    assert scale_lr(2, 4, 1e-3, "sqrt") == pytest.approx(math.sqrt(2) * 1e-3, rel=1e-15)
    assert scale_lr(4, 1, 0.1, "sqrt") == pytest.approx(0.05, rel=1e-15)
    assert scale_lr(2, 10, 1e-3, "none") == 1e-3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 4, 1e-3, "linear"), r"reference_batch_size \(0\) must be >= 1"),
        ((2, -1, 1e-3, "linear"), r"batch_size \(-1\) must be >= 0"),
        ((2, 4, 1e-3, "cubic"), r"method \('cubic'\) is not one of \['none', 'linear', 'sqrt'\]"),
    ],
)
def test_scale_lr_errors(args, message):
    with pytest.raises(LoaderError, match=message):
        scale_lr(*args)


def _opt(lr=1e-3, groups=1):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(groups)]
    return torch.optim.SGD([{"params": [p], "lr": lr * (g + 1)} for g, p in enumerate(params)])


def test_wrapper_on_a_plain_optimizer_scales_each_step():
    opt = _opt(groups=2)
    sched = BatchSizeScaledLR(opt, reference_batch_size=2, method="linear", batch_sizes=[10, 4, 2])
    assert sched.get_last_lr() == pytest.approx([5e-3, 10e-3], rel=1e-15)
    opt.step()
    sched.step()
    assert sched.get_last_lr() == pytest.approx([2e-3, 4e-3], rel=1e-15)
    opt.step()
    sched.step(next_batch_size=8)  # an explicit size overrides the list
    assert sched.get_last_lr() == pytest.approx([4e-3, 8e-3], rel=1e-15)
    assert sched.get_unscaled_lr() == pytest.approx([1e-3, 2e-3], rel=1e-15)


@pytest.mark.parametrize("method", ["linear", "sqrt"])
def test_wrapper_does_not_compound_with_schedulers_that_read_group_lr(method):
    sizes = [10, 4, 7, 2, 16, 3]
    factor = {"linear": lambda b: b / 2, "sqrt": lambda b: math.sqrt(b / 2)}[method]
    opt = _opt()
    base = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)  # next lr = group['lr'] * gamma
    sched = BatchSizeScaledLR(base, reference_batch_size=2, method=method, batch_sizes=sizes)
    for step, b in enumerate(sizes):
        assert sched.get_last_lr()[0] == pytest.approx(1e-3 * 0.5**step * factor(b), rel=1e-12)
        assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0]  # what the optimizer will use
        opt.step()
        if step + 1 < len(sizes):
            sched.step()


def test_wrapper_with_lambda_and_step_schedulers_and_resume():
    opt = _opt(lr=0.1)
    base = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    sched = BatchSizeScaledLR(base, reference_batch_size=4, method="sqrt", first_batch_size=16)
    assert sched.get_last_lr()[0] == pytest.approx(0.2, rel=1e-15)
    for b in (4, 1):
        opt.step()
        sched.step(b)
    assert sched.get_last_lr()[0] == pytest.approx(0.1 / 3 * 0.5, rel=1e-12)
    state = sched.state_dict()
    opt2 = _opt(lr=0.1)
    restored = BatchSizeScaledLR(torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s)),
                                 reference_batch_size=4, method="sqrt", first_batch_size=1)
    restored.load_state_dict(state)
    assert restored.get_last_lr() == sched.get_last_lr() and restored.last_step == 2
    opt.step()
    sched.step(9)
    opt2.step()
    restored.step(9)
    assert restored.get_last_lr() == pytest.approx(sched.get_last_lr(), rel=1e-15)
    assert restored.get_last_lr()[0] == pytest.approx(0.1 / 4 * 1.5, rel=1e-12)

    step_opt = _opt(lr=1.0)
    step_sched = BatchSizeScaledLR(torch.optim.lr_scheduler.StepLR(step_opt, step_size=2, gamma=0.1),
                                   reference_batch_size=1, batch_sizes=[3, 3, 3, 3])
    seen = []
    for _ in range(3):
        seen.append(step_sched.get_last_lr()[0])
        step_opt.step()
        step_sched.step()
    seen.append(step_sched.get_last_lr()[0])
    assert seen == pytest.approx([3.0, 3.0, 0.3, 0.3], rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "cubic", "first_batch_size": 1}, r"method \('cubic'\) is not one of"),
        ({"reference_batch_size": 0, "first_batch_size": 1}, r"reference_batch_size \(0\) must be >= 1"),
        ({"batch_sizes": []}, r"batch_sizes \(\[\]\) is empty"),
        ({}, r"first_batch_size \(None\) is required when batch_sizes is None"),
    ],
)
def test_wrapper_construction_errors(kwargs, message):
    kwargs.setdefault("reference_batch_size", 2)
    with pytest.raises(LoaderError, match=message):
        BatchSizeScaledLR(_opt(), **kwargs)


def test_wrapper_runtime_errors():
    with pytest.raises(LoaderError, match=r"base \('int'\) is neither a torch optimizer nor an LR scheduler"):
        BatchSizeScaledLR(3, reference_batch_size=2, first_batch_size=2)
    sched = BatchSizeScaledLR(_opt(), reference_batch_size=2, batch_sizes=[2])
    with pytest.raises(LoaderError, match=r"step \(1\) is past the end of batch_sizes \(1 steps\)"):
        sched.step()
    no_list = BatchSizeScaledLR(_opt(), reference_batch_size=2, first_batch_size=2)
    with pytest.raises(LoaderError, match=r"batch_size \(None\) is required when the wrapper has no batch_sizes"):
        no_list.step()
    other = BatchSizeScaledLR(_opt(), reference_batch_size=3, first_batch_size=2)
    with pytest.raises(LoaderError, match=r"state_dict\['reference_batch_size'\] \(2\) differs"):
        other.load_state_dict(no_list.state_dict())
