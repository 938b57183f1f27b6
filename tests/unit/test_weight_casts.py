"""advanced.cache_weight_casts: under autocast the ddp engine casts the weights to bf16 at a step's first
micro-batch and reuses the copies in its later ones; the same updates, bit for bit, and the copies are dropped
before each update and when the loop is left. Runs bf16 autocast on CPU, one process."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dcp.api import set_manager
from dcp.config import AdvancedConfig, ConfigError, DCPConfig, RuntimeConfig
from dcp.models import T1DConfig, Transformer1D
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.runtime.data import SyntheticTokenDataset

LENGTHS = [6, 9, 4, 7, 5, 8, 3, 10, 6, 5, 7, 4]
MB_PER_STEP = 3


def _nesting() -> int:
    """The calling thread's autocast nesting level (torch reads it only through its increment)."""
    level = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return level - 1


class _WeightCasts(TorchDispatchMode):
    """Counts the casts of the given parameters (their storage) to bf16."""

    def __init__(self, params) -> None:
        super().__init__()
        self.ptrs, self.n = {p.data_ptr() for p in params}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16
                and args[0].data_ptr() in self.ptrs):
            self.n += 1
        return func(*args, **kwargs)


def _manager(keep: bool, recompute: int = 0, mb_recompute: tuple[int, ...] = (-1,) * MB_PER_STEP, *,
             model=None, precision: str = "bf16"):
    """Two steps of MB_PER_STEP one-sample micro-batches (``mb_recompute``: each micro-batch's own r, -1: the
    group's ``recompute``)."""
    model = model or Transformer1D(T1DConfig.tiny())
    data = SyntheticTokenDataset(LENGTHS, vocab_size=model.config.vocab_size)
    plans = [StepPlan(epoch=0, step=s, world_size=1, method="dcp-intra", groups=(GroupPlan(
        first_rank=0, sp_size=1, recompute_layers=recompute,
        micro_batches=tuple(MicroBatch(sample_ids=(i,), seq_lens=(LENGTHS[i],), seq_group=0, recompute_layers=r)
                            for i, r in zip(range(MB_PER_STEP * s, MB_PER_STEP * (s + 1)), mb_recompute,
                                            strict=True))),)) for s in range(2)]
    config = DCPConfig(model=model.config.shape(),
                       runtime=RuntimeConfig(precision=precision, log_every=1),
                       advanced=AdvancedConfig(cache_weight_casts=keep))
    mgr = set_manager(model, data, config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      plans=lambda e: plans)
    return mgr, model


def _run(keep: bool, recompute: int = 0, mb_recompute: tuple[int, ...] = (-1,) * MB_PER_STEP):
    """Casts per forward, the nesting level after each forward and after each engine.step(), final weights."""
    mgr, model = _manager(keep, recompute, mb_recompute)
    eng, casts, during, after = mgr.engine, [], [], []
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, eng)
        with _WeightCasts([p for p in model.parameters() if p.dim() == 2]) as counted:
            loss = eng(batch)
        casts.append(counted.n)
        during.append(_nesting())
        eng.backward(loss)
        eng.step()
        after.append(_nesting())
    return casts, during, after, [p.detach().clone() for p in model.parameters()]


def test_weights_are_cast_once_per_step_and_the_updates_do_not_change():
    casts_off, during_off, _, params_off = _run(False)
    casts_on, during_on, after_on, params_on = _run(True)
    n = casts_off[0]
    assert n == 4 * 5 + 1  # 4 layers x (qkv, proj, gate, up, down) + lm_head: the embedding is not cast
    assert casts_off == [n] * 2 * MB_PER_STEP and during_off == [0] * 2 * MB_PER_STEP
    assert casts_on == [n, 0, 0] * 2  # the step's later micro-batches reuse the first one's copies
    # held across the step's micro-batches, dropped after its last forward (backward then frees them layer by
    # layer, as without the option)
    assert during_on == after_on == [1, 1, 0] * 2
    for a, b in zip(params_on, params_off, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_nothing_is_held_for_micro_batches_with_recomputed_layers():
    casts, during, after, _ = _run(True, recompute=2)
    assert casts == [casts[0]] * 2 * MB_PER_STEP and casts[0] > 0
    assert during == after == [0] * 2 * MB_PER_STEP


def test_the_copies_are_dropped_when_the_loop_is_left_inside_a_step():
    mgr, _ = _manager(True)
    eng = mgr.engine
    batches = mgr.get_data_iter()
    for _ in range(2):  # two micro-batches of step 0's three, no update
        batch = next(batches)
        mgr.optimize_dynamics(batch, eng)
        eng.backward(eng(batch))
        eng.step()
    assert _nesting() == 1
    batches.close()  # a break in the user's loop, or an error, closes the iterator
    assert _nesting() == 0


def test_a_micro_batch_with_recomputed_layers_drops_the_copies_and_the_next_one_casts_again():
    mb_recompute = (0, 2, 0)  # held, dropped for the recomputed one, held again (a fresh cache)
    casts_off, _, _, params_off = _run(False, mb_recompute=mb_recompute)
    casts_on, during, _, params_on = _run(True, mb_recompute=mb_recompute)
    assert casts_on == casts_off == [21, 21, 21] * 2 and during == [1, 0, 0] * 2
    for a, b in zip(params_on, params_off, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_copies_left_held_by_a_kept_iterator_are_not_read_by_the_next_manager(monkeypatch):
    from dcp.runtime import weight_casts

    monkeypatch.setattr(weight_casts, "cache_keeps_autograd", lambda device_type: True)  # its own clear hid this
    mgr, model = _manager(True)
    kept = mgr.get_data_iter()  # left inside step 0 and kept alive: its hold is not released
    batch = next(kept)
    mgr.optimize_dynamics(batch, mgr.engine)
    mgr.engine(batch)
    assert _nesting() == 1
    with torch.no_grad():  # e.g. a checkpoint restored into the model
        for p in model.parameters():
            p.mul_(0.5)
    twin = Transformer1D(T1DConfig.tiny())
    twin.load_state_dict(model.state_dict())
    losses = []
    for keep, m in ((True, model), (False, twin)):
        mgr2, _ = _manager(keep, model=m)
        b = next(mgr2.get_data_iter())
        mgr2.optimize_dynamics(b, mgr2.engine)
        losses.append(mgr2.engine(b))
    assert torch.equal(losses[0], losses[1])  # the new hold cleared the old copies before casting
    kept.close()


def test_it_is_refused_where_the_cache_drops_a_casts_autograd_history(monkeypatch):
    from dcp.runtime import weight_casts

    assert weight_casts.cache_keeps_autograd("cpu")  # this torch keeps it (pytorch/pytorch#165068)
    monkeypatch.setattr(weight_casts, "cache_keeps_autograd", lambda device_type: False)
    with pytest.raises(ConfigError, match=r"advanced.cache_weight_casts \(true\) needs autocast's cache to keep"):
        _manager(True)


def test_without_autocast_it_does_nothing_and_says_so(caplog):
    with caplog.at_level("INFO", logger="dcp"):
        mgr, _ = _manager(True, precision="fp32")
    assert not mgr.engine.keep_weight_casts
    assert "advanced.cache_weight_casts does nothing here" in caplog.text


def test_the_flag_must_be_a_bool():
    with pytest.raises(ConfigError, match="advanced.cache_weight_casts"):
        AdvancedConfig(cache_weight_casts="yes")


def test_the_cpu_ab_script_runs_both_settings_and_prints_its_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "scripts/cast_ab.py", "--hidden", "64", "--layers", "1", "--tokens", "8",
                          "--rounds", "2"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("step ms: cached ") and "cached faster in " in out and out.rstrip().endswith("/2 rounds")
