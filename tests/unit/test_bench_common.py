"""``dcp.bench.common``: the benches' shared flags keep their help and defaults; round-robin timing; checks."""

from __future__ import annotations

import argparse
import random

import pytest

from dcp.bench import common
from dcp.bench import loaders as bench_loaders
from dcp.bench import padded as bench_padded
from dcp.bench import profiler as bench_profiler
from dcp.bench import tokens as bench_tokens


def _actions(add_arguments) -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {a.dest: a for a in parser._actions}


def test_clock_default_is_listed_first_in_choices_and_help():
    tokens, profiler = _actions(bench_tokens.add_arguments), _actions(bench_profiler.add_arguments)
    assert (tokens["clock"].default, tokens["clock"].choices) == ("cpu", ("cpu", "wall"))
    assert tokens["clock"].help == "cpu: process CPU time (robust on a shared machine); wall: perf_counter"
    assert (profiler["clock"].default, profiler["clock"].choices) == ("wall", ("wall", "cpu"))
    assert profiler["clock"].help == "wall: perf_counter; cpu: process CPU time (robust on a shared machine)"


def test_shared_flags_keep_each_bench_s_help_and_defaults():
    tokens, padded = _actions(bench_tokens.add_arguments), _actions(bench_padded.add_arguments)
    profiler, loaders = _actions(bench_profiler.add_arguments), _actions(bench_loaders.add_arguments)
    assert profiler["hidden_size"].help == "model width of the benchmarked models"
    assert (tokens["hidden_size"].help, tokens["num_layers"].default, tokens["threads"].default) == ("model width", 4, 1)
    assert padded["batch_sizes"].help == "micro-batch sizes profiled (cells draw 2..max)"
    assert (padded["edges"].default, tokens["edges"].default) == ("128,256,512,1024", "512,2048")
    assert tokens["seed"].help == "seed of the documents" and loaders["seed"].help == "seed of the lengths and the shuffles"
    assert loaders["json"].help == "print a JSON object with every row as the last line"


def test_check_positive_names_the_first_bad_flag():
    args = argparse.Namespace(docs=3, mean_tokens=0, reps=-1)
    with pytest.raises(ValueError, match=r"^--mean-tokens \(0\) must be >= 1$"):
        common.check_positive(args, "docs", "mean_tokens", "reps")
    common.check_positive(args, "docs")


def test_round_robin_warms_every_key_then_measures_each_reps_times_in_shuffled_rounds():
    calls: list[str] = []

    def measure(k: str) -> int:
        calls.append(k)
        return len(calls)

    keys = ["a", "b", "c", "d"]
    got = common.round_robin(keys, measure, 3, random.Random(0))
    assert calls[:4] == keys  # the warm-up, in order, not recorded
    assert {k: len(v) for k, v in got.items()} == dict.fromkeys(keys, 3)
    rounds = [calls[4 + 4 * i: 8 + 4 * i] for i in range(3)]
    assert all(sorted(r) == keys for r in rounds) and any(r != keys for r in rounds)
    assert sorted(x for v in got.values() for x in v) == list(range(5, 17))
