"""The manager's parts: engines drive it only through EngineHooks, the step state is a value,
the profiler reaches it by injection, the runtime imports nothing above it."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch

from dcp.config import AdvancedConfig, DCPConfig, RuntimeConfig
from dcp.models import T1DConfig, Transformer1D
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime import checkpoint as ckpt
from dcp.runtime import profiling
from dcp.runtime.engines import DDPEngine
from dcp.runtime.hooks import EngineHooks
from dcp.runtime.manager import DCPManager
from dcp.runtime.profiling import TableLoader
from dcp.runtime.step import ManagerError, OpenStep, StepTally
from dcp.runtime.stepview import RankStep

RUNTIME = Path(__file__).resolve().parents[2] / "dcp" / "runtime"


def _plan(ga: int) -> StepPlan:
    mbs = tuple(MicroBatch(sample_ids=(k,), seq_lens=(8,), seq_group=0) for k in range(ga))
    return StepPlan(epoch=0, step=0, world_size=1, method="dcp-intra",
                    groups=(GroupPlan(first_rank=0, sp_size=1, recompute_layers=0, micro_batches=mbs),))


def test_the_manager_implements_every_engine_hook():
    hooks = [n for n, v in vars(EngineHooks).items() if callable(v) and not n.startswith("_")]
    assert set(hooks) >= {"before_forward", "after_forward", "loss_weight", "in_last_micro_batch", "at_boundary",
                          "watch", "step_done", "collective"}
    missing = [n for n in hooks if not callable(getattr(DCPManager, n, None))]
    assert not missing, missing


def test_engines_touch_no_private_member_of_the_manager():
    # before: mgr._at_boundary(), mgr._watch, mgr._step_done, mgr._loss_weight, mgr._collective
    tree = ast.parse((RUNTIME / "engines.py").read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "mgr") or (
                    isinstance(base, ast.Call) and getattr(base.func, "attr", "") == "_manager"):
                bad.append(f"line {node.lineno}: .{node.attr}")
    assert not bad, bad


def test_the_runtime_imports_no_package_above_it():
    above = ("dcp.profiler", "dcp.integrations", "dcp.models", "dcp.api", "dcp.experiments")
    bad = []
    for path in RUNTIME.glob("*.py"):
        if path.name.startswith("bench"):
            continue  # benchmarks are tools (they move to dcp/bench)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith(above)]
    assert not bad, bad


def test_open_step_knows_its_last_micro_batch_and_finishes_into_a_value():
    plan = _plan(2)
    view = RankStep.of(plan, plan.groups[0], n_step=14, trained=None)
    step = OpenStep(view=view, group=view.group, global_step=1, t0=1.0, tally=StepTally.zeros("cpu"))
    assert step.plan is plan and (view.epoch, view.step, view.tokens) == (plan.epoch, plan.step, plan.tokens)
    assert (step.n_step, step.trained) == (14, None)  # read from the view, not copied
    assert not step.in_last_micro_batch()
    step.mb_index = 1
    assert step.in_last_micro_batch()
    step.tally.add(torch.tensor(3.0), 7)
    step.open = False
    assert not step.in_last_micro_batch()  # after the step's sync nothing is "in" it
    done = step.finish(3.5)
    assert done.step_time_s == 2.5 and done.global_step == 1
    loss, count, busy = done.host_stats()
    assert float(loss) == 3.0 and int(count) == 7 and busy == 0.0
    with pytest.raises(AttributeError):
        done.step_time_s = 0.0  # frozen


def test_checkpoint_position_round_trips_and_refuses_another_run():
    import numpy as np

    from dcp.runtime.position import EpochPosition, PositionError

    position = EpochPosition.start(1, 5)
    position.record(np.array([0, 3]), 0)
    data = ckpt.data_digest(None, [5, 6, 7, 8, 9], [4, 5, 6, 7, 8], None)
    state = ckpt.state_dict(position, 9, data)
    assert state["samples_done"] == 2 and state["step_in_epoch"] == 1
    back, global_step = ckpt.load_state_dict(state, data=data, num_samples=5, legacy_fp="")
    assert global_step == 9 and back.epoch == 1 and back.done.tolist() == [True, False, False, True, False]
    other = ckpt.data_digest(None, [5, 6, 7, 8, 10], [4, 5, 6, 7, 9], None)
    with pytest.raises(PositionError, match="checkpoint was saved on another dataset"):
        ckpt.load_state_dict(state, data=other, num_samples=5, legacy_fp="")
    # an older dcp's step index is honoured only under its own fingerprint (the same plan)
    cfg = DCPConfig()
    fp = ckpt.legacy_fingerprint(cfg, [5, 6], 2, None)
    legacy = {"epoch": 1, "step_in_epoch": 3, "global_step": 9, "fingerprint": fp}
    back, _ = ckpt.load_state_dict(legacy, data=data, num_samples=2, legacy_fp=fp)
    assert back.legacy and back.steps == 3
    with pytest.raises(PositionError, match="checkpoint fingerprint .* differs from this run's"):
        ckpt.load_state_dict(legacy, data=data, num_samples=2, legacy_fp=ckpt.legacy_fingerprint(cfg, [5, 6], 4, None))


class _Stale(ValueError):
    pass


class _Source:
    """A ProfileSource whose cached table is stale once."""

    stale_error = _Stale

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def need_profile(self, target, config, world_size):
        raise _Stale("cached table of an older format: delete it")

    def load_or_profile(self, model, config, world_size, registry, *, adapter, refresh, **kwargs):
        self.calls.append(refresh)
        if not refresh:
            raise _Stale("cached table of an older format: delete it")
        return "table", "profiled"


def test_table_loader_goes_through_the_injected_source(monkeypatch):
    log = logging.getLogger("dcp.test")
    source = _Source()
    cfg = DCPConfig(advanced=AdvancedConfig(strict_cache=False))
    loader = TableLoader(source, cfg, 1, 1, log)  # rank 1: no info lines
    assert loader.need_profile(object())  # stale: profile again
    assert loader.load(object(), None, None) == "table" and source.calls == [False, True]
    strict = TableLoader(_Source(), DCPConfig(advanced=AdvancedConfig(strict_cache=True)), 1, 1, log)
    with pytest.raises(ManagerError, match="strict_cache .true. forbids re-profiling"):
        strict.need_profile(object())
    sharded = TableLoader(_Source(), DCPConfig(advanced=AdvancedConfig(strict_cache=False),
                                               runtime=RuntimeConfig(engine="fsdp2")), 1, 1, log)
    assert sharded.load(torch.nn.Linear(2, 2), None, None) == "table"  # a whole model is profiled as any other
    monkeypatch.setattr(profiling, "_is_sharded", lambda model: True)
    with pytest.raises(ManagerError, match="already sharded by fully_shard"):
        sharded.load(object(), None, None)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_manager_without_a_profiler_uses_the_analytic_table():
    model = Transformer1D(T1DConfig.tiny())
    from dcp.runtime.data import SyntheticTokenDataset

    data = SyntheticTokenDataset([5, 6, 7, 8], vocab_size=model.config.vocab_size)
    engine = DDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    cfg = DCPConfig(model=model.config.shape())
    mgr = DCPManager(model, data, cfg, engine)
    assert mgr.need_profile()
    lines = _Lines()
    logging.getLogger("dcp").addHandler(lines)
    try:
        mgr.init_profiler()
    finally:
        logging.getLogger("dcp").removeHandler(lines)
    assert mgr.table is not None and len(mgr.table) > 0
    assert any("no profiler was given to the manager" in line for line in lines.lines)


def test_step_tally_adds_every_loss_and_count_the_contract_allows():
    tally = StepTally.zeros("cpu")
    tally.add(torch.tensor([2.0]), torch.tensor([3, 4]))  # a (1,)-shaped loss_sum; a count tensor summed
    tally.add(torch.tensor(1.5, dtype=torch.bfloat16), torch.tensor(5, dtype=torch.int32))  # 0-dim, other dtypes
    tally.add(torch.tensor(0.25, requires_grad=True) * 2, 6)  # a loss with a graph: detached; an int count
    tally.add(torch.tensor(1.0), None)  # a model that reports no count adds none
    assert tally.loss.dtype == torch.float64 and float(tally.loss) == 2.0 + 1.5 + 0.5 + 1.0
    assert tally.count.dtype == torch.int64 and int(tally.count) == 3 + 4 + 5 + 6 and tally.has_count
    assert not tally.loss.requires_grad


def test_the_micro_batch_timer_files_the_busy_span_minus_the_syncs_inside_it():
    from dcp.distributed.device import Span
    from dcp.runtime.profiling import Measurements, MicroBatchTimer

    class Clock:  # a stopwatch whose spans are 5 s
        def start(self):
            return 0.0

        def stop(self, token):
            return Span(seconds=5.0)

    tally, rows = StepTally.zeros("cpu"), Measurements(cuda=False)
    tally.syncs.append(Span(seconds=9.0))  # an earlier micro-batch's sync: not this one's
    with MicroBatchTimer(Clock(), rows, tally, (2, 3, 4, 1)):
        tally.syncs.append(Span(seconds=1.5))  # engine.step at the boundary, inside the block
    assert tally.busy_s() == 5.0 - 1.5 and list(rows.rows) == [(2, 3, 4, 1, 5.0)]
    with MicroBatchTimer(Clock(), rows, tally, None):  # outside a step: busy time, no measurement row
        pass
    assert tally.busy_s() == 2 * 5.0 - 1.5 and len(rows.rows) == 1


def test_the_host_timer_files_the_same_busy_time_and_rows_as_the_stopwatch_path(monkeypatch):
    """``host=True`` (a CPU run) reads perf_counter itself and adds floats: the same busy seconds and rows as
    the stopwatch path gives for the same clock readings, with no Span per micro-batch."""
    from dcp.distributed.device import Span, Stopwatch
    from dcp.runtime import profiling
    from dcp.runtime.profiling import Measurements, MicroBatchTimer

    def run(host: bool) -> tuple[StepTally, Measurements]:
        ticks = iter([10.0, 15.0, 20.0, 22.5])
        monkeypatch.setattr(profiling.time, "perf_counter", lambda: next(ticks))
        monkeypatch.setattr("dcp.distributed.device.time.perf_counter", lambda: next(ticks))
        tally, rows = StepTally.zeros("cpu"), Measurements(cuda=False)
        tally.syncs.append(Span(seconds=9.0))  # an earlier micro-batch's sync: not this one's
        with MicroBatchTimer(Stopwatch("cpu"), rows, tally, (2, 3, 4, 1), host=host):
            tally.syncs.append(Span(seconds=1.5))  # engine.step at the boundary, inside the block
        with MicroBatchTimer(Stopwatch("cpu"), rows, tally, None, host=host):  # outside a step: no row
            pass
        return tally, rows

    host, via_spans = run(True), run(False)
    assert host[0].busy_s() == via_spans[0].busy_s() == 5.0 - 1.5 + 2.5
    assert list(host[1].rows) == list(via_spans[1].rows) == [(2, 3, 4, 1, 5.0)]
    assert host[0].busy == [] and host[0].busy_host_s == 6.0 and via_spans[0].busy_host_s == 0.0


def test_an_epoch_counted_in_full_is_not_planned_again_for_its_run(monkeypatch):
    from dcp.planner import ahead
    from dcp.runtime.data import SyntheticTokenDataset

    model = Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset([5, 9, 7, 8, 6, 12, 4, 10], vocab_size=model.config.vocab_size)
    mgr = DCPManager(model, data, DCPConfig(model=model.config.shape()),
                     DDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    mgr.init_profiler()
    planned = []
    real = ahead.planned_ahead
    monkeypatch.setattr(ahead, "planned_ahead", lambda *a, **k: planned.append(1) or real(*a, **k))
    counted = [p.sample_ids for p in mgr.epoch_plans(0, keep=True)]  # a caller counts the epoch (DCPTrainer sizing its LR)
    run = [step.plan.sample_ids for step in mgr.epoch_plans(0, per_rank=True)]  # the run's own iteration
    assert len(planned) == 1 and run == counted  # planned once, the same plans
    again = [step.plan.sample_ids for step in mgr.epoch_plans(0, per_rank=True)]  # kept plans are taken once
    assert len(planned) == 2 and again == counted
    next(iter(mgr.epoch_plans(0, keep=True)))  # a partial count keeps nothing
    list(mgr.epoch_plans(1, keep=True))  # another epoch's count is not this one's
    list(mgr.epoch_plans(0, per_rank=True))
    assert len(planned) == 5
    mgr.table = type(mgr.table)(list(mgr.table.rows), mgr.table.meta)  # another table (a refreshed profile)
    list(mgr.epoch_plans(0, keep=True))
    mgr.table = type(mgr.table)(list(mgr.table.rows), mgr.table.meta)
    list(mgr.epoch_plans(0, per_rank=True))  # counted under the table before: planned again
    assert len(planned) == 7
    list(mgr.epoch_plans(0))  # a count without keep holds nothing
    list(mgr.epoch_plans(0, per_rank=True))
    assert len(planned) == 9
