"""``dcp bench models`` on 1 and 2 gloo processes: one row per (length, SP size), the same loss under SP."""

from __future__ import annotations

import json

from dcp.cli import main


def test_rows_and_equal_loss_under_sp(capsys):
    assert main(["bench", "models", "--seq-lens", "32", "--sp-sizes", "1,2", "--iters", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [(r["seq_len"], r["sp_size"]) for r in rows] == [(32, 1), (32, 2)]
    assert all(r["step_s"] > 0 for r in rows)
    assert rows[1]["loss_rel_diff"] < 1e-5  # SP must not change the summed loss
