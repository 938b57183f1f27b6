"""scripts/plan_hash_batch.py: a case index out of range is one clear line and exit 2; a small case prints its
epoch's step count and digest, the same twice."""

from __future__ import annotations

import pytest


@pytest.fixture()
def phb(load_script):
    return load_script("plan_hash_batch")


@pytest.mark.parametrize("arg", ["99", "x"])
def test_a_bad_case_is_one_line_and_exit_2(phb, capsys, arg):
    assert phb.main([arg]) == 2
    captured = capsys.readouterr()
    out = captured.err.strip().splitlines()
    assert len(out) == 1 and not captured.out and f"case {arg!r} is not an index in [0, {len(phb.CASES) - 1}]" in out[0]


def test_a_small_case_prints_the_same_digest_twice(phb, capsys):
    i = next(i for i, c in enumerate(phb.CASES) if c[:2] == ("text", 32))
    assert phb.main([str(i)]) == 0
    first = capsys.readouterr().out.split()
    assert phb.main([str(i)]) == 0
    again = capsys.readouterr().out.split()
    assert first[0] == again[0] == "text/32/dcp-intra/x1.0" and first[1:3] == again[1:3] and int(first[1]) > 1
    assert phb.main(["0" + str(i)]) == 0  # a zero-padded index is the same case, not silently none
    assert capsys.readouterr().out.split()[:3] == first[:3]
