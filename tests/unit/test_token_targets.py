"""TokenDataset refuses rows without a next-token target up front, naming them (never a nan loss later)."""

from __future__ import annotations

import pytest

from dcp.integrations.hf_data import HFDataError, TokenDataset


def test_one_token_rows_are_refused_with_their_row_numbers():
    rows = [[5, 6, 7], [9], [1, 2], [4]]
    with pytest.raises(HFDataError) as exc:
        TokenDataset(rows)
    msg = str(exc.value)
    assert msg.startswith("rows 1, 3 have no next-token target") and "nan loss" in msg
    assert "ds.filter(" in msg and "\n" not in msg


def test_rows_whose_labels_are_all_ignored_are_refused():
    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]},
            {"input_ids": [1, 2, 3], "labels": [-100, -100, -100]},
            {"input_ids": [1, 2, 3], "labels": [7, -100, -100]}]  # the first label is never a target
    with pytest.raises(HFDataError, match=r"^rows 1, 2 have no next-token target \(one token, or 'labels' all -100"):
        TokenDataset(rows)


def test_many_bad_rows_show_the_first_ten_and_the_count():
    with pytest.raises(HFDataError, match=r"rows 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, \.\.\. \(12 rows\) have"):
        TokenDataset([[1]] * 12 + [[1, 2]])


def test_given_target_counts_are_checked_too():
    with pytest.raises(HFDataError, match="^row 1 has no next-token target"):
        TokenDataset([[1, 2], [1, 2]], lengths=[2, 2], target_counts=[1, 0])


def test_rows_with_targets_are_kept():
    ds = TokenDataset([{"input_ids": [1, 2, 3], "labels": [-100, -100, 3]}, [4, 5]])
    assert ds.target_counts() == [1, 1] and ds.lengths() == [3, 2]
