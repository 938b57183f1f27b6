"""The agreement row and its checks, on hand-made tables (the multi-process paths: tests/dist)."""

from __future__ import annotations

import pytest
import torch

from dcp.runtime.exchange import (
    DataMismatchError,
    PlanMismatchError,
    check_agreement,
    digest_words,
    gathered_stats,
    step_row,
)

DATA = digest_words("lengths|counts|shapes")


def _row(marker="plan-a", stats=None, kind=1, epoch=0, step=3, data=DATA):
    return step_row(marker, stats, kind=kind, epoch=epoch, step=step, data_words=data)


def test_stats_round_trip_through_the_rows():
    a = _row(stats=(torch.tensor(1.25, dtype=torch.float64), torch.tensor(7), 0.5))
    b = _row(stats=(torch.tensor(2.5, dtype=torch.float64), torch.tensor(3), 0.25))
    assert gathered_stats(torch.stack([a, b])) == (3.75, 10, (0.5, 0.25))
    no_count = _row(stats=(torch.tensor(1.0, dtype=torch.float64), None, 0.0))
    assert gathered_stats(torch.stack([a, no_count]))[1] == -1  # one rank's model gave no count
    check_agreement(torch.stack([a, b]), "epoch 0 step 3")  # same position, data and plan: no error


def test_disagreements_are_named_position_first_then_data_then_plans():
    ok = _row()
    with pytest.raises(PlanMismatchError, match=r"different points of the training loop \(rank 0 at the start of "
                                                r"epoch 0 step 3, rank 1 at the end of epoch 0\)"):
        check_agreement(torch.stack([ok, _row(marker="plan-b", kind=2, data=digest_words("x"))]), "here")
    with pytest.raises(DataMismatchError, match=r"here: the ranks' datasets differ \(ranks \[1\]"):
        check_agreement(torch.stack([ok, _row(marker="plan-b", data=digest_words("other"))]), "here")
    with pytest.raises(PlanMismatchError, match=r"here: step plans differ across ranks \(ranks \[1\]"):
        check_agreement(torch.stack([ok, _row(marker="plan-b")]), "here")


def test_a_large_agreeing_table_passes_and_one_differing_rank_is_named():
    # 4096 rows that agree on plans, positions and data but not on their stats (loss, count, busy differ)
    rows = [_row(stats=(torch.tensor(float(r), dtype=torch.float64), torch.tensor(r), r * 1e-3)) for r in range(4096)]
    check_agreement(torch.stack(rows), "epoch 0 step 3")
    rows[-1] = _row(marker="plan-b")
    with pytest.raises(PlanMismatchError, match=r"ranks \[4095\] disagree with rank 0"):
        check_agreement(torch.stack(rows), "epoch 0 step 3")
    rows[-1] = _row(step=4)
    with pytest.raises(PlanMismatchError, match=r"rank 4095 at the start of epoch 0 step 4"):
        check_agreement(torch.stack(rows), "epoch 0 step 3")
