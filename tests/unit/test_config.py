"""Every config error path: the message names the field, the value, the rule and a fix."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from dcp.config import (
    AdvancedConfig,
    ConfigError,
    DCPConfig,
    ModelShapeConfig,
    PlanningConfig,
    ProfilingConfig,
    RuntimeConfig,
    config_from_dict,
    load_config,
)


def test_defaults_are_valid_and_frozen():
    cfg = DCPConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.planning.gmin = 3  # type: ignore[misc]
    assert cfg.planning.mem_capacity_bytes == int(80 * 1024**3)
    assert '"gmax": 4' in cfg.to_json()


@pytest.mark.parametrize(
    ("cls", "kwargs", "needle"),
    [
        (PlanningConfig, {"gmin": 15, "gmax": 5}, "planning.gmin (15) > planning.gmax (5): set gmin <= gmax"),
        (PlanningConfig, {"gmin": 0}, "planning.gmin (0) must be >= 1"),
        (PlanningConfig, {"gmax": 0, "gmin": 1}, "planning.gmax (0) must be >= 1"),
        (PlanningConfig, {"method": "magic"}, "planning.method ('magic') is not one of"),
        (PlanningConfig, {"mem_capacity_gib": 0}, "planning.mem_capacity_gib (0) must be > 0"),
        (PlanningConfig, {"mem_capacity_gib": 1e308}, "planning.mem_capacity_gib (1e+308) must be > 0 and <= 1048576 (1 PiB)"),
        (PlanningConfig, {"mem_capacity_gib": float("inf")}, "planning.mem_capacity_gib (inf) must be a finite number"),
        (PlanningConfig, {"mem_capacity_gib": float("nan")}, "planning.mem_capacity_gib (nan) must be a finite number"),
        (PlanningConfig, {"ranks_per_node": 0}, "planning.ranks_per_node (0) must be >= 1"),
        (PlanningConfig, {"sp_sizes": (1, 1)}, "planning.sp_sizes ([1, 1]) must be distinct positive"),
        (PlanningConfig, {"sp_sizes": ()}, "planning.sp_sizes ([]) must be distinct positive"),
        (AdvancedConfig, {"lookahead_samples": -1}, "advanced.lookahead_samples (-1) must be >= 0"),
        (AdvancedConfig, {"packed_token_budget": -1}, "advanced.packed_token_budget (-1) must be >= 0"),
        (AdvancedConfig, {"bucket_sp_size": -2}, "advanced.bucket_sp_size (-2) must be >= 0"),
        (PlanningConfig, {"tokens_per_step": -1}, "planning.tokens_per_step (-1) must be >= 0"),
        (PlanningConfig, {"step_tokens_bounds": (1.5, 2.0)}, "planning.step_tokens_bounds ([1.5, 2.0]) must be [low, high]"),
        (PlanningConfig, {"step_tokens_bounds": (1, 1)}, "planning.step_tokens_bounds ([1.0, 1.0]) must be [low, high] with 0 < low <= 1 <= high and low < high"),
        (PlanningConfig, {"step_tokens_bounds": (0.5,)}, "planning.step_tokens_bounds ([0.5]) must be [low, high]"),
        (PlanningConfig, {"step_tokens_bounds": ("a", 2)}, "planning.step_tokens_bounds (('a', 2)) must be a list of"),
        (RuntimeConfig, {"lr_scaling": "cube"}, "runtime.lr_scaling ('cube') is not one of ['none', 'linear', 'sqrt']"),
        (ProfilingConfig, {"seq_group_edges": ()}, "profiling.seq_group_edges (()) is empty"),
        (ProfilingConfig, {"seq_group_edges": (64, 32)}, "profiling.seq_group_edges ([64, 32]) must be positive"),
        (ProfilingConfig, {"seq_group_edges": (0, 32)}, "must be positive and strictly increasing"),
        (ProfilingConfig, {"max_micro_batch_size": 0}, "profiling.max_micro_batch_size (0) must be >= 1"),
        (AdvancedConfig, {"warmup_iters": -1}, "advanced.warmup_iters (-1) must be >= 0"),
        (AdvancedConfig, {"measure_iters": 0}, "advanced.measure_iters (0) must be >= 1"),
        (AdvancedConfig, {"clock": "tsc"}, "advanced.clock ('tsc') is not one of ['auto', 'wall', 'cpu', 'pipelined']"),
        (RuntimeConfig, {"engine": "fsdp"}, "runtime.engine ('fsdp') is not one of"),
        (RuntimeConfig, {"attention": "xformers"}, "runtime.attention ('xformers') is not one of"),
        (RuntimeConfig, {"loss_weighting": "mean"}, "runtime.loss_weighting ('mean') is not one of"),
        (AdvancedConfig, {"plan_check_timeout_s": 0}, "advanced.plan_check_timeout_s (0) must be > 0"),
        (RuntimeConfig, {"log_every": 0}, "runtime.log_every (0) must be >= 1"),
        (AdvancedConfig, {"prefetch": "yes"}, "advanced.prefetch ('yes') is not one of ['auto', 'on', 'off']"),
        (AdvancedConfig, {"stats_every": -1}, "advanced.stats_every (-1) must be >= 0"),
        (AdvancedConfig, {"peer_timeout_s": 2}, "advanced.peer_timeout_s (2) must be 0 (off) or a finite number >= 5"),
        (AdvancedConfig, {"peer_timeout_s": float("inf")}, "advanced.peer_timeout_s (inf) must be"),
        (ModelShapeConfig, {"num_layers": 0}, "model.num_layers (0) must be >= 1"),
        (ModelShapeConfig, {"hidden_size": 60, "num_heads": 8}, "model.hidden_size (60) is not divisible"),
        (ModelShapeConfig, {"ffn_hidden_size": -1}, "model.ffn_hidden_size (-1) must be >= 0"),
        (ModelShapeConfig, {"optimizer_bytes_per_param": -1}, "model.optimizer_bytes_per_param (-1)"),
    ],
)
def test_section_errors(cls, kwargs, needle):
    with pytest.raises(ConfigError) as exc:
        cls(**kwargs)
    assert needle in str(exc.value)
    assert ":" in str(exc.value)  # every message carries a fix after the colon


def test_sp_size_must_divide_heads():
    with pytest.raises(ConfigError) as exc:
        DCPConfig(model=ModelShapeConfig(hidden_size=96, num_heads=6), planning=PlanningConfig(sp_sizes=(1, 2, 4)))
    msg = str(exc.value)
    assert "planning.sp_sizes ([1, 2, 4]) contains [4]" in msg and "model.num_heads (6)" in msg
    assert "[1, 2]" in msg


def test_bucket_sp_size_must_be_an_sp_size():
    # (sp_sizes themselves must divide the head count, so a bucket size from them does too)
    with pytest.raises(ConfigError, match=r"advanced.bucket_sp_size \(4\) is not in planning.sp_sizes \(\[1, 2\]\)"):
        DCPConfig(planning=PlanningConfig(sp_sizes=(1, 2)), advanced=AdvancedConfig(bucket_sp_size=4))


def test_lr_scaling_needs_a_global_batch_and_bounds_load_from_toml(tmp_path):
    with pytest.raises(ConfigError, match=r"runtime.lr_scaling \('sqrt'\) needs a global batch .* \"method\""):
        DCPConfig(advanced=AdvancedConfig(default_batch="method"), runtime=RuntimeConfig(lr_scaling="sqrt"))
    DCPConfig(runtime=RuntimeConfig(lr_scaling="sqrt"))  # the default batch is one
    DCPConfig(planning=PlanningConfig(samples_per_step=8), advanced=AdvancedConfig(default_batch="method"),
              runtime=RuntimeConfig(lr_scaling="sqrt"))
    path = tmp_path / "run.toml"
    path.write_text("[planning]\ntokens_per_step = 65536\nstep_tokens_bounds = [0.75, 1.5]\n"
                    "[runtime]\nlr_scaling = \"linear\"\n")
    cfg = load_config(path)
    assert cfg.planning.tokens_per_step == 65536 and cfg.planning.step_tokens_bounds == (0.75, 1.5)
    assert cfg.runtime.lr_scaling == "linear"


def test_capacity_below_constant_memory():
    big = ModelShapeConfig(num_layers=42, hidden_size=3072, num_heads=48, vocab_size=32000)
    with pytest.raises(ConfigError) as exc:
        DCPConfig(model=big, planning=PlanningConfig(mem_capacity_gib=1.0, sp_sizes=(1, 2)))
    msg = str(exc.value)
    assert "planning.mem_capacity_gib (1.0) is below the model's constant memory" in msg
    assert "raise mem_capacity_gib" in msg
    tiny = ModelShapeConfig(num_layers=2, hidden_size=16, num_heads=2, vocab_size=32)
    with pytest.raises(ConfigError) as exc:  # small figures keep their digits (they printed as 0.000 GiB)
        DCPConfig(model=tiny, planning=PlanningConfig(mem_capacity_gib=0.00001, sp_sizes=(1,)))
    assert f"constant memory ({tiny.constant_mem_bytes('ddp', dp_size=None) / 2**30:.3g} GiB for" in str(exc.value)
    assert "(0.000 GiB" not in str(exc.value)


def test_paper_5b_fits_80gib_with_zero1_estimate():
    big = ModelShapeConfig(num_layers=42, hidden_size=3072, num_heads=48, vocab_size=32000, param_bytes=2)
    assert 4.5e9 < big.num_params < 5.5e9  # "5B" as in the paper's Table 1


def test_load_config_strict(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(
        "[model]\nnum_heads = 8\n[planning]\ngmin = 2\ngmax = 6\nsp_sizes = [1, 2]\n[profiling]\nseq_group_edges = [128, 256]\n"
    )
    cfg = load_config(good)
    assert cfg.planning.gmin == 2 and cfg.planning.sp_sizes == (1, 2)
    assert cfg.profiling.seq_group_edges == (128, 256)

    bad_key = tmp_path / "bad_key.toml"
    bad_key.write_text("[planning]\ngmn = 2\n")
    with pytest.raises(ConfigError, match=r"planning.gmn \(2\) is not a known key: valid keys of \[planning\] .*; did you mean 'gmin'\?$"):
        load_config(bad_key)

    bad_section = tmp_path / "bad_section.toml"
    bad_section.write_text("[plannig]\ngmin = 2\n")
    with pytest.raises(ConfigError, match=r"\[plannig\] is not a known section: valid sections are .*; did you mean 'planning'\?$"):
        load_config(bad_section)

    bad_type = tmp_path / "bad_type.toml"
    bad_type.write_text('[planning]\ngmin = "two"\n')
    with pytest.raises(ConfigError, match=r"planning.gmin \('two'\) must be of type int"):
        load_config(bad_type)

    units = tmp_path / "units.toml"
    units.write_text('[planning]\nmem_capacity_gib = "80GB"\n')
    with pytest.raises(ConfigError, match=r"mem_capacity_gib \('80GB'\) must be of type float: write 80, a float "
                                          r"without quotes or units"):
        load_config(units)

    for section, key, text in (("planning", "mem_capacity_gib", "512MiB"), ("planning", "mem_capacity_gib", "1e3"),
                               ("planning", "mem_capacity_gib", "1,000"), ("planning", "gmin", "1.5"),
                               ("advanced", "check_plan_hash", "1")):
        wrong = tmp_path / "wrong.toml"
        wrong.write_text(f'[{section}]\n{key} = "{text}"\n')
        with pytest.raises(ConfigError, match=r"must be of type \w+: write an? \w+ value$"):  # no number to suggest
            load_config(wrong)

    as_json = tmp_path / "c.json"
    as_json.write_text('{"planning": {"gmin": 2}}\n')
    with pytest.raises(ConfigError, match=r"is not valid TOML \(.*\): the file is JSON: write it as TOML"):
        load_config(as_json)

    bad_list = tmp_path / "bad_list.toml"
    bad_list.write_text("[planning]\nsp_sizes = [1, 2.5]\n")
    with pytest.raises(ConfigError, match=r"planning.sp_sizes .* must be a list of integers"):
        load_config(bad_list)

    bad_bool = tmp_path / "bad_bool.toml"
    bad_bool.write_text("[planning]\ngmin = true\n")
    with pytest.raises(ConfigError, match=r"planning.gmin \(True\) must be of type int"):
        load_config(bad_bool)

    not_table = tmp_path / "not_table.toml"
    not_table.write_text("planning = 3\n")
    with pytest.raises(ConfigError, match=r"\[planning\] \(3\) must be a table"):
        load_config(not_table)

    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")

    broken = tmp_path / "broken.toml"
    broken.write_text("[planning\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(broken)


def test_float_field_accepts_int():
    cfg = config_from_dict({"planning": {"mem_capacity_gib": 2}})
    assert cfg.planning.mem_capacity_gib == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"planning": {"seq_group_edges": [64]}}, r"planning\.seq_group_edges \(\[64\]\) is not a known key: .*; seq_group_edges is a key of \[profiling\]: move it there$"),
        ({"profiling": {"clock": "cpu"}}, r"profiling\.clock \('cpu'\) is not a known key: .*; clock is a key of \[advanced\]: move it there$"),
        ({"runtime": {"stats_every": 1}}, r"runtime\.stats_every \(1\) is not a known key: .*; stats_every is a key of \[advanced\]: move it there$"),
        ({"planning": {"lookahead_samples": 8}}, r"planning\.lookahead_samples \(8\) is not a known key: .*; lookahead_samples is a key of \[advanced\]: move it there$"),
        ({"planning": {"zzz": 1}}, r"planning\.zzz \(1\) is not a known key: valid keys of \[planning\] are \[[^]]*\]$"),
        ({"method": "dcp-intra"}, r"^method \('dcp-intra'\) stands outside any section: put it under \[planning\]$"),
        ({"method": "{x}"}, r"^method \('\{x\}'\) stands outside any section: put it under \[planning\]$"),
        ({"foo": 3}, r"^foo \(3\) is not a known key: keys go under a section header, one of \['advanced', 'model', "),
    ],
)
def test_misplaced_or_misspelt_keys_say_where_they_belong(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


@pytest.mark.parametrize(
    ("former", "text"),
    [
        ("planning", 'default_batch = "method"'),
        ("planning", 'micro_batch_tokens = "off"'),
        ("planning", "bucket_sp_size = 2"),
        ("profiling", "strict_cache = true"),
        ("runtime", "peer_timeout_s = 30"),
    ],
)
def test_a_key_moved_to_advanced_fails_in_its_former_section_naming_advanced(tmp_path, former, text):
    key = text.split(" = ")[0]
    path = tmp_path / "run.toml"
    path.write_text(f"[{former}]\n{text}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{former}.{key} (")
    assert msg.endswith(f"; {key} is a key of [advanced]: move it there")
    path.write_text(f"[advanced]\n{text}\n")  # the fix it names loads
    assert getattr(load_config(path).advanced, key) == tomllib.loads(text)[key]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"planning": {3: 1}}, r"^planning\.3 \(1\) is not a known key: valid keys of \[planning\] are \[[^]]*\]$"),
        ({3: {"gmin": 2}}, r"^\[3\] is not a known section: valid sections are \[[^]]*\]$"),
    ],
)
def test_a_non_string_key_of_a_python_dict_is_one_config_error(raw, message):
    """config_from_dict is public: a dict built in Python may hold a non-string key. It is refused with the
    unknown-key line (did_you_mean has nothing to compare it with), not a TypeError from difflib."""
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)
