"""``dcp bench tokens``: bad flags fail with one clear line; a tiny run prints both arms and its JSON summary."""

from __future__ import annotations

import argparse
import json

import pytest

from dcp.bench import tokens as bench_tokens


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_tokens.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--edges", "64,32"), "--edges ('64,32') must be strictly increasing"),
        (("--edges", "a,b"), "--edges ('a,b') must be integers"),
        (("--docs", "0"), "--docs (0) must be >= 1"),
        (("--mean-tokens", "0"), "--mean-tokens (0) must be >= 1"),
        (("--reps", "0"), "--reps (0) must be >= 1"),
    ],
)
def test_bad_flags_name_the_flag(argv, words):
    with pytest.raises(ValueError) as exc:
        bench_tokens.run(_args(*argv))
    assert words in str(exc.value)


def test_tiny_run_prints_both_arms_and_summary(capsys):
    assert bench_tokens.run(_args("--edges", "64,128", "--batch-sizes", "1,2,4", "--docs", "24", "--mean-tokens",
                                  "12", "--reps", "1", "--hidden-size", "16", "--num-layers", "2", "--json")) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    arms = summary["arms"]
    assert set(arms) == {"samples", "tokens"} and summary["docs"] == 24
    assert 1 <= arms["tokens"]["micro_batches"] <= 24 and 1 <= arms["samples"]["micro_batches"] <= 24
    assert all(a["meas_s"] > 0 and a["pred_s"] > 0 for a in arms.values())
    assert any(line.startswith("tokens ") for line in lines)
