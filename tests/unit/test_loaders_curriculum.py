"""Pure parts of the curriculum: key encoding (its order is the (length, id) order) and input errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dcp.loaders import LoaderError
from dcp.loaders.curriculum import _decode, _encode, curriculum_order


@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**32 - 1)), max_size=50, unique_by=lambda p: p[1]))
def test_key_order_is_length_then_id_order(pairs):
    keys = _encode([n for n, _ in pairs], [i for _, i in pairs])
    lens, ids = _decode(torch.sort(keys).values)
    assert list(zip(lens, ids, strict=True)) == sorted(pairs)


def test_curriculum_order_breaks_ties_by_id():
    assert curriculum_order([5, 3, 5, 1, 3]) == [3, 1, 4, 0, 2]


@pytest.mark.parametrize(
    ("lengths", "ids", "message"),
    [
        ([1, 2], [0], r"len\(lengths\) \(2\) differs from len\(sample_ids\) \(1\)"),
        ([1], [-3], r"sample_ids \(-3\) must be in \[0, 2\*\*32\)"),
        ([1], [2**32], r"sample_ids \(4294967296\) must be in \[0, 2\*\*32\)"),
        ([2**31], [0], r"lengths \(2147483648\) must be in \[0, 2\*\*31\)"),
        ([-1], [0], r"lengths \(-1\) must be in \[0, 2\*\*31\)"),
    ],
)
def test_encode_errors(lengths, ids, message):
    with pytest.raises(LoaderError, match=message):
        _encode(lengths, ids)
