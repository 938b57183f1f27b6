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


def _tiny(extra: list[str]) -> list[str]:
    return ["bench", "peers", "--datasets", "text", "--methods", "dcp-intra", "--num-samples", "400", "--gpus", "8",
            *extra]


def test_against_passes_on_the_same_cells_and_fails_naming_a_cell_that_lost_quality(tmp_path, capsys):
    assert main(_tiny(["--json"])) == 0
    saved = capsys.readouterr().out.strip().splitlines()[-1]
    same = tmp_path / "same.json"
    same.write_text(saved + "\n")
    assert main(_tiny(["--against", str(same), "--json"])) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "# gate: passed" in out and out[-1].startswith('{"rows"')  # the JSON line stays the last
    assert any(line.startswith(f"# against {same}: 1 cells, ideal fraction +0.00 points") for line in out)
    # the saved cell 2 points better and its steps within the bounds, now outside them: both are named
    row = json.loads(saved)["rows"][0]
    better = dict(row, ideal_fraction=row["ideal_fraction"] + 0.02)
    worse = tmp_path / "better.json"
    worse.write_text(json.dumps({"rows": [better]}))
    assert main(_tiny(["--against", str(worse)])) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# gate: ")]
    assert fails[0].startswith("# gate: text seed 0 dcp-intra: ideal fraction") and "-2.00 points" in fails[0]
    assert len(fails) == 1  # this run's steps held the bounds as the saved ones did


@pytest.mark.parametrize(("content", "needle"), [
    (None, "cannot read it"),
    ("not json\n", "its last line is not a JSON object"),
    ('{"rows": []}', "it holds no rows"),
    ('{"rows": [{"dataset": "t1d-long", "seed": 0, "method": "dcp-intra", "ideal_fraction": 0.9, '
     '"step_tokens_min_frac": 0.9, "step_tokens_max_frac": 1.1}]}', "none of this run's cells"),
])
def test_against_a_bad_file_is_one_line(tmp_path, capsys, content, needle):
    f = tmp_path / "before.json"
    if content is not None:
        f.write_text(content)
    rc = main(_tiny(["--against", str(f)]))
    captured = capsys.readouterr()
    text = captured.err + captured.out
    assert rc == (1 if "none of" in needle else 2) and needle in text and f"--against {f}" in text
