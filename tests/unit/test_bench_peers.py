"""``dcp bench peers``: the table, the --json row keys, and its argument errors (a tiny run)."""

from __future__ import annotations

import json

import pytest

from dcp.cli import main

KEYS = {"dataset", "method", "tokens_per_s", "ideal_fraction", "idle_ratio", "steps", "tokens_per_step_min",
        "tokens_per_step_median", "tokens_per_step_max", "target_tokens_per_step"}


def test_bench_peers_json_rows(capsys):
    assert main(["bench", "peers", "--datasets", "text", "--methods", "bucket,megatron-dyncp", "--num-samples",
                 "400", "--gpus", "8", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("text ") and "megatron-dyncp" in line for line in out)
    rows = json.loads(out[-1])["rows"]
    assert [(r["dataset"], r["method"]) for r in rows] == [("text", "bucket"), ("text", "megatron-dyncp")]
    assert all(set(r) == KEYS for r in rows)
    peer = rows[1]
    assert peer["target_tokens_per_step"] == rows[0]["target_tokens_per_step"]  # the default batch, for every method
    assert peer["tokens_per_step_min"] <= peer["tokens_per_step_median"] <= peer["tokens_per_step_max"]
    assert 0 < peer["ideal_fraction"] <= 1 and 0 <= peer["idle_ratio"] < 1


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--methods", "bucket,magic", "--methods ('bucket,magic'): magic is not one of"),
    ("--datasets", "t9d", "--datasets ('t9d'): t9d is not one of"),
])
def test_bench_peers_bad_names(capsys, flag, value, needle):
    with pytest.raises(SystemExit):
        main(["bench", "peers", flag, value])
    assert needle in capsys.readouterr().err
