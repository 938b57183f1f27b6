"""Sweep definitions: strict TOML loading, expansion into runs, resolved configs and their hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcp.config import ConfigError
from dcp.experiments.sweep import SweepError, load_sweep, sweep_from_dict

REPO = Path(__file__).resolve().parents[2]


def _raw(**sweep):
    base = {"name": "t", "world_sizes": [2], "models": ["t1d-tiny"], "datasets": ["balanced"],
            "methods": ["bucket", "dcp-intra"], "steps": 2, "num_samples": 16}
    base.update(sweep)
    return {"sweep": base, "config": {"planning": {"mem_capacity_gib": 0.016, "sp_sizes": [1, 2]}}}


def test_cpu_small_expands_to_every_combination_grouped_by_world_size_and_model():
    spec = load_sweep(REPO / "experiments" / "cpu_small.toml")
    runs = spec.expand()
    assert len(runs) == 2 * 2 * 3 * 4
    assert {r.method for r in runs} == {"bucket", "packed", "dcp-inter", "dcp-intra"}
    keys = [(r.world_size, r.model) for r in runs]
    # one contiguous block per (W, model): the launcher runs each block on one process group
    blocks = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(blocks) == len(set(blocks)) == 4
    assert runs[0].config.planning.method == runs[0].method
    assert runs[0].distribution == "t1d-short"


def test_gpu_paper_sweep_loads_with_paper_models():
    spec = load_sweep(REPO / "experiments" / "gpu_paper.toml")
    runs = spec.expand()
    assert spec.world_sizes == (32,) and spec.backend == "nccl" and spec.device == "cuda"
    shapes = {r.model: r.config.model for r in runs}
    assert shapes["t1d-5b"].num_layers == 42 and shapes["t1d-5b"].num_heads == 48
    assert shapes["t2d-1.2b"].num_layers == 28 and shapes["t2d-1.2b"].hidden_size == 1152


def test_config_hash_is_stable_and_distinguishes_runs():
    a = sweep_from_dict(_raw()).expand()
    b = sweep_from_dict(_raw()).expand()
    assert [r.config_hash() for r in a] == [r.config_hash() for r in b]
    assert len({r.config_hash() for r in a}) == len(a)
    c = sweep_from_dict(_raw(steps=3)).expand()
    assert c[0].config_hash() != a[0].config_hash()


def test_resolved_config_holds_model_method_and_planning():
    run = sweep_from_dict(_raw()).expand()[1]
    doc = run.resolved()
    assert doc["method"] == "dcp-intra" and doc["world_size"] == 2
    assert doc["config"]["planning"]["method"] == "dcp-intra"
    assert doc["config"]["planning"]["mem_capacity_gib"] == 0.016
    assert doc["config"]["model"]["name"] == "t1d-tiny"


def test_overrides_replace_sweep_keys():
    spec = sweep_from_dict(_raw(), overrides={"steps": 5, "out_dir": "/tmp/x", "world_sizes": [4]})
    assert spec.steps == 5 and spec.world_sizes == (4,) and str(spec.output_dir) == "/tmp/x"


def test_unknown_sweep_key_lists_valid_keys():
    with pytest.raises(SweepError, match=r"sweep\.stepz \(3\) is not a known key: valid keys of \[sweep\] are .*'steps'.*; did you mean 'steps'\?$"):
        sweep_from_dict(_raw(stepz=3))


def test_unknown_table_lists_valid_tables():
    raw = _raw()
    raw["sweeps"] = {}
    with pytest.raises(SweepError, match=r"\[sweeps\] is not a known table.*\['sweep', 'config'\]; did you mean 'sweep'\?$"):
        sweep_from_dict(raw)


def test_unknown_config_key_fails_strictly():
    raw = _raw()
    raw["config"]["planning"]["gmaxx"] = 3
    with pytest.raises(ConfigError, match=r"planning\.gmaxx \(3\) is not a known key: valid keys"):
        sweep_from_dict(raw)


def test_config_model_table_is_refused():
    raw = _raw()
    raw["config"]["model"] = {"num_layers": 2}
    with pytest.raises(SweepError, match=r"config\.model .* not allowed.*sweep\.models"):
        sweep_from_dict(raw)


def test_missing_sweep_table():
    with pytest.raises(SweepError, match=r"\[sweep\] \(missing\) is required"):
        sweep_from_dict({"config": {}})


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"world_sizes": 2}, r"sweep\.world_sizes \(2\) must be a list of int: e\.g\."),
        ({"world_sizes": [0]}, r"sweep\.world_sizes \(\[0\]\) must be positive integers"),
        ({"world_sizes": []}, r"sweep\.world_sizes \(\[\]\) is empty"),
        ({"methods": ["bucket", "bucket"]}, r"sweep\.methods .* has duplicates"),
        ({"methods": ["dcp"]}, r"sweep\.methods \('dcp'\) is not one of"),
        ({"models": ["gpt2"]}, r"sweep\.models \('gpt2'\) is not one of"),
        ({"datasets": ["huge"]}, r"sweep\.datasets \('huge'\) is not one of"),
        ({"steps": 0}, r"sweep\.steps \(0\) must be >= 1"),
        ({"steps": "2"}, r"sweep\.steps \('2'\) must be of type int: write 2, an int without quotes"),
        ({"warmup_steps": -1}, r"sweep\.warmup_steps \(-1\) must be >= 0"),
        ({"num_samples": 2}, r"sweep\.num_samples \(2\) is below steps \+ warmup_steps"),
        ({"scale": "huge"}, r"sweep\.scale \('huge'\) is not one of"),
        ({"device": "tpu"}, r"sweep\.device \('tpu'\) is not one of"),
        ({"backend": "mpi"}, r"sweep\.backend \('mpi'\) is not one of"),
        ({"backend": "nccl"}, r"sweep\.backend \('nccl'\) needs sweep\.device = 'cuda'"),
        ({"launcher": "slurm"}, r"sweep\.launcher \('slurm'\) is not one of"),
        ({"executor": "fast"}, r"sweep\.executor \('fast'\) is not one of"),
        ({"name": "a b"}, r"sweep\.name \('a b'\) must be non-empty"),
        ({"refresh_profile": 1}, r"sweep\.refresh_profile \(1\) must be of type bool"),
        ({"pin_cpus": 1}, r"sweep\.pin_cpus \(1\) must be of type bool: write a bool value"),
        ({"pin_cpus": True, "device": "cuda", "backend": "nccl"},
         r"sweep\.pin_cpus \(True\) only applies to sweep\.device = 'cpu': remove it for GPU runs"),
    ],
)
def test_bad_values_name_field_value_rule_and_fix(change, pattern):
    with pytest.raises(SweepError, match=pattern):
        sweep_from_dict(_raw(**change))


def test_sp_sizes_are_checked_against_every_model():
    raw = _raw(models=["t1d-tiny"])
    raw["config"]["planning"]["sp_sizes"] = [1, 3]
    with pytest.raises(ConfigError, match=r"planning\.sp_sizes .* do not divide model\.num_heads"):
        sweep_from_dict(raw)


def test_load_sweep_file_errors(tmp_path):
    with pytest.raises(SweepError, match=r"does not exist: pass the path"):
        load_sweep(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[sweep\nname = 1")
    with pytest.raises(SweepError, match=r"is not valid TOML"):
        load_sweep(bad)


def test_pinned_cpus_give_each_rank_its_threads_cores_wrapping_around_the_host():
    from dcp.experiments.runner import pinned_cpus

    assert [pinned_cpus(r, 1, 2) for r in range(4)] == [{0}, {1}, {0}, {1}]  # W = 4 on 2 cores: fixed pairs
    assert [pinned_cpus(r, 2, 8) for r in range(2)] == [{0, 1}, {2, 3}]
    assert pinned_cpus(1, 4, 2) == {0, 1}  # more threads than cores: every core, once


def test_load_doc_names_the_run_and_profile_load():
    from types import SimpleNamespace

    from dcp.experiments.runner import load_doc

    table = SimpleNamespace(meta=SimpleNamespace(extra={"load_avg_1m": 5.5}))
    assert load_doc(table, 3.456) == {"load_avg_1m": 3.46, "profile_load_avg_1m": 5.5}
    old = SimpleNamespace(meta=SimpleNamespace(extra={}))  # a table cached before the profiler recorded it
    assert load_doc(old, float("nan")) == {"load_avg_1m": None, "profile_load_avg_1m": None}
