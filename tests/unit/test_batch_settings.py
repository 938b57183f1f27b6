"""Batch settings the data cannot hold are refused, and settings without effect are named, before any work."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.config import AdvancedConfig, ConfigError, DCPConfig, PlanningConfig, RuntimeConfig
from dcp.planner.batch_settings import check_batch_settings

LENGTHS = [187, 1000, 4096, 300, 2500] * 20  # 161,660 tokens in all, the longest 4,096


def _cfg(runtime: dict | None = None, advanced: dict | None = None, **planning) -> DCPConfig:
    planning.setdefault("step_tokens_bounds", (0.5, 2.0))  # the figures below are at 0.5x-2x
    return DCPConfig(planning=PlanningConfig(**planning), runtime=RuntimeConfig(**(runtime or {})),
                     advanced=AdvancedConfig(**(advanced or {})))


def test_a_target_whose_upper_bound_is_below_the_median_sample_is_refused():
    with pytest.raises(ConfigError) as exc:
        check_batch_settings(LENGTHS, _cfg(tokens_per_step=1))
    msg = str(exc.value)
    assert msg.startswith("planning.tokens_per_step (1) x step_tokens_bounds high (2) is below the median sample "
                          "(1,000 tokens): every step holds at least one whole sample, so most steps would hold more "
                          "than 2x the target (the longest 4,096x)")
    assert msg.endswith("set tokens_per_step >= 2,731 (or 0 for the default batch)") and "\n" not in msg
    assert check_batch_settings(LENGTHS, _cfg(tokens_per_step=2731)) == []  # the fix it names is accepted


def test_lr_scaling_refuses_a_step_whose_lr_factor_would_pass_the_bounds():
    with pytest.raises(ConfigError) as exc:
        check_batch_settings(LENGTHS, _cfg({"lr_scaling": "linear"}, tokens_per_step=1500))
    assert str(exc.value) == (
        "planning.tokens_per_step (1500) x step_tokens_bounds high (2) is below the longest sample (4,096 tokens) "
        "with runtime.lr_scaling 'linear': the step of that sample alone would multiply the learning rate by "
        "x2.731, past the bounds' x2: set tokens_per_step >= 2,731 (or 0 for the default batch), or "
        'lr_scaling = "none"')
    with pytest.raises(ConfigError, match=r"by x1.652, past the bounds' x1.414"):
        check_batch_settings(LENGTHS, _cfg({"lr_scaling": "sqrt"}, tokens_per_step=1500))
    check_batch_settings(LENGTHS, _cfg({"lr_scaling": "linear"}, tokens_per_step=2731))


def test_a_long_tail_sample_above_the_bound_is_warned():
    (line,) = check_batch_settings(LENGTHS, _cfg(tokens_per_step=1500))
    assert line.startswith("planning.tokens_per_step (1,500) x step_tokens_bounds high (2) is below the longest "
                           "sample (4,096 tokens): 20 sample(s) above 3,000 tokens will each take a step alone")


def test_a_target_above_the_epoch_is_warned_with_what_happens():
    (line,) = check_batch_settings(LENGTHS, _cfg(tokens_per_step=10**7))
    assert line == ("planning.tokens_per_step (10,000,000) is above the epoch's 161,660 tokens (100 samples): the "
                    "epoch will be one step of 161,660 tokens; set tokens_per_step <= 161,660 for several steps")


def test_bounds_narrower_than_the_longest_sample_are_warned():
    (line,) = check_batch_settings(LENGTHS, _cfg(tokens_per_step=20000, step_tokens_bounds=(0.95, 1.05)))
    assert line.startswith("planning.step_tokens_bounds ([0.95, 1.05]) spans 2,000 tokens at a global batch of 20,000 tokens, "
                           "less than the longest sample (4,096): steps will fall outside [19,000, 21,000] tokens")
    assert line.endswith("e.g. [0.95, 1.16]")
    # the bounds it proposes span the longest sample: no warning
    assert check_batch_settings(LENGTHS, _cfg(tokens_per_step=20000, step_tokens_bounds=(0.95, 1.16))) == []


def test_equal_bounds_are_refused_by_the_config():
    with pytest.raises(ConfigError, match=r"^planning.step_tokens_bounds \(\[1.0, 1.0\]\) must be .* and low < high "
                                          r"\(whole samples cannot sum to exactly the global batch\): e.g. \[0.9, 1.1\]"):
        PlanningConfig(tokens_per_step=20000, step_tokens_bounds=(1, 1))


def test_bounds_without_a_batch_have_no_effect_only_under_method_steps():
    (line,) = check_batch_settings(LENGTHS, _cfg(step_tokens_bounds=(0.75, 1.5), advanced={"default_batch": "method"}))
    assert line.startswith('planning.step_tokens_bounds ([0.75, 1.5]) has no effect with advanced.default_batch "method"')
    # the default batch (4 x W samples of the mean, at least the longest) is derived, never warned about
    assert check_batch_settings(LENGTHS, _cfg(step_tokens_bounds=(0.75, 1.5))) == []


def test_a_batch_in_samples_is_checked_as_its_tokens_and_named_as_written():
    # 161,660 tokens / 100 samples: a mean of 1,616.6; 1 sample x 1.1 = 1,778 tokens, below the longest
    (line,) = check_batch_settings(LENGTHS, _cfg(samples_per_step=1, step_tokens_bounds=(0.9, 1.1)))
    assert line.startswith("planning.samples_per_step (1 = 1,617 tokens) x step_tokens_bounds high (1.1) is below "
                           "the longest sample (4,096 tokens)")
    with pytest.raises(ConfigError, match=r"^planning.samples_per_step \(1\) x step_tokens_bounds high"):
        check_batch_settings(LENGTHS, _cfg(samples_per_step=1, step_tokens_bounds=(0.9, 1.1),
                                           runtime={"lr_scaling": "linear"}))
    assert check_batch_settings(LENGTHS, _cfg()) == []


@pytest.mark.parametrize("method", ["dcp-intra", "bucket"])
def test_token_packs_by_default_warn_nowhere(method):
    # "auto" is the default: used where a DCP method's 1D packs win, no effect elsewhere (``dcp plan`` says which)
    assert check_batch_settings(LENGTHS, _cfg(method=method)) == []
    assert check_batch_settings(LENGTHS, _cfg(method=method, advanced={"micro_batch_tokens": "off"})) == []


def test_the_manager_refuses_before_any_work_and_logs_warnings_once():
    from dcp import set_manager
    from dcp.models import build_model
    from dcp.runtime.data import SyntheticTokenDataset

    model = build_model("t1d-tiny")
    data = SyntheticTokenDataset([64, 100, 200] * 4, vocab_size=model.config.vocab_size)
    base = DCPConfig(model=model.config.shape())
    bad = base.replace(planning=dataclasses.replace(base.planning, tokens_per_step=10))
    with pytest.raises(ConfigError, match=r"^planning.tokens_per_step \(10\) x step_tokens_bounds high"):
        set_manager(model, data, bad, plans=lambda epoch: [])
    noted = base.replace(planning=dataclasses.replace(base.planning, step_tokens_bounds=(0.5, 3.0)),
                         advanced=dataclasses.replace(base.advanced, default_batch="method"))
    # the records themselves: the 'dcp' logger's stream handler may hold an earlier test's captured stderr
    import logging

    seen: list[str] = []
    grab = logging.Handler()
    grab.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("dcp").addHandler(grab)
    try:
        set_manager(model, data, noted, plans=lambda epoch: [])
    finally:
        logging.getLogger("dcp").removeHandler(grab)
    assert sum("planning.step_tokens_bounds ([0.5, 3.0]) has no effect" in m for m in seen) == 1, seen


def test_the_default_batch_line_states_tokens_per_rank():
    from dcp.planner.step_tokens import batch_tokens

    # a small epoch: 1/16 of its 600 tokens is below the floor, 4 x 4 ranks x the mean 200 = 3,200 tokens
    tok, line = batch_tokens(DCPConfig(), [100, 300, 200], 4)
    assert tok == 3200 and "3,200 tokens per step = 800 per rank" in line and "planning.samples_per_step" in line
    # a long tail: 8 x the longest (80,000) is more than 16 x 1 rank x the mean (54,400)
    tok, line = batch_tokens(DCPConfig(), [100, 100, 10000] * 200, 1)
    assert tok == 80000 and "8 x the longest sample 10,000" in line
    # 1/16 of the epoch's 408,000 tokens (25,500) lies between the floor (4 x 1 x 3,400) and 8 x the longest
    assert batch_tokens(DCPConfig(), [100, 100, 10000] * 40, 1)[0] == 25500
