"""The ``[advanced]`` section: tuning and diagnostic settings, kept out of the four sections a user writes.

Every field here has a default that suits every run, so the paper's ten-line usage never names one: how many
times the profiler repeats a layer and which clock reads it, whether a stale cached table may be profiled again,
how far the planner looks ahead, how micro-batches and the default global batch are formed, the plan check's
own timeout, how long a silent peer is waited for, and the like. A run changes one to measure its effect (the
benches do) or to work around a machine (a shared CPU box profiles with ``clock = "cpu"``). A key of this
section written under its former section (``[planning] lookahead_samples = ...``) fails, naming [advanced].
"""

from __future__ import annotations

from dataclasses import dataclass

from dcp.validate import check_fields, fail

CLOCKS = ("auto", "wall", "cpu", "pipelined")
"""advanced.clock choices (dcp.profiler.clock)."""
MICRO_BATCH_TOKENS = ("off", "auto")
"""How DCP micro-batches are sized (advanced.micro_batch_tokens): by samples only, or by tokens where cheaper."""
PLANNING_FIELDS = ("lookahead_samples", "packed_token_budget", "grad_sync_s", "bucket_sp_size", "default_batch",
                   "micro_batch_tokens")
"""The fields that change an epoch's plans (dcp.runtime.position.plan_inputs keys a checkpoint's plan by them)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class AdvancedConfig:
    """Tuning and diagnostic settings of the profiler, the planner and the runtime (docs/runtime.md)."""

    # profiler
    warmup_iters: int = 1
    """Profiler: untimed repetitions of a layer before the measured ones (default 1)."""
    measure_iters: int = 3
    """Profiler: timed repetitions of a layer; the median is recorded (default 3)."""
    clock: str = "auto"
    """Profiler: how a layer's time is read (dcp.profiler.clock): 'auto' (= wall; measured against whole-model
    steps on an H200 it predicted better than pipelined), 'wall' (elapsed time between two syncs), 'pipelined'
    (CUDA: max of the host's enqueue time and the GPU's time with its queue pre-filled, as inside a whole model)
    or 'cpu' (the profiling process's CPU time: stable on a shared, oversubscribed CPU machine, where elapsed
    time also counts the slices other processes take, but blind to time spent waiting for communication)."""
    strict_cache: bool = False
    """Profiler: False: inside a training run a missing or stale cached table is profiled again in the run (and
    the log says so). True: the run never profiles; a missing or stale table is an error (corrupt tables are
    refused either way)."""

    # planner
    lookahead_samples: int = 0
    """Planner: samples the step assembler may read ahead of the stream to fill ranks. 0 sizes the window from
    the profile table: LOOKAHEAD_WORK_FACTOR = 4 x the samples whose GPU-time fills the longest step Gmax allows
    (Gmax x the longest micro-batch) on every rank, at least 32 per rank, at most the epoch
    (dcp.planner.epoch.default_lookahead; the work-sized window normally ends well inside it)."""
    packed_token_budget: int = 0
    """Planner, packed method only: tokens per micro-batch; 0 derives it from the table and the memory capacity."""
    grad_sync_s: float = 0.0
    """Planner, DCP methods with the ddp engine: seconds of the step's gradient all-reduce (measured on the
    cluster, or priced for the hardware: ``dcp.planner.analytic.grad_sync_time_s``). The planner then ends each
    SP group on a last micro-batch whose backward hides it where that ends the step earlier (dcp.planner.syncend).
    0: the figure the profiler measured on the job's own ranks (the table's ``grad_sync_s``, when profiled at
    this world size with the ddp engine); a table without one (analytic, one rank) plans as without it."""
    bucket_sp_size: int = 0
    """Planner, bucket/packed only: fixed SP size (one of planning.sp_sizes); 0 picks the smallest that fits the
    longest seq_group."""
    default_batch: str = "data"
    """Planner, with neither planning.tokens_per_step nor samples_per_step set: "data" (16 x W samples of the
    mean, at least 8 x the longest, at most 1/16 of the epoch: step_tokens.batch_tokens) or "method" (each
    method's own steps: DCP's by Gmax x its longest micro-batch, bucket's one micro-batch per SP group; methods
    then train different batches)."""
    micro_batch_tokens: str = "auto"
    """Planner, DCP methods, 1D data: "auto" lets each seq_group whose documents sit well below its bound form its
    micro-batches by a token budget (b x bound of the profiled row with the best predicted time per token at
    its (p, r) within memory), run as one row of documents, where that is predicted cheaper per token than
    b-sample micro-batches (dcp.planner.tokens; none for 2D data or baselines; ``dcp plan`` says which); "off"."""

    # runtime
    check_plan_hash: bool = True
    """Runtime: check that all ranks run the same step plans and data: every step's plan digest is folded into a
    running digest, compared at the first step of each get_data_iter() call (with the data's digest, before
    any other collective), at every logged step and at the end of the epoch (or a pause); a mismatch names
    the first step that differs. No extra planning pass and no collective on unlogged steps."""
    peer_timeout_s: float = 20.0
    """Runtime: a rank whose heartbeat stood still this long inside its epoch (killed, stopped, a frozen host) is
    named by every other rank, which then ends its process with exit status 3 even while it waits inside a
    collective (dcp.runtime.watchdog); independent of the step's length. 0 turns the watch off (the collectives
    then fail after runtime.collective_timeout_s). Keep it well above a few heartbeat periods (1 s per 1000
    ranks, at least 1 s)."""
    plan_check_timeout_s: float = 60.0
    """Runtime: timeout of the agreement exchange's own process group (the plan / data / position checks and the
    logged steps' stats), so a divergent rank fails instead of hanging (default 60)."""
    stats_every: int = 0
    """Runtime: also gather the step statistics (StepStats: loss, count, per-rank busy time) every this many steps
    without logging them, e.g. 1 for experiment runs that record every step; 0: only on logged steps."""
    prefetch: str = "auto"
    """Runtime: collate (and pin) the next micro-batch on a background thread while the current one trains (the
    same batches in the same order): on, off, or auto = on when the run's device is CUDA (the host idles while
    the GPU computes), off on CPU, where the collating thread competes with the compute for the same cores
    (dcp bench runtime: batch_wait_ms)."""
    cache_weight_casts: bool = False
    """Runtime, ddp with bf16 autocast: cast the weights at a step's first micro-batch and reuse the copies in its
    later ones (exact when each weight is used once per forward; skipped where layers are recomputed). Off by
    default: a model that checkpoints its own layers would keep copies its profiled rows do not count
    (docs/runtime.md)."""

    def __post_init__(self) -> None:
        check_fields(self, "advanced")
        _check_profiler(self)
        _check_planner(self)
        _check_runtime(self)


def _check_profiler(a: AdvancedConfig) -> None:
    if a.warmup_iters < 0:
        fail("advanced.warmup_iters", a.warmup_iters, "must be >= 0", "set it to 0 or more")
    if a.measure_iters < 1:
        fail("advanced.measure_iters", a.measure_iters, "must be >= 1", "set it to 1 or more")
    if a.clock not in CLOCKS:
        fail("advanced.clock", a.clock, f"is not one of {list(CLOCKS)}", 'write clock = "auto"')
    if not isinstance(a.strict_cache, bool):
        fail("advanced.strict_cache", a.strict_cache, "must be true or false", "write strict_cache = false")


def _check_planner(a: AdvancedConfig) -> None:
    if a.lookahead_samples < 0:
        fail("advanced.lookahead_samples", a.lookahead_samples, "must be >= 0", "use 0 for the default")
    if a.packed_token_budget < 0:
        fail("advanced.packed_token_budget", a.packed_token_budget, "must be >= 0", "use 0 to derive it")
    if a.grad_sync_s < 0:
        fail("advanced.grad_sync_s", a.grad_sync_s, "must be >= 0",
             "give the step's gradient all-reduce in seconds, or 0 when unknown")
    if a.bucket_sp_size < 0:
        fail("advanced.bucket_sp_size", a.bucket_sp_size, "must be >= 0", "use 0 to derive it")
    if a.default_batch not in ("data", "method"):
        fail("advanced.default_batch", a.default_batch, "is not one of ['data', 'method']", 'write "data"')
    if a.micro_batch_tokens not in MICRO_BATCH_TOKENS:
        fail("advanced.micro_batch_tokens", a.micro_batch_tokens, f"is not one of {list(MICRO_BATCH_TOKENS)}",
             'write micro_batch_tokens = "auto" (token-packed short documents) or "off"')


def _check_runtime(a: AdvancedConfig) -> None:
    if a.prefetch not in ("auto", "on", "off"):
        fail("advanced.prefetch", a.prefetch, "is not one of ['auto', 'on', 'off']",
             "pick one of those (auto: on with CUDA, off on CPU)")
    if not (a.peer_timeout_s == 0 or 5 <= a.peer_timeout_s < float("inf")):
        fail("advanced.peer_timeout_s", a.peer_timeout_s, "must be 0 (off) or a finite number >= 5 seconds "
             "(several heartbeat periods)", "e.g. 20")
    if not a.plan_check_timeout_s > 0:
        fail("advanced.plan_check_timeout_s", a.plan_check_timeout_s, "must be > 0", "e.g. 60")
    if a.stats_every < 0:
        fail("advanced.stats_every", a.stats_every, "must be >= 0", "use 0 for logged steps only, 1 for every step")
