"""Run configuration: frozen dataclasses, validated on construction, loaded strictly from TOML.

Every error names the field, the value, the rule and a fix, for example
``planning.gmin (15) > planning.gmax (5): set gmin <= gmax``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METHODS = ("bucket", "packed", "dcp-inter", "dcp-intra", "bucket-search")
PLAN_AHEAD = ("thread", "process")
"""Where plans are computed ahead (planning.plan_ahead)."""
CLOCKS = ("auto", "wall", "cpu", "pipelined")
"""profiling.clock choices (dcp.profiler.clock)."""
GIB = 1024**3
MAX_TOKENS = 2**40
"""Largest token count (a sample length or a seq_group bound) dcp accepts anywhere, and the bound of every
integer setting: far above any real value, small enough that sums and products stay exact in int64."""
MAX_GA = 2**16
"""Bound of planning.gmin / gmax: beyond it ga_steps * micro-batch time overflows the planner's integers."""
GRAD_BUCKET_MIB = 25.0
"""The ddp engine's gradient bucket (the default of ``DDPEngine(bucket_cap_mb=...)``), shared with the cost
model that prices it: its buckets start one by one inside the last backward, and the last one only after
it (``dcp.sim.cluster.exposed_sync_s``). Here, below both the planner and the runtime, so neither imports
the other for it."""


class ConfigError(ValueError):
    """A configuration value breaks a rule; the message says which and how to fix it."""


def fail(path: str, value: Any, rule: str, fix: str, *, error: type[ValueError] = ConfigError) -> None:
    """Raise ``error`` with the project's message shape ``path (value) rule: fix`` (every module's config
    and argument errors go through here, each with its own ValueError subclass)."""
    raise error(f"{path} ({value!r}) {rule}: {fix}")


def read_text_file(
    path: str | Path, *, what: str, missing_fix: str = "check the path", error: type[ValueError] = ConfigError
) -> str:
    """A UTF-8 text file (a leading BOM is dropped); a missing file, a directory, an unreadable file or
    non-UTF-8 content raises ``error`` naming the file (and the line of the first bad byte)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} ({str(p)!r}) does not exist: {missing_fix}") from None
    except IsADirectoryError:
        raise error(f"{what} ({str(p)!r}) is a directory: pass the path of a file") from None
    except OSError as exc:
        raise error(f"{what} ({str(p)!r}) cannot be read ({exc.strerror or exc}): check the path and its "
                    "permissions") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{what} ({str(p)!r}) line {line} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                    "save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def read_toml(
    path: str | Path,
    *,
    what: str = "config file",
    missing_fix: str = "pass the path of a TOML file",
    error: type[ValueError] = ConfigError,
) -> dict[str, Any]:
    """Parse a TOML file; a missing or unreadable file or bad syntax raises ``error`` naming the file."""
    path = Path(path)
    text = read_text_file(path, what=what, missing_fix=missing_fix, error=error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} ({str(path)!r}) is not valid TOML ({exc}): fix the syntax") from None


def check_fields(obj: Any, section: str, *, int_max: dict[str, int] | None = None) -> None:
    """Type and range of every field of a config dataclass, from its annotations: integers (not bools) in
    [-MAX_TOKENS, MAX_TOKENS] (or ``int_max[name]``), finite floats, strings, bools, tuples of integers
    (stored back as plain ints). Called first by every section's __post_init__, for TOML and Python alike."""
    for f in dataclasses.fields(obj):
        value, kind, path = getattr(obj, f.name), str(f.type), f"{section}.{f.name}"
        top = (int_max or {}).get(f.name, MAX_TOKENS)
        if kind.startswith("tuple"):
            items = tuple(value) if isinstance(value, list | tuple) else None
            if items is None or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items):
                fail(path, value, "must be a list of integers", "e.g. [1, 2, 4]")
            if any(abs(int(v)) > top for v in items):
                fail(path, list(items), f"holds a value beyond {top}", "use realistic sizes")
            object.__setattr__(obj, f.name, tuple(int(v) for v in items))
        elif kind == "int":
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                fail(path, value, "must be an integer", f"write {f.name} = <whole number>")
            if abs(int(value)) > top:
                fail(path, value, f"is beyond {top}", "use a realistic value")
            object.__setattr__(obj, f.name, int(value))
        elif kind == "float":
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
                fail(path, value, "must be a finite number", f"write {f.name} = <number>, not inf or nan")
        elif kind == "str" and not isinstance(value, str):
            fail(path, value, "must be a string", f'write {f.name} = "..."')
        elif kind == "bool" and not isinstance(value, bool):
            fail(path, value, "must be true or false", f"write {f.name} = true or false")


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelShapeConfig:
    """The shape of the model being trained; the planner and the config checks need only this."""

    name: str = "t1d-tiny"
    """Free-form model name, stored in profile-table metadata and results."""
    num_layers: int = 4
    """Repeated transformer layers (L in the paper)."""
    hidden_size: int = 64
    """Model width."""
    num_heads: int = 8
    """Attention heads; every SP size must divide it (Ulysses shards heads)."""
    ffn_hidden_size: int = 0
    """Feed-forward (SwiGLU) width; 0 means 8 * hidden_size // 3 (keeps about 12 h^2 parameters per layer)."""
    attentions_per_layer: int = 1
    """Self-attentions per repeated layer: 1 for an LLM-like block, 2 for a spatial + temporal (2D) block."""
    vocab_size: int = 256
    """Vocabulary (or patch-embedding input) size; used for the constant-memory estimate."""
    param_bytes: int = 4
    """Bytes per parameter (4 for fp32, 2 for bf16)."""
    optimizer_bytes_per_param: int = 8
    """Optimizer-state bytes per parameter before ZeRO sharding (Adam fp32: 8)."""

    def __post_init__(self) -> None:
        check_fields(self, "model")
        for name in ("num_layers", "hidden_size", "num_heads", "attentions_per_layer", "vocab_size", "param_bytes"):
            if getattr(self, name) < 1:
                fail(f"model.{name}", getattr(self, name), "must be >= 1", f"set model.{name} to a positive integer")
        if self.ffn_hidden_size < 0:
            fail("model.ffn_hidden_size", self.ffn_hidden_size, "must be >= 0", "use 0 for 8 * hidden_size // 3")
        if self.optimizer_bytes_per_param < 0:
            fail("model.optimizer_bytes_per_param", self.optimizer_bytes_per_param, "must be >= 0", "use 8 for Adam")
        if self.hidden_size % self.num_heads:
            fail(
                "model.hidden_size",
                self.hidden_size,
                f"is not divisible by model.num_heads ({self.num_heads})",
                "choose a head count that divides the hidden size",
            )

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or (8 * self.hidden_size) // 3

    @property
    def num_params(self) -> int:
        """Approximate parameter count: attentions (4 h^2 each) + gated MLP (3 h f) per layer, plus embedding
        and head."""
        h, f = self.hidden_size, self.ffn_size
        per_layer = self.attentions_per_layer * 4 * h * h + 3 * h * f + 2 * h
        return self.num_layers * per_layer + 2 * self.vocab_size * h

    def constant_mem_bytes(self, dp_size: int = 1) -> int:
        """Parameters + gradients + optimizer state (ZeRO-1 shards the optimizer over dp_size ranks)."""
        n = self.num_params
        return n * 2 * self.param_bytes + (n * self.optimizer_bytes_per_param) // max(1, dp_size)


@dataclass(kw_only=True, slots=True, frozen=True)
class ProfilingConfig:
    """What the dual-layer profiler measures and where it caches the table."""

    seq_group_edges: tuple[int, ...] = (512, 1024, 2048, 4096)
    """Upper token bound of every seq_group, strictly increasing; a sample of s tokens belongs to the first
    group whose bound is >= s, and each group is profiled at its bound (conservative for memory)."""
    max_micro_batch_size: int = 8
    """Largest micro-batch size b the profiler tries (it stops earlier when memory or time says so)."""
    warmup_iters: int = 1
    """Untimed repetitions before the measured one."""
    measure_iters: int = 3
    """Timed repetitions; the median is recorded."""
    clock: str = "auto"
    """How a layer's time is read (dcp.profiler.clock): 'auto' (pipelined on CUDA, wall elsewhere), 'wall'
    (elapsed time between two syncs), 'pipelined' (CUDA: max of the host's enqueue time and the GPU's time
    with its queue pre-filled, as inside a whole model) or 'cpu' (the profiling process's CPU time: stable on
    a shared, oversubscribed CPU machine, where elapsed time also counts the slices other processes take,
    but blind to time spent waiting for communication)."""
    cache_dir: str = ".dcp_cache"
    """Folder of cached profile tables (one file per model/world/hardware/dtype/version key)."""
    strict_cache: bool = False
    """False: inside a training run a missing or stale cached table is profiled again in the run (and the
    log says so). True: the run never profiles; a missing or stale table is an error (corrupt tables are
    refused either way)."""

    def __post_init__(self) -> None:
        check_fields(self, "profiling")
        edges = self.seq_group_edges
        if not edges:
            fail("profiling.seq_group_edges", edges, "is empty", "give at least one upper token bound, e.g. [1024]")
        if any(e < 1 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            fail(
                "profiling.seq_group_edges",
                list(edges),
                "must be positive and strictly increasing",
                "sort the bounds and remove duplicates",
            )
        if self.max_micro_batch_size < 1:
            fail("profiling.max_micro_batch_size", self.max_micro_batch_size, "must be >= 1", "set it to 1 or more")
        if self.warmup_iters < 0:
            fail("profiling.warmup_iters", self.warmup_iters, "must be >= 0", "set it to 0 or more")
        if self.measure_iters < 1:
            fail("profiling.measure_iters", self.measure_iters, "must be >= 1", "set it to 1 or more")
        if self.clock not in CLOCKS:
            fail("profiling.clock", self.clock, f"is not one of {list(CLOCKS)}", "write clock = \"auto\"")
        if not isinstance(self.strict_cache, bool):
            fail("profiling.strict_cache", self.strict_cache, "must be true or false", "write strict_cache = false")


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanningConfig:
    """How the planner turns a stream of samples into step plans."""

    method: str = "dcp-intra"
    """One of bucket, packed, dcp-inter, dcp-intra, bucket-search (bucket with its reference time searched)."""
    mem_capacity_gib: float = 80.0
    """Memory capacity per rank (M in Algorithm 1). On CPU it emulates a GPU's limit."""
    gmin: int = 1
    """Gmin: when every group's ga_steps is below it, all are scaled by ceil(gmin / max ga_steps)."""
    gmax: int = 4
    """Gmax: a step may last at most gmax times its longest single micro-batch."""
    ranks_per_node: int = 8
    """Ranks that share a fast interconnect; an SP group stays inside one node unless sp_size exceeds it."""
    sp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """SP sizes the planner may choose; each must divide model.num_heads."""
    lookahead_samples: int = 0
    """Samples the step assembler may read ahead of the stream to fill ranks. 0 sizes the window from the
    profile table: twice the samples whose GPU-time fills one longest micro-batch on every rank (at least 32
    per rank); see dcp.planner.assemble.default_lookahead."""
    seed: int = 0
    """Seed of the per-epoch shuffle (numpy Generator seeded by (seed, epoch)). Per-sample randomness
    (noise, masks) comes from the dataset's own seed via dcp.runtime.data.sample_generator(seed, epoch, id)."""
    packed_token_budget: int = 0
    """Packed parallel only: tokens per micro-batch; 0 derives it from the table and the memory capacity."""
    bucket_sp_size: int = 0
    """Bucket/packed only: fixed SP size; 0 picks the smallest that fits the longest seq_group."""
    plan_ahead: str = "thread"
    """Where the next steps' plans are computed while a step runs: "thread" (a background thread of this
    process: hidden while the loop waits on GPU kernels, but a loop busy in Python starves it of the GIL) or
    "process" (a child process per rank, ``dcp.planner.serve``: hidden either way; costs a process start per
    epoch). The plans are the same."""

    def __post_init__(self) -> None:
        check_fields(self, "planning", int_max={"seed": 2**63 - 1, "gmin": MAX_GA, "gmax": MAX_GA})
        sizes = self.sp_sizes
        if self.method not in METHODS:
            fail("planning.method", self.method, f"is not one of {list(METHODS)}", "pick one of those names")
        if not self.mem_capacity_gib > 0:
            fail("planning.mem_capacity_gib", self.mem_capacity_gib, "must be > 0", "set the per-rank memory in GiB")
        if self.seed < 0:
            fail("planning.seed", self.seed, "must be >= 0", "use a non-negative seed, e.g. 0")
        if self.gmin < 1:
            fail("planning.gmin", self.gmin, "must be >= 1", "set gmin to 1 or more")
        if self.gmax < 1:
            fail("planning.gmax", self.gmax, "must be >= 1", "set gmax to 1 or more")
        if self.gmin > self.gmax:
            raise ConfigError(
                f"planning.gmin ({self.gmin}) > planning.gmax ({self.gmax}): set gmin <= gmax"
            )
        if self.ranks_per_node < 1:
            fail("planning.ranks_per_node", self.ranks_per_node, "must be >= 1", "set the GPUs per node, e.g. 8")
        if not sizes or any(p < 1 for p in sizes) or len(set(sizes)) != len(sizes):
            fail("planning.sp_sizes", list(sizes), "must be distinct positive integers", "e.g. [1, 2, 4, 8]")
        if self.lookahead_samples < 0:
            fail("planning.lookahead_samples", self.lookahead_samples, "must be >= 0", "use 0 for the default")
        if self.packed_token_budget < 0:
            fail("planning.packed_token_budget", self.packed_token_budget, "must be >= 0", "use 0 to derive it")
        if self.bucket_sp_size < 0:
            fail("planning.bucket_sp_size", self.bucket_sp_size, "must be >= 0", "use 0 to derive it")
        if self.plan_ahead not in PLAN_AHEAD:
            fail("planning.plan_ahead", self.plan_ahead, f"is not one of {list(PLAN_AHEAD)}",
                 'write plan_ahead = "thread" (or "process" for a loop busy in Python)')

    @property
    def mem_capacity_bytes(self) -> int:
        return int(self.mem_capacity_gib * GIB)


@dataclass(kw_only=True, slots=True, frozen=True)
class RuntimeConfig:
    """How the manager runs a plan."""

    engine: str = "ddp"
    """Gradient-sync engine: ddp (data parallel with one bucketed all-reduce per step, done by DCP) or
    deepspeed (ZeRO-1)."""
    attention: str = "auto"
    """Attention kernel: auto (flash-attn on CUDA when installed, else SDPA), sdpa or flash."""
    precision: str = "auto"
    """Compute precision: auto (bf16 on CUDA, fp32 elsewhere), bf16 or fp32. bf16 keeps fp32 master weights
    and optimizer state (ddp: autocast over fp32 parameters; deepspeed: its own bf16 mode); profile tables
    are measured, and cached, per precision."""
    loss_weighting: str = "tokens"
    """Loss normalisation over the whole step: tokens or samples (all-reduced counts, never 1/ga_steps)."""
    check_plan_hash: bool = True
    """Check that all ranks run the same step plans and data: every step's plan digest is folded into a
    running digest, compared at the first step of each get_data_iter() call (with the data's digest, before
    any other collective), at every logged step and at the end of the epoch (or a pause); a mismatch names
    the first step that differs. No extra planning pass and no collective on unlogged steps."""
    plan_check_timeout_s: float = 60.0
    """Timeout of the agreement exchange's own process group (the plan / data / position checks and the
    logged steps' stats), so a divergent rank fails instead of hanging."""
    collective_timeout_s: float = 300.0
    """Timeout of every other collective dcp creates or uses (the SP groups, the world group's gradient sync):
    a rank that stalls or dies makes the others fail after this long, naming it and the phase it was in
    (see dcp.runtime.phases), instead of torch's default of 30 minutes. Raise it when one micro-batch or a
    checkpoint save between steps can take longer."""
    log_every: int = 10
    """Rank 0 logs one line every this many steps; each logged step all-gathers the step's loss, token
    count, per-rank busy time and the plans' running digest (one small collective on the default backend,
    and a synchronisation point, per logged step; unlogged steps run none). 1 checks every step (a
    divergent rank is then named at the next step instead of the next logged one)."""
    prefetch: bool = True
    """Collate (and pin, on CUDA) the next micro-batch on a background thread while the current one trains
    (the same batches in the same order; false: collate on the training thread)."""

    stats_every: int = 0
    """Also gather those step statistics (StepStats: loss, count, per-rank busy time) every this many steps
    without logging them, e.g. 1 for experiment runs that record every step; 0: only on logged steps."""

    def __post_init__(self) -> None:
        check_fields(self, "runtime")
        if self.engine not in ("ddp", "deepspeed"):
            fail("runtime.engine", self.engine, "is not one of ['ddp', 'deepspeed']", "pick one of those")
        if self.attention not in ("auto", "sdpa", "flash"):
            fail("runtime.attention", self.attention, "is not one of ['auto', 'sdpa', 'flash']", "pick one of those")
        if self.precision not in ("auto", "bf16", "fp32"):
            fail("runtime.precision", self.precision, "is not one of ['auto', 'bf16', 'fp32']",
                 "pick one of those (auto: bf16 on CUDA, fp32 on CPU)")
        if self.loss_weighting not in ("tokens", "samples"):
            fail("runtime.loss_weighting", self.loss_weighting, "is not one of ['tokens', 'samples']", "pick one")
        if not self.plan_check_timeout_s > 0:
            fail("runtime.plan_check_timeout_s", self.plan_check_timeout_s, "must be > 0", "e.g. 60")
        if not self.collective_timeout_s > 0:
            fail("runtime.collective_timeout_s", self.collective_timeout_s, "must be > 0", "e.g. 300")
        if self.log_every < 1:
            fail("runtime.log_every", self.log_every, "must be >= 1", "set it to 1 or more")
        if self.stats_every < 0:
            fail("runtime.stats_every", self.stats_every, "must be >= 0", "use 0 for logged steps only, 1 for every step")


@dataclass(kw_only=True, slots=True, frozen=True)
class DCPConfig:
    """The whole run: model shape, profiling, planning, runtime. Relations between sections are checked."""

    model: ModelShapeConfig = field(default_factory=ModelShapeConfig)
    """Shape of the trained model."""
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    """Dual-layer profiler settings."""
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    """Planner settings."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Manager settings."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"DCPConfig.{name} ({getattr(self, name)!r}) must be a {cls.__name__}: build it as "
                                f"{cls.__name__}(...), or load a TOML file with dcp.config.load_config")
        heads = self.model.num_heads
        bad = [p for p in self.planning.sp_sizes if heads % p]
        if bad:
            ok = [p for p in self.planning.sp_sizes if heads % p == 0]
            raise ConfigError(
                f"planning.sp_sizes ({list(self.planning.sp_sizes)}) contains {bad}, which do not divide "
                f"model.num_heads ({heads}): Ulysses shards heads across the SP group; use sizes from {ok or [1]} "
                f"or divisors of {heads}"
            )
        if self.planning.bucket_sp_size and self.planning.bucket_sp_size not in self.planning.sp_sizes:
            fail(
                "planning.bucket_sp_size",
                self.planning.bucket_sp_size,
                f"is not in planning.sp_sizes ({list(self.planning.sp_sizes)})",
                "add it to sp_sizes (the runtime builds SP groups only for those sizes) or use 0 to derive it",
            )
        const = self.model.constant_mem_bytes(dp_size=1)
        if const >= self.planning.mem_capacity_bytes:
            raise ConfigError(
                f"planning.mem_capacity_gib ({self.planning.mem_capacity_gib}) is below the model's constant memory "
                f"({const / GIB:.3f} GiB for parameters, gradients and optimizer state of "
                f"{self.model.num_params:,} parameters): raise mem_capacity_gib or use a smaller model"
            )

    def replace(self, **sections: Any) -> DCPConfig:
        return dataclasses.replace(self, **sections)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_SECTIONS: dict[str, type] = {
    "model": ModelShapeConfig,
    "profiling": ProfilingConfig,
    "planning": PlanningConfig,
    "runtime": RuntimeConfig,
}


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] ({raw!r}) must be a table: write it as [{name}] with key = value lines")
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ConfigError(
            f"{name}.{unknown[0]} ({raw[unknown[0]]!r}) is not a known key: valid keys of [{name}] are {valid}"
        )
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    for f in dataclasses.fields(cls):
        if f.name in kwargs:
            _check_type(name, f, kwargs[f.name])
    return cls(**kwargs)


def _check_type(section: str, f: dataclasses.Field, value: Any) -> None:
    expected = {"int": int, "float": (int, float), "str": str, "bool": bool}.get(str(f.type))
    if str(f.type).startswith("tuple"):
        if not isinstance(value, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{section}.{f.name} ({value!r}) must be a list of integers: e.g. [1, 2, 4]")
        return
    if expected is None:
        return
    bad_bool = expected is not bool and isinstance(value, bool)
    if bad_bool or not isinstance(value, expected):
        raise ConfigError(f"{section}.{f.name} ({value!r}) must be of type {f.type}: write a {f.type} value")


def config_from_dict(raw: dict[str, Any]) -> DCPConfig:
    """Build a DCPConfig from nested dicts; unknown sections or keys are errors listing the valid ones."""
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise ConfigError(
            f"[{unknown[0]}] is not a known section: valid sections are {sorted(_SECTIONS)}"
        )
    return DCPConfig(**{name: _build_section(name, cls, raw[name]) for name, cls in _SECTIONS.items() if name in raw})


def load_config(path: str | Path) -> DCPConfig:
    """Load a TOML file strictly (unknown sections or keys fail)."""
    return config_from_dict(read_toml(path))
