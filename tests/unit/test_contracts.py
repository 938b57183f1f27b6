"""Contracts checked where they can be: profile tables against their own rows and the model,
cache_dir, forward_fn's return value, numeric CLI arguments before anything is allocated."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.cli import main
from dcp.config import ConfigError, ProfilingConfig
from dcp.planner.table import ProfileRow, ProfileTable, TableError, TableMeta, check_table_for_model
from dcp.runtime.contracts import ForwardContractError, check_forward_output

META = TableMeta(model="m", hardware="cpu", dtype="float32", world_size=2, seq_group_edges=(256, 512),
                 extra={"model_hash": "abc"})


def _row(**kw) -> ProfileRow:
    base = dict(seq_group=1, seq_len=512, micro_batch_size=1, sp_size=1, t_f_s=1e-3, t_b_s=2e-3, m_act_bytes=10.0,
                m_inp_bytes=5.0, t_const_s=1e-3, m_const_bytes=100.0, num_layers=4)
    return ProfileRow(**{**base, **kw})


@pytest.mark.parametrize("kw, needle", [
    ({"m_act_bytes": -1.0}, "m_act_bytes (-1.0) must be >= 0"),
    ({"m_const_bytes": -5.0}, "m_const_bytes (-5.0) must be >= 0"),
    ({"t_b_s": -1e-3}, "t_b_s (-0.001) must be >= 0"),
    ({"seq_len": 256}, "seq_len (256) is outside its seq_group's interval (256, 512]"),
    ({"seq_len": 1024}, "seq_len (1024) is outside its seq_group's interval (256, 512]"),
])
def test_a_table_row_that_contradicts_itself_is_refused(kw, needle):
    with pytest.raises(TableError, match=r"row \(seq_group=1, b=1, p=1\)") as info:
        ProfileTable([_row(**kw)], META)
    assert needle in str(info.value) and "regenerate the table" in str(info.value)


def test_a_table_row_is_checked_when_a_file_is_loaded(tmp_path):
    path = tmp_path / "t.csv"
    ProfileTable([_row()], META).to_csv(path)
    path.write_text(path.read_text().replace(",100.0,4,", ",-100.0,4,"))
    with pytest.raises(TableError, match=r"t.csv: row .* m_const_bytes \(-100.0\) must be >= 0"):
        ProfileTable.load(path)


def test_a_table_of_another_model_is_refused():
    table = ProfileTable([_row()], META)
    check_table_for_model(table, num_layers=4, model_hash="abc")  # its own model: fine
    with pytest.raises(TableError, match=r"num_layers \(4\), but the model has 2: profile this model"):
        check_table_for_model(table, num_layers=2)
    with pytest.raises(TableError, match=r"model config hash 'abc', but t1d's is 'xyz' \(another width"):
        check_table_for_model(table, num_layers=4, model_hash="xyz", model_name="t1d")


@pytest.mark.parametrize("value, needle", [
    ("", "is empty (it would write into the current folder)"),
    ("   ", "is empty"),
    (" .dcp_cache", "has blanks around it"),
    ("a\0b", "holds a NUL byte"),
])
def test_cache_dir_is_validated(value, needle):
    with pytest.raises(ConfigError, match=r"profiling.cache_dir") as info:
        ProfilingConfig(cache_dir=value)
    assert needle in str(info.value)


def test_the_cache_never_writes_into_the_current_folder():
    from dcp.profiler import cache

    key = cache.CacheKey(model="m", model_hash="h", world_size=1, hardware="cpu", dtype="float32", precision="fp32",
                         version="0", seq_group_edges=(8,), sp_sizes=(1,), max_micro_batch_size=1,
                         mem_capacity_gib=1.0, clock="cpu")
    with pytest.raises(cache.CacheError, match=r"cache_dir \(''\) is empty"):
        cache.cache_path("", key)


# ----- forward_fn ---------------------------------------------------------------------------------------
def test_a_loss_sum_and_count_pass():
    loss = torch.tensor(3.0, requires_grad=True)
    assert check_forward_output((loss, torch.tensor(7)))[0] is loss
    assert check_forward_output([loss.reshape(1), 7])[1] == 7
    assert check_forward_output((loss, torch.tensor([3, 4])))[1].tolist() == [3, 4]


@pytest.mark.parametrize("out, needle", [
    (torch.tensor(0.7), "returned a 0-dim loss (a mean?) with no token count"),
    (torch.ones(5), "returned a 1-dim float32 tensor of shape (5,) with no token count"),
    ((torch.tensor(1.0),), "returned a tuple of 1 items, not a pair"),
    (2.5, "returned a float, not a pair"),
    ((torch.ones(4), 4), "loss_sum is a 1-dim float32 tensor of shape (4,): sum the per-token losses"),
    ((torch.tensor(3), 4), "loss_sum is a 0-dim int64 tensor"),
    ((torch.tensor(1.0), 4.0), "token_count is a float (4.0), not an int"),
    ((torch.tensor(1.0), torch.tensor(4.0)), "token_count is a 0-dim float32 tensor, not an integer tensor"),
    ((torch.tensor(1.0), True), "token_count is a bool"),
    ((torch.tensor(1.0), -3), "token_count (-3) is negative"),
])
def test_anything_but_loss_sum_and_count_is_refused_with_the_fix(out, needle):
    with pytest.raises(ForwardContractError) as info:
        check_forward_output(out)
    msg = str(info.value)
    assert needle in msg and "return (loss_sum, token_count)" in msg and "reduction='sum'" in msg


# ----- numeric CLI arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["plan", "--world-size", "100000000000"], "--world-size: '100000000000' is more than 131,072 ranks"),
    (["plan", "--synthetic", "100000000000"], "--synthetic: '100000000000' is more than 67,108,864 samples"),
    (["simulate", "--gpus", "100000000000"], "--gpus: '100000000000' is more than 131,072 ranks"),
    (["simulate", "--num-samples", "100000000000"], "--num-samples: '100000000000' is more than 67,108,864"),
    (["parity", "--world-size", "100000000"], "--world-size: '100000000' is more than 256 local processes"),
    (["parity", "--lr", "nan"], "--lr: 'nan' must be a finite number > 0"),
    (["parity", "--mem-capacity-gib", "inf"], "--mem-capacity-gib: 'inf' must be a finite number > 0"),
    (["profile", "--nproc", "100000"], "--nproc: '100000' is more than 256 local processes"),
    (["bench", "loaders", "--num-samples", "1000000000000"], "--num-samples: '1000000000000' is more than"),
    (["bench", "profiler", "--reps", "0"], "--reps: '0' must be >= 1"),
])
def test_numeric_arguments_are_range_checked_before_allocation(capsys, argv, needle):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Error" not in err and len(err.strip().splitlines()[-1]) < 300


def test_a_sweep_beyond_the_local_launchers_process_limit_is_refused():
    from dcp.experiments.sweep import SweepError, sweep_from_dict

    with pytest.raises(SweepError, match=r"sweep.world_sizes \(\[2, 100000\]\) holds a value above 256"):
        sweep_from_dict({"sweep": {"name": "big", "world_sizes": [2, 100000]}})
    spec = sweep_from_dict({"sweep": {"name": "big", "world_sizes": [100000], "launcher": "torchrun"}})
    assert dataclasses.replace(spec).world_sizes == (100000,)


FORWARD_OUTS = [
    (torch.tensor(2.0), 3), (torch.tensor([2.0], dtype=torch.bfloat16), torch.tensor(3)),
    (torch.tensor(2.0, dtype=torch.float64), torch.tensor([1, 2], dtype=torch.int32)), [torch.tensor(2.0), 3],
    (torch.nn.Parameter(torch.tensor(2.0)), 3), (torch.tensor(2.0), torch.tensor(3, dtype=torch.uint8)),
    torch.tensor(2.0), (torch.tensor(2.0),), (torch.tensor([1.0, 2.0]), 3), (torch.tensor(2), 3),
    (torch.tensor(2.0), -1), (torch.tensor(2.0), True), (torch.tensor(2.0), 3.0),
    (torch.tensor(2.0), torch.tensor(3.0)), (torch.tensor(2.0), torch.tensor(True)),
    (torch.tensor(2.0, dtype=torch.complex64), 3), (torch.tensor(2.0), torch.tensor(1j)),
]
"""A forward's outputs: the usual pairs, other accepted ones, and refused ones."""


@pytest.mark.parametrize("out", FORWARD_OUTS)
def test_forward_pair_fast_path_agrees_with_the_full_check(out):
    """forward_pair's fast path accepts only what check_forward_output accepts, and refuses with its message."""
    from dcp.runtime.contracts import forward_pair

    try:
        want = check_forward_output(out)
    except ForwardContractError as exc:
        with pytest.raises(ForwardContractError) as got:
            forward_pair(out)
        assert str(got.value) == str(exc)
        return
    got = forward_pair(out)
    assert got[0] is want[0] and got[1] is want[1]


def _loop_in_a_step():
    from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
    from dcp.runtime.loop import StepLoop
    from dcp.runtime.step import OpenStep, StepTally
    from dcp.runtime.stepview import RankStep

    mbs = (MicroBatch(sample_ids=(0,), seq_lens=(8,), seq_group=0), MicroBatch(sample_ids=(1,), seq_lens=(8,), seq_group=0))
    plan = StepPlan(epoch=0, step=0, world_size=1, method="dcp-intra",
                    groups=(GroupPlan(first_rank=0, sp_size=1, recompute_layers=0, micro_batches=mbs),))
    loop = StepLoop.__new__(StepLoop)  # forward_out reads only the open step
    view = RankStep.of(plan, plan.groups[0], n_step=14, trained=None)
    loop.step = OpenStep(view=view, group=view.group, global_step=1, t0=0.0, tally=StepTally.zeros("cpu"))
    loop.step.mb_index, loop.step.pending = 0, mbs[0]
    return loop


@pytest.mark.parametrize("out", FORWARD_OUTS)
def test_the_loops_forward_count_agrees_with_the_full_check(out):
    """StepLoop.forward_out (once per micro-batch) accepts what check_forward_output accepts, refuses with its
    message, and counts an accepted pair into the step's tally: one forward, its loss detached, its count."""
    from dcp.runtime.step import StepTally

    loop = _loop_in_a_step()
    try:
        want_loss, want_count = check_forward_output(out)
    except ForwardContractError as exc:
        with pytest.raises(ForwardContractError) as got:
            loop.forward_out(out, idle=StepTally.zeros("cpu"))
        assert str(got.value) == str(exc) and loop.step.forwards == 0
        return
    assert loop.forward_out(out, idle=StepTally.zeros("cpu")) is want_loss
    a = loop.step
    assert (a.forwards, a.mb_forwards, a.tally.has_count) == (1, 1, True)
    assert a.tally.counts == [want_count] and len(a.tally.losses) == 1
    assert torch.equal(a.tally.losses[0], want_loss.detach()) and not a.tally.losses[0].requires_grad


def test_the_loops_inline_forward_count_leaves_no_grad_and_second_forwards_to_the_full_path():
    from dcp.runtime.step import ManagerError, StepTally

    loop, idle = _loop_in_a_step(), StepTally.zeros("cpu")
    with torch.no_grad():
        loop.forward_out((torch.tensor(1.0), 2), idle=idle)  # a logging forward: not counted
    assert loop.step.forwards == 0 and not loop.step.tally.losses
    loop.forward_out((torch.tensor(1.0), 2), idle=idle)
    with pytest.raises(ManagerError, match="ran its forward twice with gradients"):
        loop.forward_out((torch.tensor(1.0), 2), idle=idle)
    loop.step = None  # outside any step: into the idle tally
    loop.forward_out((torch.tensor(5.0), 4), idle=idle)
    assert float(idle.loss) == 5.0 and int(idle.count) == 4
