"""``dcp bench loaders``: runs, prints one row per (distribution, loader), JSON last line; no torch at import."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from dcp.bench import loaders as bench


def test_bench_rows_and_json(capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--num-samples", "600", "--max-tokens", "4096", "--distributions", "t1d-long", "--json"])
    assert bench.run(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    rows = {r["loader"]: r for r in result["rows"]}
    assert set(rows) == set(bench.LOADERS) and len(lines) == 2 + len(bench.LOADERS) + 1
    assert rows["balanced-packed"]["waste_pct"] == 0.0
    assert rows["fixed"]["work_bal"] > rows["balanced-closest"]["work_bal"]
    assert rows["curriculum-varbatch"]["waste_pct"] < rows["varbatch"]["waste_pct"]
    assert rows["static-shapes"]["work_bal"] == 1.0


def test_bench_rejects_bad_flags(capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--world-size", "0"])
    assert "argument --world-size: '0' must be >= 1" in capsys.readouterr().err
    for flag in ("--pool-size", "--max-shapes", "--max-tokens"):  # before any work, naming the flag (not the
        with pytest.raises(SystemExit):                              # loader config field it feeds)
            parser.parse_args([flag, "0"])
        assert f"argument {flag}: '0' must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^--num-samples \(8\) < --world-size \(9\): every rank needs samples: "
                       r"pass --num-samples >= 9$"):  # `dcp` prints it as one line on stderr, exit 2
        bench.run(parser.parse_args(["--world-size", "9", "--num-samples", "8"]))


def test_bench_rejects_a_budget_below_the_longest_sample(capsys, monkeypatch):
    # before: --max-tokens 10 ran, fixed and balanced reporting fill_pct 7484 (one over-budget sample per
    # micro-batch), and varbatch then failed on lengths[i] naming its config field, not the flag
    monkeypatch.setattr(bench, "load_lengths", lambda name, n, seed: ([100] + [37] * (n - 1), "test"))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)

    def run(*argv):
        return bench.run(parser.parse_args(["--num-samples", "40", "--distributions", "t1d-short", *argv]))

    with pytest.raises(ValueError, match=r"^--max-tokens \(99\) is below the longest sample \(100 tokens, in t1d-short "
                       r"with --num-samples 40 --seed 0\): a micro-batch must hold any one sample: pass "
                       r"--max-tokens >= 104$"):  # static-shapes pads its shapes to a multiple of 8
        run("--max-tokens", "99")
    assert capsys.readouterr().out == ""  # before any row
    with pytest.raises(ValueError, match=r"^--max-tokens \(103\) is below 104 tokens, the longest sample \(100 tokens, in "
                       r"t1d-short with --num-samples 40 --seed 0\) padded to static-shapes' multiple of 8: a "
                       r"micro-batch must hold any one sample: pass --max-tokens >= 104$"):  # was 'below ... (100'
        run("--max-tokens", "103")
    with pytest.raises(ValueError, match=r"^--max-tokens \(99\) .* pass --max-tokens >= 100$"):
        run("--max-tokens", "99", "--loaders", "fixed", "varbatch")
    assert run("--max-tokens", "100", "--loaders", "fixed", "varbatch", "--json") == 0
    assert run("--max-tokens", "104", "--json") == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert len(rows) == len(bench.LOADERS) and all(r["fill_pct"] <= 100 for r in rows)


def test_bench_module_imports_without_torch():
    code = "import sys, dcp.bench.loaders, dcp.loaders; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
