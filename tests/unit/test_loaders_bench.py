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


def test_bench_module_imports_without_torch():
    code = "import sys, dcp.bench.loaders, dcp.loaders; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
