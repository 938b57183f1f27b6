"""runtime.lr_scaling: a step's LR is its scheduled LR times the rule of its tokens over tokens_per_step, in the
scaler and in a one-process manager run."""

from __future__ import annotations

import math

import pytest
import torch

from dcp.runtime.lr import StepTokensLR


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
    with pytest.raises(ValueError, match=r"runtime.lr_scaling \('cube'\) is not one of"):
        StepTokensLR(_opt(), tokens_per_step=10, method="cube")
    with pytest.raises(ValueError, match=r"planning.tokens_per_step \(0\) must be >= 1"):
        StepTokensLR(_opt(), tokens_per_step=0, method="linear")
    with pytest.raises(ValueError, match=r"optimizer \(object\) has no param_groups"):
        StepTokensLR(object(), tokens_per_step=10, method="linear")


def _manager_run(method: str):
    from dcp.api import set_manager
    from dcp.config import DCPConfig, PlanningConfig, RuntimeConfig
    from dcp.models import T1DConfig, Transformer1D
    from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
    from dcp.runtime.data import SyntheticTokenDataset

    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset([6, 9, 4, 7, 5, 3], vocab_size=model.config.vocab_size)
    lens = data.lengths()

    def plan(step, ids):
        mbs = tuple(MicroBatch((i,), (lens[i],), 0) for i in ids)
        return StepPlan(0, step, 1, "dcp-intra", (GroupPlan(0, 1, 0, mbs),))

    plans = [plan(0, (0, 1, 2, 3)), plan(1, (4, 5))]  # 26 and 8 tokens
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    cfg = DCPConfig(model=model.config.shape(), planning=PlanningConfig(tokens_per_step=13, sp_sizes=(1,)),
                    runtime=RuntimeConfig(lr_scaling=method))
    mgr = set_manager(model, data, cfg, optimizer=opt, lr_scheduler=sched, plans=lambda e: plans)
    seen = []
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, mgr.engine)
        seen.append(opt.param_groups[0]["lr"])
        loss = mgr.engine(batch)
        mgr.engine.backward(loss)
        mgr.engine.step()
    return seen, opt.param_groups[0]["lr"]


@pytest.mark.parametrize(("method", "rule"), [("linear", lambda k: k), ("sqrt", math.sqrt)])
def test_manager_scales_each_step_by_its_tokens(method, rule):
    seen, after = _manager_run(method)
    assert seen[:4] == [pytest.approx(0.1 * rule(26 / 13))] * 4  # step 0: 26 tokens, scheduled LR 0.1
    assert seen[4:] == [pytest.approx(0.05 * rule(8 / 13))] * 2  # step 1: 8 tokens, the schedule halved it
    assert after == pytest.approx(0.025)  # the scheduler never saw a scaled LR


def test_deepspeed_engine_refuses_lr_scaling():
    from types import SimpleNamespace

    from dcp.config import ConfigError
    from dcp.runtime.lr import step_lr

    cfg = SimpleNamespace(runtime=SimpleNamespace(lr_scaling="sqrt"), planning=SimpleNamespace(tokens_per_step=8))
    with pytest.raises(ConfigError, match="not supported with the deepspeed engine"):
        step_lr(cfg, SimpleNamespace(ds=object(), optimizer=_opt()))
