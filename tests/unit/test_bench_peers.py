"""``dcp bench peers``: the table, the --json row keys, and its argument errors (a tiny run)."""

from __future__ import annotations

import json

import pytest

from dcp.cli import main

KEYS = {"dataset", "seed", "method", "tokens_per_s", "ideal_fraction", "idle_ratio", "steps", "tokens_per_step_min",
        "tokens_per_step_median", "tokens_per_step_max", "step_tokens_min_frac", "step_tokens_max_frac",
        "target_tokens_per_step"}


def test_bench_peers_json_rows(capsys):
    assert main(["bench", "peers", "--datasets", "text", "--methods", "bucket,megatron-dyncp", "--num-samples",
                 "400", "--gpus", "8", "--seeds", "0,1", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("text ") and "megatron-dyncp" in line for line in out)
    rows = json.loads(out[-1])["rows"]
    assert [(r["dataset"], r["seed"], r["method"]) for r in rows] == [
        ("text", 0, "bucket"), ("text", 0, "megatron-dyncp"), ("text", 1, "bucket"), ("text", 1, "megatron-dyncp")]
    assert all(set(r) == KEYS for r in rows)
    assert rows[0]["tokens_per_s"] != rows[2]["tokens_per_s"]  # another seed: other data
    for r in rows:
        assert r["step_tokens_min_frac"] == pytest.approx(r["tokens_per_step_min"] / r["target_tokens_per_step"])
        assert r["step_tokens_max_frac"] == pytest.approx(r["tokens_per_step_max"] / r["target_tokens_per_step"])
        assert 0 < r["step_tokens_min_frac"] <= r["step_tokens_max_frac"]
    peer = rows[1]
    assert peer["target_tokens_per_step"] == rows[0]["target_tokens_per_step"]  # the default batch, for every method
    assert peer["tokens_per_step_min"] <= peer["tokens_per_step_median"] <= peer["tokens_per_step_max"]
    assert 0 < peer["ideal_fraction"] <= 1 and 0 <= peer["idle_ratio"] < 1


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--methods", "bucket,magic", "--methods ('bucket,magic'): magic is not one of"),
    ("--datasets", "t9d", "--datasets ('t9d'): t9d is not one of"),
    ("--seeds", "0,x", "--seeds ('0,x') must be integers >= 0 separated by commas: e.g. 0,1,2,3"),
])
def test_bench_peers_bad_names(capsys, flag, value, needle):
    with pytest.raises(SystemExit):
        main(["bench", "peers", flag, value])
    assert needle in capsys.readouterr().err
