"""Sweep definitions: a strict TOML file that expands into one RunSpec per (world size, model, dataset, method).

A sweep file has two parts::

    [sweep]                      # what to run (keys: see SweepSpec)
    name = "cpu_small"
    world_sizes = [2, 4]
    models = ["t1d-tiny", "t2d-tiny"]
    datasets = ["short", "balanced", "long"]
    methods = ["bucket", "packed", "dcp-inter", "dcp-intra"]
    steps = 3

    [config.planning]            # DCPConfig sections shared by every run (strict, see dcp.config)
    mem_capacity_gib = 0.02

``[config.model]`` is not allowed: the model section of each run comes from its model name. Every error
names the field, the value, the rule and a fix; unknown keys list the valid ones.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp.argtypes import MAX_LOCAL_PROCESSES, MAX_SAMPLES, MAX_WORLD_SIZE
from dcp.config import METHODS, ConfigError, DCPConfig, config_from_dict, fail, read_toml
from dcp.named_models import MODEL_NAMES, MODELS
from dcp.validate import did_you_mean, type_fix

DATASET_NAMES = ("short", "balanced", "long")
LAUNCHERS = ("local", "torchrun")
DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")
EXECUTORS = ("manager", "direct")
DEFAULT_RESULTS_ROOT = "runs/sweeps"
"""Parent of a sweep's default output folder (git-ignored: a sweep never dirties the checkout by default)."""
COMMITTED_RESULTS_ROOT = "experiments/results"
"""Parent of the committed sweep results, refreshed only with ``dcp sweep --update-committed``."""


def model_config(name: str) -> Any:
    """The dcp.models config (T1DConfig / T2DConfig) of a model name; imports torch."""
    if name not in MODEL_NAMES:
        _fail("model", name, f"is not one of {sorted(MODEL_NAMES)}", "use one of those names")
    from dcp.models import build_config

    return build_config(name)


class SweepError(ConfigError):
    """A sweep definition breaks a rule; the message names field, value, rule and fix."""


_fail = functools.partial(fail, error=SweepError)


@dataclass(kw_only=True, slots=True, frozen=True)
class SweepSpec:
    """One sweep: the cross product of world sizes, models, datasets and methods, plus shared settings."""

    name: str
    """Sweep name; also the default output folder name under runs/sweeps/ (git-ignored)."""
    world_sizes: tuple[int, ...] = (2,)
    """W of every run (ranks per run). The local launcher starts W CPU processes per run group."""
    models: tuple[str, ...] = ("t1d-tiny",)
    """Model names (dcp.named_models.MODEL_NAMES): t1d-tiny, t2d-tiny, t1d-5b, t2d-1.2b."""
    datasets: tuple[str, ...] = ("balanced",)
    """Length distributions (dcp.data_dists.load_distribution): short, balanced, long."""
    methods: tuple[str, ...] = METHODS
    """Parallel methods compared: bucket, packed, dcp-inter, dcp-intra."""
    steps: int = 3
    """Measured optimizer steps per run."""
    warmup_steps: int = 1
    """Optimizer steps run first and not measured (allocator warm-up, first-touch costs)."""
    num_samples: int = 256
    """Samples drawn from the distribution (the run's dataset); the epoch's first steps are used."""
    scale: str = "cpu"
    """Length scale passed to load_distribution: cpu (hundreds to thousands of tokens) or paper."""
    seed: int = 0
    """Seed of the lengths, the shuffle and the model initialisation."""
    device: str = "cpu"
    """cpu (gloo processes) or cuda (one GPU per rank)."""
    backend: str = "gloo"
    """torch.distributed backend: gloo (CPU) or nccl (GPU)."""
    launcher: str = "local"
    """local: spawn W processes here; torchrun: run inside torchrun (one process per GPU, many nodes)."""
    threads_per_rank: int = 1
    """torch intra-op threads per process (CPU runs); keep ranks x threads <= cores for honest timings."""
    pin_cpus: bool = False
    """CPU runs: bind rank r to cores r*t .. r*t+t-1 (mod the host's cores, t = threads_per_rank), as numactl
    or torchrun's binding would. Ranks then stop migrating between cores; where ranks outnumber cores, the
    same ranks always share a core. (W = 4 on 2 cores: 18 % -> 14 % median simulator error in one back-to-back
    A/B, but the next full sweep with pinning gave 21 %: within this host's run-to-run spread.)"""
    executor: str = "manager"
    """manager: the paper's loop through dcp's manager (set_manager, get_data_iter, optimize_dynamics,
    profile); direct: the runner's own minimal loop over the same plans (a cross-check of the manager)."""
    refresh_profile: bool = False
    """Profile every (model, W) again at the start of the sweep instead of using the cache, so the table
    and the runs are measured under the same conditions (the cache is replaced)."""
    out_dir: str = ""
    """Output folder; empty means runs/sweeps/<name> (git-ignored). The committed results under
    experiments/results/<name> are written only on request (``dcp sweep --update-committed`` or --out)."""
    config: DCPConfig = field(default_factory=DCPConfig)
    """Base configuration of every run; each run replaces model and planning.method."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            _fail("sweep.name", self.name, "must be non-empty letters, digits, '-' or '_'", "e.g. name = \"cpu_small\"")
        for key in ("world_sizes", "models", "datasets", "methods"):
            value = tuple(getattr(self, key))
            object.__setattr__(self, key, value)
            if not value:
                _fail(f"sweep.{key}", list(value), "is empty", f"list at least one entry in sweep.{key}")
            if len(set(value)) != len(value):
                _fail(f"sweep.{key}", list(value), "has duplicates", "list each entry once")
        for w in self.world_sizes:
            if not isinstance(w, int) or isinstance(w, bool) or w < 1:
                _fail("sweep.world_sizes", list(self.world_sizes), "must be positive integers", "e.g. [2, 4]")
        top = MAX_LOCAL_PROCESSES if self.launcher == "local" else MAX_WORLD_SIZE
        if max(self.world_sizes) > top:
            _fail("sweep.world_sizes", list(self.world_sizes), f"holds a value above {top:,} (the {self.launcher} "
                  "launcher's limit)", "use realistic world sizes; the local launcher starts one process per rank here")
        if self.num_samples > MAX_SAMPLES:
            _fail("sweep.num_samples", self.num_samples, f"is above {MAX_SAMPLES:,}", "draw a realistic count, e.g. 512")
        self._check_names("models", MODEL_NAMES)
        self._check_names("datasets", DATASET_NAMES)
        self._check_names("methods", METHODS)
        for key in ("steps", "num_samples", "threads_per_rank"):
            if getattr(self, key) < 1:
                _fail(f"sweep.{key}", getattr(self, key), "must be >= 1", f"set sweep.{key} to 1 or more")
        if self.warmup_steps < 0:
            _fail("sweep.warmup_steps", self.warmup_steps, "must be >= 0", "use 0 to measure every step")
        if self.scale not in ("cpu", "paper"):
            _fail("sweep.scale", self.scale, "is not one of ['cpu', 'paper']", "pick one of those")
        if self.device not in DEVICES:
            _fail("sweep.device", self.device, f"is not one of {list(DEVICES)}", "pick one of those")
        if self.backend not in BACKENDS:
            _fail("sweep.backend", self.backend, f"is not one of {list(BACKENDS)}", "pick one of those")
        if self.launcher not in LAUNCHERS:
            _fail("sweep.launcher", self.launcher, f"is not one of {list(LAUNCHERS)}", "pick one of those")
        if self.executor not in EXECUTORS:
            _fail("sweep.executor", self.executor, f"is not one of {list(EXECUTORS)}", "pick one of those")
        if self.pin_cpus and self.device != "cpu":
            _fail("sweep.pin_cpus", self.pin_cpus, "only applies to sweep.device = 'cpu'",
                  "remove it for GPU runs (bind GPU jobs with your launcher)")
        if self.backend == "nccl" and self.device != "cuda":
            _fail("sweep.backend", self.backend, "needs sweep.device = 'cuda'", "use gloo on CPU or set device")
        if self.config.advanced.clock == "pipelined" and self.device != "cuda":
            _fail("advanced.clock", "pipelined", "needs sweep.device = 'cuda'",
                  "use clock = \"auto\" (wall time off CUDA) or \"wall\"")
        out = self.output_dir
        if out.exists() and not out.is_dir():
            _fail("sweep.out_dir", str(out), "is an existing file, not a folder",
                  "pass a folder path (--out DIR); results are several files")
        if self.steps + self.warmup_steps > self.num_samples:
            _fail(
                "sweep.num_samples",
                self.num_samples,
                f"is below steps + warmup_steps ({self.steps + self.warmup_steps})",
                "draw more samples: every step needs at least one",
            )

    def environment_warnings(self) -> list[str]:
        """What this host cannot run as asked (not errors: a sweep may be checked on one machine and run on
        another): CPU world sizes beyond the host's cores, CUDA runs without CUDA or with too few GPUs."""
        import os

        out = []
        cores = os.cpu_count() or 1
        if self.device == "cpu" and self.launcher == "local":
            over = [w for w in self.world_sizes if w * self.threads_per_rank > cores]
            if over:
                out.append(f"sweep.world_sizes {over} x threads_per_rank {self.threads_per_rank} exceed this host's "
                           f"{cores} cores: ranks will time-share cores and timings will not be honest")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                out.append("sweep.device is 'cuda' but CUDA is not available here (torch "
                           f"{torch.__version__}, cuda {torch.version.cuda}): the runs would fail on this host")
            elif self.launcher == "local" and max(self.world_sizes) > torch.cuda.device_count():
                out.append(f"sweep.world_sizes {list(self.world_sizes)} exceed this host's "
                           f"{torch.cuda.device_count()} GPUs: use the torchrun launcher across nodes")
        return out

    def _check_names(self, key: str, valid: Any) -> None:
        bad = [v for v in getattr(self, key) if v not in valid]
        if bad:
            _fail(f"sweep.{key}", bad[0], f"is not one of {sorted(valid)}", "use one of those names")

    @property
    def output_dir(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path(DEFAULT_RESULTS_ROOT) / self.name

    def expand(self) -> list[RunSpec]:
        """Every run of the sweep, grouped by (world size, model) so one process group serves a group."""
        runs = []
        for w in self.world_sizes:
            for model in self.models:
                for dataset in self.datasets:
                    for method in self.methods:
                        runs.append(RunSpec(sweep=self, model=model, dataset=dataset, method=method, world_size=w))
        return runs

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "config"}
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
        out["config"] = self.config.to_dict()
        return out


@dataclass(kw_only=True, slots=True, frozen=True)
class RunSpec:
    """One real run: a model trained on one dataset with one method on world_size ranks."""

    sweep: SweepSpec
    """The sweep the run belongs to (steps, seeds, device, base config)."""
    model: str
    """Model name (one of dcp.named_models.MODEL_NAMES)."""
    dataset: str
    """Length distribution name."""
    method: str
    """bucket, packed, dcp-inter or dcp-intra."""
    world_size: int
    """W: ranks of the run."""

    @property
    def config(self) -> DCPConfig:
        """The resolved configuration: the sweep's base config with this run's model and method."""
        base = self.sweep.config
        # fp32 on CPU; bf16 weights on GPU (the planner's constant-memory estimate)
        model = model_config(self.model).shape(param_bytes=4 if self.sweep.device == "cpu" else 2)
        planning = dataclasses.replace(base.planning, method=self.method, seed=self.sweep.seed)
        return base.replace(model=model, planning=planning)

    def resolved(self) -> dict[str, Any]:
        """Everything that determines the run's result, as plain JSON-able data."""
        s = self.sweep
        return {
            "model": self.model,
            "dataset": self.dataset,
            "method": self.method,
            "world_size": self.world_size,
            "steps": s.steps,
            "warmup_steps": s.warmup_steps,
            "num_samples": s.num_samples,
            "scale": s.scale,
            "seed": s.seed,
            "device": s.device,
            "backend": s.backend,
            "threads_per_rank": s.threads_per_rank,
            "pin_cpus": s.pin_cpus,
            "executor": s.executor,
            "config": self.config.to_dict(),
        }

    def config_hash(self) -> str:
        """sha256 (12 hex digits) of the resolved run configuration; equal configs give equal hashes."""
        text = json.dumps(self.resolved(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def distribution(self) -> str:
        """Name of the length distribution in dcp.data_dists: <model family>-<dataset>, e.g. t1d-balanced."""
        return f"{MODELS[self.model].family}-{self.dataset}"

    @property
    def label(self) -> str:
        return f"{self.model}/{self.dataset}/{self.method}/W{self.world_size}"


_SWEEP_KEYS = [f.name for f in dataclasses.fields(SweepSpec) if f.name != "config"]
_TOP_KEYS = ["sweep", "config"]


def sweep_from_dict(raw: dict[str, Any], *, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Build a SweepSpec from parsed TOML; unknown tables or keys are errors listing the valid ones."""
    unknown = sorted(set(raw) - set(_TOP_KEYS))
    if unknown:
        raise SweepError(f"[{unknown[0]}] is not a known table of a sweep file: valid tables are {_TOP_KEYS}"
                         + did_you_mean(unknown[0], _TOP_KEYS))
    if "sweep" not in raw or not isinstance(raw["sweep"], dict):
        raise SweepError("[sweep] (missing) is required: add a [sweep] table with at least name = \"...\"")
    body = dict(raw["sweep"])
    body.update(overrides or {})
    if "name" not in body:
        raise SweepError('sweep.name (missing) is required: add name = "my_sweep" to the [sweep] table')
    bad = sorted(set(body) - set(_SWEEP_KEYS))
    if bad:
        raise SweepError(f"sweep.{bad[0]} ({body[bad[0]]!r}) is not a known key: valid keys of [sweep] are {_SWEEP_KEYS}"
                         + did_you_mean(bad[0], _SWEEP_KEYS))
    hints = {f.name: str(f.type) for f in dataclasses.fields(SweepSpec)}
    for key, value in body.items():
        _check_type(key, hints[key], value)
    body = {k: tuple(v) if isinstance(v, list) else v for k, v in body.items()}
    cfg_raw = raw.get("config", {})
    if not isinstance(cfg_raw, dict):
        raise SweepError(f"[config] ({cfg_raw!r}) must be a table: write [config.planning] etc.")
    if "model" in cfg_raw:
        raise SweepError(
            "config.model (a table) is not allowed in a sweep: each run's model section comes from its name in "
            f"sweep.models; choose among {sorted(MODEL_NAMES)}"
        )
    models = body.get("models", SweepSpec.__dataclass_fields__["models"].default)
    bad_models = [m for m in models if m not in MODEL_NAMES]
    if bad_models:
        _fail("sweep.models", bad_models[0], f"is not one of {sorted(MODEL_NAMES)}", "use one of those names")
    # Validate the shared sections against every model of the sweep now (e.g. sp_sizes must divide each
    # model's head count), so a bad sweep fails before any process starts. The base config keeps the
    # first model; each run swaps in its own.
    device = body.get("device", "cpu")
    configs = [config_from_dict({**cfg_raw, "model": _shape_dict(m, device)}) for m in models]
    return SweepSpec(**body, config=configs[0])


def _shape_dict(model: str, device: str) -> dict[str, Any]:
    shape = model_config(model).shape(param_bytes=4 if device == "cpu" else 2)
    return {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)}


def _check_type(key: str, hint: str, value: Any) -> None:
    if hint.startswith("tuple"):
        inner = int if "int" in hint else str
        ok = isinstance(value, list) and all(isinstance(v, inner) and not isinstance(v, bool) for v in value)
        if not ok:
            example = "[2, 4]" if inner is int else '["a", "b"]'
            raise SweepError(f"sweep.{key} ({value!r}) must be a list of {inner.__name__}: e.g. {key} = {example}")
        return
    expected = {"int": int, "str": str, "bool": bool}.get(hint)
    if expected and (not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))):
        raise SweepError(f"sweep.{key} ({value!r}) must be of type {hint}: {type_fix(value, hint, key)}")


def load_sweep(path: str | Path, *, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Load a sweep TOML file strictly. ``overrides`` replace [sweep] keys (CLI flags such as --out)."""
    raw = read_toml(path, what="sweep file", missing_fix="pass the path of a sweep TOML file", error=SweepError)
    return sweep_from_dict(raw, overrides=overrides)
