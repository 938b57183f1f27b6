"""Run configuration: frozen dataclasses, validated on construction, loaded strictly from TOML.

Every error names the field, the value, the rule and a fix, for example
``planning.gmin (15) > planning.gmax (5): set gmin <= gmax``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp.config_advanced import CLOCKS, MICRO_BATCH_TOKENS, AdvancedConfig  # noqa: F401
from dcp.memory import ENGINE_NAMES, shape_state_bytes

# re-exported: the config's public error and readers
from dcp.validate import (  # noqa: F401
    MAX_TOKENS,
    ConfigError,
    check_field_type,
    check_fields,
    did_you_mean,
    fail,
    gib,
    read_text_file,
    read_toml,
)

METHODS = ("bucket", "packed", "dcp-inter", "dcp-intra", "bucket-search")
PEER_METHODS = ("megatron-dyncp", "flexsp")
"""Other schedulers re-implemented as baselines (``dcp.planner.peers``): planned and simulated, not run."""
LR_SCALING = ("none", "linear", "sqrt")
"""runtime.lr_scaling choices (the rules of dcp.loaders.lr_scaling)."""
COMPILE_MODES = ("off", "default", "max-autotune-no-cudagraphs")
"""runtime.compile values: off (eager), or the torch.compile mode applied to each repeated block."""
GIB = 1024**3
MAX_GA = 2**16
MAX_MEM_GIB = 2**20  # largest planning.mem_capacity_gib (1 PiB per rank): its bytes stay an exact int64
"""Bound of planning.gmin / gmax: beyond it ga_steps * micro-batch time overflows the planner's integers."""
GRAD_BUCKET_MIB = 25.0
"""The ddp engine's gradient bucket (the default of ``DDPEngine(bucket_cap_mb=...)``), shared with the cost
model that prices it: its buckets start one by one inside the last backward, and the last one only after
it (``dcp.sim.cluster.exposed_sync_s``). Here, below both the planner and the runtime, so neither imports
the other for it."""


def _check_folder_name(path: str, value: str, example: str) -> None:
    """A folder setting: not empty (an empty path means the current folder), no surrounding blanks (a typo
    that makes another folder), no NUL byte or line break (no file system accepts them)."""
    if not value.strip():
        fail(path, value, "is empty (it would write into the current folder)", f"name a folder, e.g. {example}")
    if value != value.strip():
        fail(path, value, "has blanks around it (they would be part of the folder name)", f"write {value.strip()!r}")
    if "\0" in value or "\n" in value or "\r" in value:
        fail(path, value, "holds a NUL byte or a line break", f"name a folder, e.g. {example}")


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
    """Attention (query) heads; every SP size must divide it (Ulysses shards heads)."""
    num_kv_heads: int = 0
    """K/V heads of grouped-query attention (Llama-3 8B: 8 of 32); 0 means num_heads. Must divide num_heads; SP
    sizes past it shard the sequence with context parallelism (dcp.planner.layout)."""
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
        if self.num_kv_heads < 0 or (self.num_kv_heads and self.num_heads % self.num_kv_heads):
            fail("model.num_kv_heads", self.num_kv_heads, f"must divide model.num_heads ({self.num_heads})",
                 "use the model's key/value head count (config.num_key_value_heads), or 0 for num_heads")
        if self.hidden_size % self.num_heads:
            fail(
                "model.hidden_size",
                self.hidden_size,
                f"is not divisible by model.num_heads ({self.num_heads})",
                "choose a head count that divides the hidden size",
            )

    @property
    def kv_heads(self) -> int:  # num_kv_heads, or num_heads when it is 0
        return self.num_kv_heads or self.num_heads

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

    def check_against(self, derived: ModelShapeConfig, source: str) -> None:
        """A written [model] section against the shape derived from the model itself (``source`` says from
        where): the first structural field that differs fails, naming both values (name, param_bytes and
        optimizer_bytes_per_param are the user's to state)."""
        for prop, key in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"), ("num_heads", "num_heads"),
                          ("kv_heads", "num_kv_heads"), ("ffn_size", "ffn_hidden_size"),
                          ("attentions_per_layer", "attentions_per_layer"), ("vocab_size", "vocab_size")):
            mine, theirs = getattr(self, prop), getattr(derived, prop)
            if mine != theirs:
                fail(f"model.{key}", mine, f"differs from the model's ({theirs}, from {source})",
                     f"leave [model] out (it is derived from the model) or set {key} = {theirs}")

    def constant_mem_bytes(self, engine: str, dp_size: int | None, compute_bytes: int | None = None) -> int:
        """Per-rank state bytes of runtime.``engine`` over ``dp_size`` ranks: ``dcp.memory.state_bytes``
        (``compute_bytes``: the compute precision's, 2 for bf16; None: param_bytes, the larger)."""
        return shape_state_bytes(self, engine, dp_size, compute_bytes)


@dataclass(kw_only=True, slots=True, frozen=True)
class ProfilingConfig:
    """What the dual-layer profiler measures and where it caches the table."""

    seq_group_edges: tuple[int, ...] = (512, 1024, 2048, 4096)
    """Upper token bound of every seq_group, strictly increasing; a sample of s tokens belongs to the first
    group whose bound is >= s, and each group is profiled at its bound (conservative for memory)."""
    max_micro_batch_size: int = 8
    """Largest micro-batch size b the profiler tries (it stops earlier when memory or time says so)."""
    cache_dir: str = ".dcp_cache"
    """Folder of cached profile tables (one file per model/world/hardware/dtype/version key)."""

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
        _check_folder_name("profiling.cache_dir", self.cache_dir, '".dcp_cache"')


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanningConfig:
    """How the planner turns a stream of samples into step plans."""

    method: str = "dcp-intra"
    """One of bucket, packed, dcp-inter, dcp-intra, bucket-search (bucket with its reference time searched), or
    a peer for the simulator only: megatron-dyncp, flexsp (``dcp.planner.peers``)."""
    mem_capacity_gib: float = 80.0
    """Memory capacity per rank (M in Algorithm 1). On CPU it emulates a GPU's limit."""
    gmin: int = 1
    """Gmin: when every group's ga_steps is below it, all are scaled by ceil(gmin / max ga_steps)."""
    gmax: int = 4
    """Gmax, DCP methods: without a global batch (advanced.default_batch = "method" and neither tokens_per_step nor
    samples_per_step set) a step lasts at most gmax times its longest micro-batch. With a global batch (stated,
    or the default one), a step is sized by its tokens instead and Gmax bounds only the planner's look-ahead
    (default_lookahead) and a step whose groups were dropped for want of aligned ranks; steps may then outlast
    gmax x their longest micro-batch."""
    ranks_per_node: int = 8
    """Ranks that share a fast interconnect; an SP group stays inside one node unless sp_size exceeds it."""
    sp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """SP sizes the planner may choose; each divides model.num_heads, or (1D models) is a multiple of its K/V heads."""
    seed: int = 0
    """Seed of the per-epoch shuffle (numpy Generator seeded by (seed, epoch)). Per-sample randomness
    (noise, masks) comes from the dataset's own seed via dcp.runtime.data.sample_generator(seed, epoch, id)."""
    tokens_per_step: int = 0
    """The global batch in tokens: every method's steps hold about this many, each within step_tokens_bounds of it
    and the epoch's mean on it. 0 with samples_per_step 0: one default for every method (advanced.default_batch)."""
    samples_per_step: int = 0
    """The global batch in samples, as Megatron counts it (micro-batch x ga x data-parallel ranks): held as a
    target of samples_per_step x the epoch's mean length in tokens (batch_tokens). At most one of the two is set;
    0: not stated in samples."""
    step_tokens_bounds: tuple[float, float] = (0.9, 1.1)
    """[lowest, highest] tokens of one step as fractions of the global batch."""

    def __post_init__(self) -> None:
        check_fields(self, "planning", int_max={"seed": 2**63 - 1, "gmin": MAX_GA, "gmax": MAX_GA})
        sizes = self.sp_sizes
        if self.method not in METHODS + PEER_METHODS:
            fail("planning.method", self.method, f"is not one of {list(METHODS + PEER_METHODS)}",
                 "pick one of those names")
        if not 0 < self.mem_capacity_gib <= MAX_MEM_GIB:
            fail("planning.mem_capacity_gib", self.mem_capacity_gib, f"must be > 0 and <= {MAX_MEM_GIB} (1 PiB)",
                 "set the per-rank memory in GiB, e.g. 80")
        if self.seed < 0:
            fail("planning.seed", self.seed, "must be >= 0", "use a non-negative seed, e.g. 0")
        if self.gmin < 1:
            fail("planning.gmin", self.gmin, "must be >= 1", "set gmin to 1 or more")
        if self.gmax < 1:
            fail("planning.gmax", self.gmax, "must be >= 1", "set gmax to 1 or more")
        if self.gmin > self.gmax:
            raise ConfigError(f"planning.gmin ({self.gmin}) > planning.gmax ({self.gmax}): set gmin <= gmax")
        if self.ranks_per_node < 1:
            fail("planning.ranks_per_node", self.ranks_per_node, "must be >= 1", "set the GPUs per node, e.g. 8")
        if not sizes or any(p < 1 for p in sizes) or len(set(sizes)) != len(sizes):
            fail("planning.sp_sizes", list(sizes), "must be distinct positive integers", "e.g. [1, 2, 4, 8]")
        for name in ("tokens_per_step", "samples_per_step"):
            if getattr(self, name) < 0:
                fail(f"planning.{name}", getattr(self, name), "must be >= 0", "set the global batch, or 0 for the default")
        if self.tokens_per_step and self.samples_per_step:
            fail("planning.samples_per_step", self.samples_per_step, f"is set beside tokens_per_step ({self.tokens_per_step})",
                 "state the global batch once: set one of them to 0")
        b = self.step_tokens_bounds
        if len(b) != 2 or not 0 < b[0] <= 1 <= b[1] or b[0] == b[1]:  # against the data: planner.batch_settings
            fail("planning.step_tokens_bounds", list(b), "must be [low, high] with 0 < low <= 1 <= high and low < high "
                 "(whole samples cannot sum to exactly the global batch)",
                 "e.g. [0.9, 1.1] (a step holds 0.9x to 1.1x of the global batch)")

    @property
    def mem_capacity_bytes(self) -> int:
        return int(self.mem_capacity_gib * GIB)


@dataclass(kw_only=True, slots=True, frozen=True)
class RuntimeConfig:
    """How the manager runs a plan."""

    engine: str = "ddp"
    """Gradient-sync engine: ddp (bucketed all-reduce per step), deepspeed (ZeRO-1), fsdp2 (torch fully_shard: one
    gather and one reduce-scatter per step) or fsdp2-zero3 (both per micro-batch slot); docs/engines.md."""
    attention: str = "auto"
    """Attention kernel: auto (flash-attn on CUDA when installed, else SDPA), sdpa or flash."""
    precision: str = "auto"
    """Compute precision: auto (bf16 on CUDA, fp32 elsewhere), bf16 or fp32. bf16 keeps fp32 master weights
    and optimizer state (ddp: autocast over fp32 parameters; deepspeed: its own bf16 mode); profile tables
    are measured, and cached, per precision."""
    loss_weighting: str = "tokens"
    """Loss normalisation over the whole step: tokens or samples (all-reduced counts, never 1/ga_steps)."""
    collective_timeout_s: float = 300.0
    """Timeout of every collective dcp creates or uses but the agreement exchange's (advanced.plan_check_timeout_s):
    the SP groups, the world group's gradient sync. A rank that stalls or dies makes the others fail after this
    long, naming it and the phase it was in (see dcp.runtime.phases), instead of torch's default of 30 minutes. Raise it when one micro-batch or a
    checkpoint save between steps can take longer."""
    log_every: int = 10
    """Rank 0 logs one line every this many steps; each logged step all-gathers the step's loss, token
    count, per-rank busy time and the plans' running digest (one small collective on the default backend,
    and a synchronisation point, per logged step; unlogged steps run none). 1 checks every step (a
    divergent rank is then named at the next step instead of the next logged one)."""
    compile: str = "off"
    """torch.compile each repeated block (dcp.runtime.compiled), attention left eager: off, default or
    max-autotune-no-cudagraphs (not reduce-overhead: one CUDA graph per block call overwrites the previous
    layer's output, which autograd still holds). A short micro-batch on a GPU is
    bound by kernel launches, which compiling fuses. Applied by set_manager before the engine wraps the model
    and before profiling, so the table prices the compiled layers (cached per mode); the first micro-batch of
    a new shape pays the compilation."""

    lr_scaling: str = "none"
    """Scale each optimizer step's learning rate by its tokens over the global batch's (steps vary within
    planning.step_tokens_bounds): none, linear or sqrt (the rules of dcp.loaders.lr_scaling). Needs a global
    batch: stated (tokens_per_step, samples_per_step) or the default one (not advanced.default_batch = "method")."""
    nonfinite: str = "stop"
    """What a step whose loss or gradients are not finite does (checked at every step, before the update; one
    8-byte all-reduce and one host read per step): stop = raise NonFiniteError on every rank naming the step,
    the ranks and the sample ids, nothing applied; skip = the step is not applied (weights, optimizer state and
    LR schedule untouched), its samples are recorded as skipped in the checkpoint position and logged."""

    def __post_init__(self) -> None:
        check_fields(self, "runtime")
        for key, options, fix in (
                ("engine", ENGINE_NAMES, "pick one of those"),
                ("attention", ("auto", "sdpa", "flash"), "pick one of those"),
                ("precision", ("auto", "bf16", "fp32"), "pick one of those (auto: bf16 on CUDA, fp32 on CPU)"),
                ("loss_weighting", ("tokens", "samples"), "pick one"),
                ("compile", COMPILE_MODES, 'write compile = "off" (eager) or "default"'),
                ("lr_scaling", LR_SCALING, 'write lr_scaling = "none" (or "linear" / "sqrt" with planning.tokens_per_step)'),
                ("nonfinite", ("stop", "skip"),
                 'write nonfinite = "stop" (raise, nothing applied) or "skip" (drop the step, record its samples)')):
            if getattr(self, key) not in options:
                fail(f"runtime.{key}", getattr(self, key), f"is not one of {list(options)}", fix)
        if not self.collective_timeout_s > 0:
            fail("runtime.collective_timeout_s", self.collective_timeout_s, "must be > 0", "e.g. 300")
        if self.log_every < 1:
            fail("runtime.log_every", self.log_every, "must be >= 1", "set it to 1 or more")
        if self.nonfinite == "skip" and self.engine == "deepspeed":
            fail("runtime.nonfinite", self.nonfinite, "needs the ddp engine (DeepSpeed reduces and applies the "
                 "gradients in one call, so a step cannot be dropped between them)", 'write nonfinite = "stop", or engine = "ddp"')


def _more_sharding(engine: str) -> str:
    """The next engine that shards more of the state than ``engine`` (for the constant-memory refusal)."""
    if engine == "fsdp2":
        return ("use runtime.engine 'fsdp2-zero3' (fsdp2 holds the whole parameters and gradients through a step; "
                "ZeRO-3 holds 1/W of them and the layers in flight) ")
    if engine == "fsdp2-zero3":
        return ""
    return "use runtime.engine 'fsdp2' or 'fsdp2-zero3' (sharded state) "


@dataclass(kw_only=True, slots=True, frozen=True)
class DCPConfig:
    """The whole run: model shape, profiling, planning, runtime (and the advanced knobs). Relations between
    sections are checked."""

    model: ModelShapeConfig = field(default_factory=ModelShapeConfig)
    """Shape of the trained model."""
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    """Dual-layer profiler settings."""
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    """Planner settings."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Manager settings."""
    advanced: AdvancedConfig = field(default_factory=AdvancedConfig)
    """Tuning and diagnostic settings of the profiler, planner and runtime (dcp.config_advanced)."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"DCPConfig.{name} ({getattr(self, name)!r}) must be a {cls.__name__}: build it as "
                                f"{cls.__name__}(...), or load a TOML file with dcp.config.load_config")
        heads, kv = self.model.num_heads, self.model.kv_heads
        past = self.model.attentions_per_layer == 1  # 1D: sizes past the heads run as H_kv x context
        bad = [p for p in self.planning.sp_sizes if heads % p and not (past and p > heads and p % kv == 0)]
        if bad:
            raise ConfigError(
                f"planning.sp_sizes ({list(self.planning.sp_sizes)}) contains {bad}, which do not divide "
                f"model.num_heads ({heads}) (nor, for a 1D model, are multiples of its {kv} K/V heads past the "
                f"heads): use sizes from {[p for p in self.planning.sp_sizes if p not in bad] or [1]}, divisors of "
                f"{heads}" + (f" or multiples of {kv} above {heads}" if past else ""))
        p, adv = self.planning, self.advanced
        if self.runtime.lr_scaling != "none" and not (p.tokens_per_step or p.samples_per_step) \
                and adv.default_batch == "method":
            fail("runtime.lr_scaling", self.runtime.lr_scaling, "needs a global batch (the one the learning rate was "
                 "tuned for), and advanced.default_batch \"method\" leaves each method its own",
                 "set planning.samples_per_step or tokens_per_step, or lr_scaling = \"none\"")
        if adv.bucket_sp_size and adv.bucket_sp_size not in p.sp_sizes:
            fail("advanced.bucket_sp_size", adv.bucket_sp_size, f"is not in planning.sp_sizes "
                 f"({list(p.sp_sizes)})", "add it to sp_sizes (the runtime builds SP groups only for those "
                 "sizes) or use 0 to derive it")
        # the world size is unknown here: the engine's floor (the analytic model counts shards at its world size)
        const = self.model.constant_mem_bytes(self.runtime.engine, dp_size=None)
        if const >= self.planning.mem_capacity_bytes:
            raise ConfigError(
                f"planning.mem_capacity_gib ({self.planning.mem_capacity_gib}) is below the model's constant memory "
                f"({gib(const)} for parameters, gradients and optimizer state of {self.model.num_params:,} parameters "
                f"with runtime.engine {self.runtime.engine!r}): raise mem_capacity_gib, {_more_sharding(self.runtime.engine)}"
                "or a smaller model")

    def replace(self, **sections: Any) -> DCPConfig:
        return dataclasses.replace(self, **sections)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_SECTIONS: dict[str, type] = {"model": ModelShapeConfig, "profiling": ProfilingConfig, "planning": PlanningConfig,
                              "runtime": RuntimeConfig, "advanced": AdvancedConfig}


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] ({raw!r}) must be a table: write it as [{name}] with key = value lines")
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        key = unknown[0]
        home = _home_of(key)
        raise ConfigError(f"{name}.{key} ({raw[key]!r}) is not a known key: valid keys of [{name}] are {valid}"
                          + (f"; {key} is a key of [{home}]: move it there" if home else did_you_mean(key, valid)))
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    for f in dataclasses.fields(cls):
        if f.name in kwargs:
            check_field_type(name, f, kwargs[f.name])
    return cls(**kwargs)


def _home_of(key: str) -> str | None:
    """The section that has a field ``key`` (None: none has)."""
    return next((name for name, cls in _SECTIONS.items() if key in {f.name for f in dataclasses.fields(cls)}), None)


def config_from_dict(raw: dict[str, Any]) -> DCPConfig:
    """Build a DCPConfig from nested dicts; unknown sections or keys are errors listing the valid ones."""
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown and not isinstance(raw[unknown[0]], dict):  # a key above every [section] header
        key, home = unknown[0], _home_of(unknown[0])
        raise ConfigError(f"{key} ({raw[key]!r}) stands outside any section: put it under [{home}]" if home else
                          f"{key} ({raw[key]!r}) is not a known key: keys go under a section header, one of "
                          f"{sorted(_SECTIONS)}")
    if unknown:
        raise ConfigError(f"[{unknown[0]}] is not a known section: valid sections are {sorted(_SECTIONS)}"
                          + did_you_mean(unknown[0], sorted(_SECTIONS)))
    return DCPConfig(**{name: _build_section(name, cls, raw[name]) for name, cls in _SECTIONS.items() if name in raw})


def load_config(path: str | Path) -> DCPConfig:
    """Load a TOML file strictly (unknown sections or keys fail)."""
    return config_from_dict(read_toml(path))
