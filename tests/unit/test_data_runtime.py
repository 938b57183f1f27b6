"""Pure runtime pieces: per-sample randomness, datasets, loss weights, DeepSpeed config, and a one-process
manager (W=1, no process group): its error paths and its checkpoint state."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from dcp.api import set_manager
from dcp.config import ConfigError, DCPConfig, ModelShapeConfig, PlanningConfig
from dcp.models import T1DConfig, Transformer1D
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.data import (
    DatasetError,
    SyntheticTokenDataset,
    SyntheticVideoDataset,
    check_dataset,
    sample_generator,
    target_counts,
)
from dcp.runtime.engines import EngineError, build_engine, deepspeed_config
from dcp.runtime.log import StepStats
from dcp.runtime.manager import ManagerError
from dcp.runtime.weighting import WeightingError, check_step_count, micro_batch_weight, step_normaliser


# ----- per-sample randomness ---------------------------------------------------------------------------
def test_sample_generator_depends_only_on_seed_epoch_and_id():
    draw = lambda *key: torch.randn(4, generator=sample_generator(*key))  # noqa: E731
    torch.manual_seed(123)  # the global RNG must not matter
    a = draw(0, 1, 5)
    torch.manual_seed(999)
    assert torch.equal(a, draw(0, 1, 5))
    assert not torch.equal(a, draw(0, 2, 5)) and not torch.equal(a, draw(0, 1, 6)) and not torch.equal(a, draw(1, 1, 5))


def test_token_dataset_content_and_targets():
    data = SyntheticTokenDataset([5, 3], vocab_size=11, seed=2)
    assert data.lengths() == [5, 3] and data.target_counts() == [4, 2] and len(data) == 2
    batch = data.collate([data[1], data[0]])
    assert batch.sample_ids == (1, 0) and batch.seq_lens == (3, 5)
    assert int((batch.targets != -100).sum()) == 6
    first = data[0][1]
    data.set_epoch(1)
    assert not torch.equal(first, data[0][1])  # per-epoch content
    data.set_epoch(0)
    assert torch.equal(first, data[0][1])


def test_video_dataset_fixed_latent_per_epoch_noise():
    data = SyntheticVideoDataset([(2, 3), (1, 4)], in_channels=3, seed=0)
    assert data.lengths() == [6, 4] == data.target_counts()
    _, x0, n0 = data[0]
    data.set_epoch(1)
    _, x1, n1 = data[0]
    assert not torch.equal(n0, n1) and x0.shape == (2, 3, 3)
    batch = data.collate([data[0], data[1]])
    assert batch.shapes == ((2, 3), (1, 4)) and batch.inputs.shape == (2, 2, 4, 3)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: SyntheticTokenDataset([1, 4], vocab_size=5), "must be >= 2"),
        (lambda: SyntheticTokenDataset([4], vocab_size=0), "vocab_size"),
        (lambda: SyntheticVideoDataset([(0, 3)], in_channels=2), "T >= 1"),
        (lambda: SyntheticVideoDataset([(1, 3)], in_channels=2, out_channels=3), "out_channels"),
    ],
)
def test_dataset_constructor_errors(make, words):
    with pytest.raises(DatasetError, match=words):
        make()


def test_check_dataset_protocol_errors():
    with pytest.raises(DatasetError, match="lacks"):
        check_dataset([1, 2, 3])

    class Bad(SyntheticTokenDataset):
        def lengths(self):
            return [3, 0]

        def target_counts(self):
            return [1]

    bad = Bad([3, 3], vocab_size=4)
    with pytest.raises(DatasetError, match="non-positive"):
        check_dataset(bad)
    with pytest.raises(DatasetError, match=r"one count per sample \(2\), got 1 entries"):
        target_counts(bad, [3, 3])

    class Negative(SyntheticTokenDataset):
        def target_counts(self):
            return [3, -1, 4]

    with pytest.raises(DatasetError, match=r"negative counts \(index, count\) \[\(1, -1\)\]: each must be >= 0"):
        target_counts(Negative([3, 3, 4], vocab_size=4), [3, 3, 4])

    class Short(SyntheticTokenDataset):
        def lengths(self):
            return [3]

    with pytest.raises(DatasetError, match="one token count per sample"):
        check_dataset(Short([3, 3], vocab_size=4))


# ----- loss weights ------------------------------------------------------------------------------------
def _plan() -> StepPlan:
    a = MicroBatch(sample_ids=(0, 1), seq_lens=(5, 3), seq_group=0)
    b = MicroBatch(sample_ids=(2,), seq_lens=(9,), seq_group=1)
    groups = (GroupPlan(first_rank=0, sp_size=2, recompute_layers=0, micro_batches=(b,)),
              GroupPlan(first_rank=2, sp_size=1, recompute_layers=0, micro_batches=(a,)),
              GroupPlan(first_rank=3, sp_size=1, recompute_layers=0, micro_batches=()))
    return StepPlan(epoch=0, step=0, world_size=4, method="dcp-intra", groups=groups)


def test_weights_are_global_token_and_sample_counts_never_ga_or_world():
    plan, counts = _plan(), [4, 2, 8]
    assert step_normaliser(plan, counts, "tokens") == 14
    assert step_normaliser(plan, counts, "samples") == 3
    mb_a = plan.groups[1].micro_batches[0]
    assert micro_batch_weight(mb_a, 14, counts, "tokens", 1) == pytest.approx(1 / 14)
    assert micro_batch_weight(mb_a, 14, counts, "tokens", 4) == pytest.approx(4 / 14)  # engine averages over W
    assert micro_batch_weight(mb_a, 3, counts, "samples", 1) == pytest.approx(2 / (3 * 6))
    assert micro_batch_weight(mb_a, 0, counts, "tokens", 1) == 0.0
    with pytest.raises(WeightingError, match="loss_weighting"):
        step_normaliser(plan, counts, "mean")
    with pytest.raises(WeightingError, match="loss_weighting"):
        micro_batch_weight(mb_a, 3, counts, "mean", 1)
    check_step_count(0, 14, 14)
    with pytest.raises(WeightingError, match="target_counts"):
        check_step_count(0, 14, 17)


def test_step_stats_measured_idle_and_line():
    s = StepStats(epoch=0, step=1, global_step=2, loss=1.5, count=10, tokens=100, step_time_s=0.5,
                  busy_s=(1.0, 0.5), predicted_idle=0.2, summary="sp=[1,1]")
    assert s.tokens_per_s == 200 and s.measured_idle == pytest.approx(0.25)
    assert "loss 1.5000" in s.line() and "sp=[1,1]" in s.line()


# ----- engines -----------------------------------------------------------------------------------------
def test_deepspeed_config_derives_batch_fields_in_one_place():
    cfg = deepspeed_config(6, user_config={"gradient_clipping": 1.0, "zero_optimization": {"overlap_comm": False}})
    assert cfg["train_batch_size"] == 6 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["managed_gradient_accumulation"] is False and cfg["gradient_clipping"] == 1.0
    assert cfg["zero_optimization"] == {"stage": 1, "overlap_comm": False}
    assert deepspeed_config(2)["gradient_clipping"] == 0.0
    with pytest.raises(EngineError, match="set by DCP"):
        deepspeed_config(2, user_config={"gradient_accumulation_steps": 4})
    with pytest.raises(EngineError, match="zero_stage"):
        deepspeed_config(2, zero_stage=3)
    with pytest.raises(EngineError, match="must be 1"):
        deepspeed_config(2, user_config={"zero_optimization": {"stage": 2}})


def test_build_engine_errors():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(EngineError, match="not one of"):
        build_engine("fsdp", model, None, None, world_size=1)
    with pytest.raises(EngineError, match="optimizer"):
        build_engine("ddp", model, None, None, world_size=1)
    # a model already wrapped in torch DDP would all-reduce on every backward: refused with the fix
    wrapped = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    torch.nn.Module.__init__(wrapped)
    with pytest.raises(EngineError, match=r"model \(DistributedDataParallel\) must be the plain module: pass model.module"):
        build_engine("ddp", wrapped, torch.optim.SGD(model.parameters(), lr=0.1), None, world_size=1)


def test_deepspeed_without_caller_owned_accumulation_is_refused(monkeypatch):
    deepspeed = pytest.importorskip("deepspeed")

    class OldEngine:  # what a DeepSpeed that ignores managed_gradient_accumulation reports
        def managed_gradient_accumulation(self):
            return True

    monkeypatch.setattr(deepspeed, "initialize", lambda **kw: (OldEngine(), kw["optimizer"], None, None))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(EngineError, match=r"does not honour managed_gradient_accumulation=false.*deepspeed>=0.19.4"):
        build_engine("deepspeed", model, torch.optim.SGD(model.parameters(), lr=0.1), None, world_size=1)


# ----- one-process manager -----------------------------------------------------------------------------
def _one_rank(lengths=(6, 9, 4, 7), **kwargs):
    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset(list(lengths), vocab_size=model.config.vocab_size)
    lens = data.lengths()
    mbs = tuple(MicroBatch(sample_ids=(i,), seq_lens=(lens[i],), seq_group=0) for i in range(len(lens)))
    plan = StepPlan(epoch=0, step=0, world_size=1, method="dcp-intra",
                    groups=(GroupPlan(first_rank=0, sp_size=1, recompute_layers=2, micro_batches=mbs),))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mgr = set_manager(model, data, optimizer=opt, plans=lambda e: [plan], **kwargs)
    return mgr, model


def test_single_process_manager_runs_the_paper_loop(caplog):
    mgr, model = _one_rank()
    assert not mgr.need_profile()  # an explicit plan source needs no table
    with caplog.at_level(logging.INFO, logger="dcp"):
        n = 0
        for batch in mgr.get_data_iter():
            ctx = mgr.optimize_dynamics(batch, mgr.engine)
            assert ctx.recompute_layers == 2 and mgr.group is None and mgr.gas == 4
            with mgr.profile(batch, mgr.engine, mgr.gas):
                loss = mgr.engine(batch)
                mgr.engine.backward(loss)
                stepped = mgr.engine.step()
            n += 1
            assert stepped == (n == 4)  # the optimizer steps only at the group's ga boundary
    assert mgr.epoch == 1 and mgr.global_step == 1 and len(mgr.step_stats) == 1
    stats = mgr.step_stats[0]
    assert stats.count == 22 and math.isfinite(stats.loss) and stats.busy_s[0] > 0
    assert len(mgr.measurements) == 4


def test_forgetting_engine_step_is_an_error():
    mgr, _ = _one_rank()
    with pytest.raises(ManagerError, match="engine.step"):
        for batch in mgr.get_data_iter():
            loss = mgr.engine(batch)
            mgr.engine.backward(loss)


def test_wrong_batch_and_out_of_loop_calls_are_errors():
    mgr, _ = _one_rank()
    with pytest.raises(ManagerError, match="outside get_data_iter"):
        mgr.optimize_dynamics(None)
    it = mgr.get_data_iter()
    next(it)
    other = mgr.dataset.collate([mgr.dataset[3]])
    with pytest.raises(ManagerError, match=r"sample_ids \(3,\) are not the planned micro-batch .* let "
                                           r"dataset.collate\(samples\) give each sample's id"):
        mgr.optimize_dynamics(other)


def test_recompute_switch_follows_plan():
    mgr, model = _one_rank()
    batch = next(mgr.get_data_iter())
    mgr.optimize_dynamics(batch)
    hidden, aux = model.layer_inputs(batch, mgr.ctx)
    calls = []
    for layer in model.layers:
        calls.append(layer.layer_index < mgr.ctx.recompute_layers)
        hidden = mgr.recompute(layer, hidden, mgr.ctx, aux)
    assert calls == [True, True, False, False] and hidden.requires_grad


def test_state_dict_round_trip_and_fingerprint():
    mgr, _ = _one_rank()
    for batch in mgr.get_data_iter():
        mgr.train_micro_batch(batch)
    state = mgr.state_dict()
    fresh, _ = _one_rank()
    fresh.load_state_dict(state)
    assert (fresh.epoch, fresh.step_in_epoch, fresh.global_step) == (1, 0, 1)
    other, _ = _one_rank(lengths=(6, 9, 4, 8))
    from dcp.runtime.position import PositionError

    with pytest.raises(PositionError, match=r"checkpoint was saved on another dataset .* resume with the dataset"):
        other.load_state_dict(state)


def test_config_errors_heads_and_missing_config():
    with pytest.raises(ConfigError, match="do not divide"):
        DCPConfig(model=ModelShapeConfig(num_heads=6, hidden_size=48), planning=PlanningConfig(sp_sizes=(1, 4)))
    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset([4, 5], vocab_size=model.config.vocab_size)
    wrong = DCPConfig(model=ModelShapeConfig(num_heads=4, hidden_size=64), planning=PlanningConfig(sp_sizes=(1, 2)))
    with pytest.raises(ConfigError, match=r"model\.num_heads \(4\) differs from the model.s \(8, "):
        set_manager(model, data, wrong, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="cannot be derived"):
        set_manager(torch.nn.Linear(2, 2), data, optimizer=None)


def test_plan_world_size_engine_detached_and_missing_deepspeed_errors(monkeypatch):
    import sys

    from dcp.runtime.engines import DDPEngine
    from dcp.runtime.manager import PlanMismatchError

    # a plan made for another world size is refused before anything runs
    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset([6, 9], vocab_size=model.config.vocab_size)
    mb0 = MicroBatch(sample_ids=(0,), seq_lens=(6,), seq_group=0)
    mb1 = MicroBatch(sample_ids=(1,), seq_lens=(9,), seq_group=0)
    plan = StepPlan(epoch=0, step=0, world_size=2, method="dcp-intra", groups=(
        GroupPlan(first_rank=0, sp_size=1, recompute_layers=0, micro_batches=(mb0,)),
        GroupPlan(first_rank=1, sp_size=1, recompute_layers=0, micro_batches=(mb1,))))
    mgr = set_manager(model, data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), plans=lambda e: [plan])
    with pytest.raises(PlanMismatchError, match=r"plan world_size \(2\) != torch.distributed world size \(1\)"):
        next(mgr.get_data_iter())
    # an engine built by hand, outside set_manager, says how to attach it
    engine = DDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(EngineError, match="not attached to a manager: build it through dcp.set_manager"):
        engine(data.collate([data[0]]))
    # engine = "deepspeed" without DeepSpeed installed names the package to install
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(EngineError, match=r"runtime.engine \('deepspeed'\) needs DeepSpeed .*pip install deepspeed"):
        build_engine("deepspeed", model, torch.optim.SGD(model.parameters(), lr=0.1), None, world_size=1)
