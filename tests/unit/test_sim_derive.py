"""Measured compute, modelled network: p = 1 tables extended to p > 1 (dcp.sim.derive, dcp simulate --table)."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.cli import main
from dcp.named_models import T1D_5B, T2D_1B2
from dcp.planner.analytic import analytic_table
from dcp.sim.derive import DeriveError, derive_sp_table
from dcp.sim.hardware import H100


def _table(model, attention, sp_sizes, world_size, frames=None):
    return analytic_table(dataclasses.replace(model, num_layers=4), (4096, 16384, 65536), sp_sizes=sp_sizes,
                          max_micro_batch_size=2, world_size=world_size, hardware=H100, dtype_bytes=2,
                          attention=attention, frames_per_sample=frames)


@pytest.mark.parametrize("model,attention,frames", [(T1D_5B, "1d", None), (T2D_1B2, "2d", 16)])
def test_derived_rows_equal_the_model_at_p_when_the_p1_rows_are_the_models(model, attention, frames):
    # Fed the analytic model's own p = 1 rows, the derivation must give back the analytic rows at p > 1:
    # attention / p, linear work / p above the fixed launch cost, the same all-to-alls, T_C / p, memory / p.
    one = _table(model, attention, (1,), 8, frames)
    derived = derive_sp_table(one, model=model, attention=attention, hardware=H100, sp_sizes=(1, 2, 4, 8),
                              world_size=8, frames_per_group=[frames] * 3)
    truth = _table(model, attention, (1, 2, 4, 8), 8, frames)
    key = {(r.seq_group, r.sp_size, r.micro_batch_size): r for r in truth.rows}
    assert len(derived.rows) == len(truth.rows) == 3 * 4 * 2
    for r in derived.rows:
        t = key[(r.seq_group, r.sp_size, r.micro_batch_size)]
        for f in ("t_f_s", "t_b_s", "t_const_s", "m_act_bytes", "m_inp_bytes"):
            assert getattr(r, f) == pytest.approx(getattr(t, f), rel=1e-9), (f, r.sp_size)
        if r.sp_size > 1:
            assert r.m_const_bytes < t.m_const_bytes + 2 * r.m_inp_bytes + 1  # state of W=8; buffers once more
    assert derived.meta.world_size == 8 and "p=1" in derived.meta.source


def test_derive_refuses_tables_with_p_above_one():
    two = _table(T1D_5B, "1d", (1, 2), 2)
    with pytest.raises(DeriveError, match=r"table sp_sizes \(\[1, 2\]\) are not all 1"):
        derive_sp_table(two, model=T1D_5B, attention="1d", hardware=H100, sp_sizes=(1, 2), world_size=2)


def test_simulate_table_extends_a_single_gpu_table(tmp_path, capsys):
    t = tmp_path / "t.csv"
    _table(T1D_5B, "1d", (1,), 1).save(t)
    lengths = tmp_path / "l.csv"
    lengths.write_text("tokens\n" + "\n".join(str(x) for x in [60000, 3000, 2000, 1000, 500] * 8) + "\n")
    args = ["simulate", "--lengths", str(lengths), "--model", "t1d-5b", "--hardware", "h100", "--gpus", "8",
            "--method", "dcp-intra", "--table", str(t)]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "p > 1 derived" in captured.err and "4 layers" in captured.err
    bad = list(args)
    bad[bad.index("t1d-5b")] = "t2d-1.2b"
    assert main(bad) == 2
    assert "--table model ('t1d-5b') is not the simulated model ('t2d-1.2b')" in capsys.readouterr().err


def test_derive_row_rules():
    from dcp.sim.derive import derive_row

    one = _table(T1D_5B, "1d", (1,), 1)
    two = _table(T1D_5B, "1d", (1, 2), 2)
    kw = dict(model=T1D_5B, attention="1d", hardware=H100, dtype_bytes=2, world_size=2, state_bytes_measured=0.0)
    with pytest.raises(DeriveError, match=r"row sp_size \(2\) is not 1"):
        derive_row(next(r for r in two.rows if r.sp_size == 2), 2, **kw)
    with pytest.raises(DeriveError, match=r"sp_size \(5\) must divide num_heads \(48\)"):
        derive_row(one.rows[0], 5, **kw)
