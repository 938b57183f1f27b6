"""``dcp figures`` writes a PNG and a CSV per figure (quick sizes)."""

from __future__ import annotations

import argparse
import csv

import pytest

import dcp.figures as figures


def test_all_figures_quick(tmp_path, capsys, monkeypatch):
    from dcp.figures import common

    titles, save = {}, common.save

    def spy(fig, path):
        titles[path.stem] = [ax.get_title() for ax in fig.axes if ax.get_title()]
        return save(fig, path)

    monkeypatch.setattr(common, "save", spy)
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
    # every result row carries its tokens per step beside throughput, and each figure states its batch
    for name, prefixes in (("fig8_throughput", [""]), ("fig9_scaling", [""]),
                           ("fig4_imbalance", ["bucket_", "dcp_intra_"])):
        for r in csv.DictReader((tmp_path / f"{name}.csv").open()):
            # Figure 8: every method at one global batch (bucket's mean); the others: each method its own
            assert (r["target_tokens_per_step"] != "0") == (name == "fig8_throughput"), name
            for pre in prefixes:
                low, mid, high = (float(r[f"{pre}tokens_per_step_{k}"]) for k in ("min", "median", "max"))
                assert 0 < low <= mid <= high, (name, r)
    assert titles["fig4_imbalance"][0].endswith("tokens/step: each method its own")
    assert titles["fig9_scaling"] and all(t.endswith("tokens/step: each method its own")
                                          for t in titles["fig9_scaling"])
    targets = {(r["model"], r["dataset"]): set() for r in fig8}
    for r in fig8:
        targets[(r["model"], r["dataset"])].add(r["target_tokens_per_step"])
    assert all(len(t) == 1 for t in targets.values())  # the same batch for every method of a cell
    assert len(titles["fig8_throughput"]) == 2 and all("tokens/step target" in t for t in titles["fig8_throughput"])
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


def test_simulate_runs_records_the_steps_tokens_and_the_target():
    from dcp.data_dists import load_lengths
    from dcp.figures.common import batch_title, simulate_runs

    lengths = load_lengths("t1d-balanced", num_samples=300, seed=0).tokens
    own = simulate_runs(lengths, "t1d-5b", "h200", 8, ("bucket", "dcp-intra"))
    target = int(own["bucket"].result.tokens / own["bucket"].result.num_steps)
    runs = simulate_runs(lengths, "t1d-5b", "h200", 8, ("bucket", "dcp-intra"), tokens_per_step=target)
    for run in (*own.values(), *runs.values()):
        assert sum(run.step_tokens) == run.result.tokens and len(run.step_tokens) == run.result.num_steps
        cols = run.columns()
        assert cols["tokens_per_step_min"] == min(run.step_tokens)
        assert cols["tokens_per_step_max"] == max(run.step_tokens)
    assert {r.target_tokens_per_step for r in own.values()} == {0}
    rows = [run.columns() for run in runs.values()]
    assert {r["target_tokens_per_step"] for r in rows} == {target}
    from dcp.experiments.results import compact

    assert batch_title(rows, peers=True) == f"tokens/step target {compact(target)}"  # no peer note: one batch
    assert batch_title([run.columns() for run in own.values()], peers=True) == (
        "tokens/step: each method its own; peers at bucket's mean")
