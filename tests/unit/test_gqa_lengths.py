"""scripts/gqa_lengths.py: the long-context figure's lengths (docs/context_parallel.md), seeded and never
written over an existing file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from dcp.data_dists import load_lengths_csv

_SPEC = importlib.util.spec_from_file_location("gqa_lengths", Path(__file__).parents[2] / "scripts" / "gqa_lengths.py")
gqa_lengths = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gqa_lengths)


def test_the_lengths_are_seeded_and_reach_one_million_tokens(tmp_path):
    out = tmp_path / "lengths.csv"
    assert gqa_lengths.main([str(out)]) == 0
    tokens = np.asarray(load_lengths_csv(out).tokens)
    assert len(tokens) == 4001 and tokens.max() == 1048576 and (tokens > 131072).sum() >= 80
    assert 4096 <= np.median(tokens) <= 16384
    assert np.array_equal(tokens, gqa_lengths.lengths(0)) and not np.array_equal(tokens, gqa_lengths.lengths(1))


def test_an_existing_file_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "lengths.csv"
    out.write_text("tokens\n5\n")
    with pytest.raises(SystemExit):
        gqa_lengths.main([str(out)])
    assert "exists" in capsys.readouterr().err and out.read_text() == "tokens\n5\n"


def test_the_log_uniform_lengths_of_the_sharded_engines_figures(tmp_path, capsys):
    out = tmp_path / "lengths.csv"
    assert gqa_lengths.main([str(out), "--log-uniform", "1000"]) == 0
    tokens = np.asarray(load_lengths_csv(out).tokens)
    assert len(tokens) == 1000 and tokens.min() >= 1024 and tokens.max() <= 131072
    assert np.array_equal(tokens, gqa_lengths.log_uniform(1000, 0))
    with pytest.raises(SystemExit):
        gqa_lengths.main([str(tmp_path / "other.csv"), "--log-uniform", "-1"])
    assert "--log-uniform (-1) must be >= 0" in capsys.readouterr().err and not (tmp_path / "other.csv").exists()
