"""dcp parity's analysis (binning, gap vs seed spread, plot rebuild from CSV) and its argument errors, and
the README's paper snippet executed as written."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pandas as pd
import pytest

from dcp.integrations import parity


def _args(tmp_path, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parity.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path)])
    for k, v in kw.items():
        setattr(args, k, v)
    return args


def _steps(shift: float) -> pd.DataFrame:
    rows = []
    for method, extra in (("bucket", 0.0), ("dcp-intra", shift)):
        for seed, noise in ((0, 0.05), (1, -0.05)):
            tokens = 0
            for step in range(40):
                tokens += 100
                rows.append({"method": method, "seed": seed, "epoch": 0, "step": step + 1, "tokens": 100,
                             "count": 99, "loss": 4.0 - step * 0.05 + noise + extra, "summary": "sp=[2]",
                             "tokens_cum": tokens})
    return pd.DataFrame(rows)


def _summary(shift: float) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "seed": s, "steps": 40, "tokens": 4000, "final_train_loss": 2.0,
                          "held_out_loss": 2.0 + (0.05 if s else -0.05) + (shift if m != "bucket" else 0.0),
                          "train_wall_s": 1.0} for s in (0, 1) for m in ("bucket", "dcp-intra")])


def test_verdict_separates_noise_from_a_real_gap(tmp_path):
    same = parity.compare(_summary(0.01), parity.binned_curves(_steps(0.01)))
    assert same["within_noise"] and same["bins_over"] == [] and abs(same["mean_gap"] - 0.01) < 1e-9
    apart = parity.compare(_summary(0.5), parity.binned_curves(_steps(0.5)))
    assert not apart["within_noise"] and len(apart["bins_over"]) == apart["bins"]


def test_plot_only_rebuilds_from_csv(tmp_path, capsys):
    _steps(0.01).to_csv(tmp_path / "steps.csv", index=False)
    _summary(0.01).to_csv(tmp_path / "summary.csv", index=False)
    assert parity.run(_args(tmp_path, plot_only=True)) == 0
    assert (tmp_path / "loss_vs_tokens.png").stat().st_size > 10_000
    assert len(pd.read_csv(tmp_path / "curves.csv")) == 4 * 12
    assert "verdict: the methods agree within run-to-run noise" in capsys.readouterr().out


def test_parity_argument_errors(tmp_path):
    with pytest.raises(parity.ParityError, match=r"--seeds \('a'\) must be comma-separated integers"):
        parity.run(_args(tmp_path, seeds="a"))
    with pytest.raises(parity.ParityError, match="--methods"):
        parity.run(_args(tmp_path, methods="fast"))
    with pytest.raises(parity.ParityError, match=r"--samples \(0\) must be >= 1"):
        parity.run(_args(tmp_path, samples=0))
    with pytest.raises(parity.ParityError, match=r"lacks \['steps.csv', 'summary.csv'\]: run `dcp parity"):
        parity.run(_args(tmp_path / "empty", plot_only=True))


def test_readme_paper_snippet_runs_as_written(tmp_path, monkeypatch):
    """The README's paper snippet, exactly (minus the two in-model lines), on a reference model with a
    cached table in place (profiling the default seq_group edges takes minutes on CPU)."""
    from dcp.models import T1DConfig, Transformer1D
    from dcp.planner import analytic_table_for
    from dcp.planner.table import ProfileTable
    from dcp.profiler import cache
    from dcp.profiler.dual_layer import cache_key_for
    from dcp.runtime.data import SyntheticTokenDataset

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"The paper's snippet .*?```python\n(.*?)```", text, re.S).group(1)
    code = block.split("# inside a model of your own")[0]
    assert "mgr = set_manager(model, dataset)" in code and "mgr.init_profiler()" in code
    monkeypatch.chdir(tmp_path)
    model = Transformer1D(T1DConfig.tiny())
    dataset = SyntheticTokenDataset([13, 7, 30, 22, 5, 17], vocab_size=256)
    from dcp.api import set_manager

    config = set_manager(model, dataset).config  # what the snippet's set_manager derives
    key = cache_key_for(model, config, 1)
    table = analytic_table_for(config, 1)
    # stand in for a table profiled on this host: its metadata must match the key (the cache verifies it)
    meta = dataclasses.replace(table.meta, model=key.model, hardware=key.hardware, dtype=key.dtype,
                               world_size=key.world_size, version=key.version)
    table = ProfileTable(table.rows, meta)
    cache.store(cache.with_key(table, key), config.profiling.cache_dir, key)
    scope = {"model": model, "dataset": dataset, "epochs": 2}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the documented snippet itself
    mgr = scope["mgr"]
    assert mgr.epoch == 2 and len(mgr.step_stats) >= 2 and mgr.table is not None


def test_parity_without_pandas_names_the_extra(monkeypatch):
    # pandas is an extra (dcp[parity]): dcp parity says which, in one line, before any work
    import sys

    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ValueError, match=r"dcp parity needs pandas \(not installed\).*pip install 'dcp\[hf,parity\]'"):
        parity.run(argparse.Namespace())
