"""``dcp figures`` writes a PNG and a CSV per figure (quick sizes)."""

from __future__ import annotations

import argparse
import csv

import pytest

import dcp.figures as figures


def test_all_figures_quick(tmp_path, capsys):
    p = argparse.ArgumentParser()
    figures.add_arguments(p)
    assert figures.run(p.parse_args(["--out", str(tmp_path), "--quick"])) == 0
    for name in ("fig4_imbalance", "fig5_alltoall", "fig8_throughput", "fig9_scaling", "fig10_intra_speedup"):
        png, table = tmp_path / f"{name}.png", tmp_path / f"{name}.csv"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        rows = list(csv.DictReader(table.open()))
        assert rows, name
    fig8 = list(csv.DictReader((tmp_path / "fig8_throughput.csv").open()))
    assert len(fig8) == 2 * 3 * 6  # the paper's four methods and the two peers
    assert all(float(r["speedup_vs_bucket"]) == 1.0 for r in fig8 if r["method"] == "bucket")
    fig5 = list(csv.DictReader((tmp_path / "fig5_alltoall.csv").open()))
    by = {(int(r["seq_len"]), int(r["sp_size"])): float(r["comm_fraction"]) for r in fig5}
    assert by[(1024, 16)] > by[(1024, 2)]  # larger SP pays more communication ...
    assert by[(524288, 8)] < by[(1024, 8)]  # ... and long sequences hide it behind attention compute


def test_errors(tmp_path):
    with pytest.raises(figures.FiguresError, match="is not known"):
        figures.make_figures(tmp_path, names=["fig99"])
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(figures.FiguresError, match="is a file"):
        figures.make_figures(f, names=["fig5"])
