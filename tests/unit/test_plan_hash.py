"""scripts/plan_hash.py: the refactor guard's digest and its --check verdicts (the full run takes a minute;
these use a stubbed hash_all)."""

from __future__ import annotations

import json

import pytest

from dcp.planner import plan_epoch
from tests.unit.test_planner_assemble import lengths_for, make


@pytest.fixture()
def ph(load_script):
    return load_script("plan_hash")


def test_digest_sees_every_decision(ph):
    cfg, table = make(8)
    a = plan_epoch(lengths_for(300, seed=1), table, cfg, 8)
    b = plan_epoch(lengths_for(300, seed=1), table, cfg, 8)
    assert [ph.plan_digest(p) for p in a] == [ph.plan_digest(p) for p in b]
    other = plan_epoch(lengths_for(300, seed=2), table, cfg, 8)
    assert ph.plan_digest(a[0]) != ph.plan_digest(other[0])
    moved = a[0].with_sample_ids(a[0].sample_id_array[::-1])  # same groups and times, other samples
    assert ph.plan_digest(moved) != ph.plan_digest(a[0])


def test_check_names_the_first_difference(ph, tmp_path, monkeypatch, capsys):
    now = {"s/W=8/bucket": {"sha256": "aa", "steps": 1}, "s/W=8/packed": {"sha256": "bb", "steps": 1}}
    monkeypatch.setattr(ph, "hash_all", lambda: now)
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"plans": now}))
    assert ph.main(["--check", str(same)]) == 0
    diff = tmp_path / "diff.json"
    diff.write_text(json.dumps({"plans": {**now, "s/W=8/packed": {"sha256": "cc", "steps": 1}}}))
    assert ph.main(["--check", str(diff)]) == 1
    assert "DIFFERENT at s/W=8/packed: saved cc now bb" in capsys.readouterr().err
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps({"plans": {"s/W=8/bucket": now["s/W=8/bucket"]}}))
    assert ph.main(["--check", str(fewer)]) == 1  # a case the saved file lacks is a difference too
    assert ph.main(["--check", str(tmp_path / "missing.json")]) == 2
    assert "cannot read saved hashes" in capsys.readouterr().err
