"""runtime.lr_scaling: a step's LR is its scheduled LR times the rule of its tokens over tokens_per_step."""

from __future__ import annotations

import math

import pytest
import torch

from dcp.loaders.lr_scaling import StepTokensLR


def _opt(lr: float = 0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


@pytest.mark.parametrize(("method", "rule"), [("linear", lambda k: k), ("sqrt", math.sqrt), ("none", lambda k: 1.0)])
def test_scaled_step_equals_the_rule(method, rule):
    opt = _opt()
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    lr = StepTokensLR(opt, tokens_per_step=1000, method=method)
    for step, tokens in enumerate([1000, 1500, 600, 2000]):
        lr.apply(tokens)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**step * rule(tokens / 1000))
        opt.step()
        lr.restore()  # the scheduler sees the scheduled LR: ExponentialLR does not compound the scaling
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)


def test_bad_arguments_name_them():
    with pytest.raises(ValueError, match="method"):
        StepTokensLR(_opt(), tokens_per_step=10, method="cube")
    with pytest.raises(ValueError, match="tokens_per_step"):
        StepTokensLR(_opt(), tokens_per_step=0, method="linear")
    with pytest.raises(ValueError, match="optimizer"):
        StepTokensLR(object(), tokens_per_step=10, method="linear")
