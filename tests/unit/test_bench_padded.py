"""``dcp bench padded``: bad flags fail with one clear line; a tiny run prints its table and JSON summary."""

from __future__ import annotations

import argparse
import json

import pytest

from dcp.bench import padded as bench_padded


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_padded.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--edges", "64,32"), "--edges ('64,32') must be strictly increasing"),
        (("--edges", "a,b"), "--edges ('a,b') must be integers"),
        (("--batch-sizes", "1"), "--batch-sizes ('1') must include a size >= 2"),
        (("--batch-sizes", "0,2"), "--batch-sizes ('0,2') must list positive integers"),
        (("--cells", "0"), "--cells (0) must be >= 1"),
        (("--efficiency-lens", "8,x"), "--efficiency-lens ('8,x') must be integers"),
        (("--num-layers", "1"), "--num-layers (1) must be >= 2 with --rows profiler"),
    ],
)
def test_bad_flags_name_the_flag(argv, words):
    with pytest.raises(ValueError) as exc:
        bench_padded.run(_args(*argv))
    assert words in str(exc.value)


def test_tiny_run_prints_table_and_summary(capsys, tmp_path):
    out = tmp_path / "cells.csv"
    assert bench_padded.run(_args("--edges", "16,32", "--batch-sizes", "1,2", "--cells", "3", "--reps", "1",
                                  "--hidden-size", "16", "--num-layers", "2", "--efficiency-lens", "24,9",
                                  "--json", "--csv", str(out))) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["cells"] == 3 and summary["err_median_pct"] >= 0 and summary["rows"] == "profiler"
    assert summary["padded_efficiency"] > 0
    assert any("meas ms" in line for line in lines) and len(out.read_text().splitlines()) == 4
