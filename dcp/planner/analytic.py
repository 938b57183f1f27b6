"""An analytic profile table: per-layer time and memory from FLOP and byte counts of a hardware spec.

Used when no measured table exists (planning ahead of a run, the CLI's default, the simulator). Every
figure is per rank of an SP group of p ranks running one micro-batch of b samples of s tokens.
Ulysses sequence parallelism splits tokens over the p ranks outside attention and heads inside it,
so compute and activations per rank scale with b*s/p; each attention exchanges q, k, v and the output
with an all-to-all (4 forward, 4 backward).

Formulas (h = hidden, f = ffn hidden, V = vocab, d = dtype bytes, n = b*s/p local tokens):

- linear FLOPs per layer forward: ``2 * n * P_layer``, ``P_layer = A*4h^2 + 3hf`` (A attentions per
  layer: 1 for "1d", 2 for "2d"; 3hf is a gated MLP, matching ModelShapeConfig.num_params).
- attention FLOPs per layer forward (QK^T and AV, 2 FLOPs per MAC, heads split over p):
  "1d" causal ``2 * b * s^2 * h / p`` (half of the full 4 b s^2 h);
  "2d" spatial + temporal over S tokens x T frames ``4 * b * (T S^2 + S T^2) * h / p``.
- backward = ``hardware.backward_factor`` x the forward's linear and elementwise time (input and weight
  gradients; 2.0 by the FLOP count, calibrated per hardware) and ``hardware.attention_backward_factor`` x
  the forward attention (2.0 by the FLOP count; flash attention recomputes QK^T: 2.5).
- layer GEMMs run at ``linear_efficiency x matmul_flops_per_s``; attention at ``attention_efficiency x
  matmul_flops_per_s``, or, where the hardware lists a measured attention throughput by sequence length
  (``attention_flops_per_s_by_seq``), at that figure interpolated in log2 of the attention's own sequence
  length (1d: s; 2d spatial: s / T; 2d temporal: T).
- memory-bound elementwise traffic per layer forward: ``(ELEMENTWISE_H * h + ELEMENTWISE_F * f) * n * d``
  bytes over mem_bandwidth.
- per-layer launch overhead: KERNELS_PER_LAYER x kernel_overhead_s forward, backward_factor x that backward.
- communication of the layout (u, c) of p (``dcp.planner.layout``): Ulysses all-to-alls,
  ``A2A_PER_ATTENTION * A`` per layer forward and the same backward, together moving
  ``n*h*d*(2 + 2 H_kv/H) * (u-1)/u`` bytes per rank (K/V unexpanded; 4 n h d without grouped K/V), at
  intra-node bandwidth when u <= ranks_per_node, else inter-node, plus collective_latency_s each; with
  c > 1 one K/V all-gather per attention (``2 b s/c (H_kv/u) head_dim d`` bytes from each rank), exposed,
  and the gathered K/V kept for backward in m_act. Zero for p = 1.
- m_act: the tensors a non-recomputed layer keeps for backward, counted from the reference models
  (``activation_bytes_per_token``: ``(ACT_H[layout] * h + ACT_F * f) * d`` + fp32 softmax statistics per
  head and attention + fp32 norm statistics, per local token; hardware with ``counted_activations=False``
  keeps the earlier round count); m_inp = ``n * h * d`` (the layer input, kept even when recomputed).
- T_C: embedding + LM head + loss: ``6 * n * V * h`` FLOPs (forward 2, backward 4) at the layer GEMMs'
  efficiency, logits traffic (``4 d`` bytes per logit plus ``hardware.head_extra_bytes_per_logit``),
  ``hardware.const_h_tensors`` h-wide tensors per token outside the layers, CONST_KERNELS launches and a
  fixed ``hardware.micro_batch_overhead_s``.
- fsdp2-zero3: a layer takes at least its gathers (``zero3_gather_s``: 1 round forward, 2 backward; prefetch
  hides them up to there); T_C adds the root unit's (embedding, head) 3 rounds, which nothing hides.
- M_C: parameters + gradients + optimizer state as the engine holds them (ModelShapeConfig.constant_mem_bytes;
  ``engine`` defaults to deepspeed, ZeRO-1, the paper's; analytic_table_for passes runtime.engine) + all-to-all
  buffers (``2 * n * h * d``) + the larger of the head's working set (logits and their gradient, ``2 * n * V * d``;
  with ``loss_chunk_tokens`` > 0 only one chunk's, dcp.models.loss) and one layer's working set (the row's own m_act). The last term
  is the measured profiler's M_C (dcp/profiler/measure.py, docs/profiler.md "What is measured"): with full
  recompute (r = L) Eq. 6 keeps only the L layer inputs, yet backward re-materialises one layer's
  activations at a time, so the true peak is ``L * m_inp + m_act + ...``; without this term Eq. 6 at r = L
  has no room for the layer being recomputed. The head's tensors are freed before the first layer is
  recomputed, so the two working sets are never alive together (hence the max, not the sum). For r < L
  the estimate is conservative by at most one m_act, as for a measured table.

The simulator defines other HardwareSpec instances (H100, H200) and reuses these public functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dcp.config import GRAD_BUCKET_MIB, DCPConfig, ModelShapeConfig  # noqa: F401 (GRAD_BUCKET_MIB: dcp.sim reads it here)
from dcp.planner.cost import micro_batch_mem_bytes
from dcp.planner.layout import context_slowdown, layout_comm_s, layout_saved_bytes
from dcp.planner.table import ProfileRow, ProfileTable, TableMeta

BACKWARD_FLOPS_FACTOR = 2.0
"""Backward computes input and weight gradients: about twice the forward FLOPs (standard 1:2 ratio); the
default of ``HardwareSpec.backward_factor`` and ``attention_backward_factor``."""
ELEMENTWISE_H = 12
"""h-wide tensors read or written by memory-bound ops per layer forward (2 norms, 2 residual adds,
rotary on q and k, dropout-free bias/scale): a round count, not measured."""
ELEMENTWISE_F = 4
"""f-wide tensors read or written per layer forward (gate activation and the gate*up product)."""
KERNELS_PER_LAYER = 24
"""Kernel launches per layer forward (matmuls, norms, activations, attention, copies), eager mode."""
CONST_KERNELS = 16
"""Kernel launches outside the layers per micro-batch (embedding, head, loss, their backward)."""
A2A_PER_ATTENTION = 4
"""Ulysses all-to-alls per attention forward (q, k, v in; output back); backward runs the same number."""
ACT_H = {"1d": 9, "2d": 14}
"""h-wide tensors (at the model's dtype) one layer keeps for backward, counted from the reference models
(dcp/models/t1d.py, t2d.py) the way the profiler counts them (saved-tensor storages, the layer input
excluded; tests/unit/test_sim_calibration.py re-counts them with ``torch.autograd.graph.saved_tensors_hooks``):

- 1d: attention norm output 1, the fused qkv output 3 (v is a view of it and keeps the whole storage),
  q and k after RoPE 2, attention output 1, MLP-norm input (the residual sum) 1, MLP-norm output 1 = 9;
- 2d: spatial norm output 1 + qkv 3 + output 1; temporal norm input 1 + its transposed output 1 + qkv 3 +
  output 1 + the transposed output copy the projection saves 1; MLP-norm input 1 + output 1 = 14.

Checked against the H100 measurement (dcp/sim/data/h100-bf16-2026-11-22.json, profile_rows,
allocator meter): t1d-5b 60,516 two-byte units per token counted and measured; t2d-1.2b 53,062 counted
against 53,190 measured (0.24% under)."""
ACT_F = 4
"""f-wide tensors the gated MLP keeps: gate output, silu(gate), up output and their product."""
LEGACY_ACT_H = 6
"""The earlier round count of h-wide activations per attention (norm output, q, k, v, attention output,
projection result), kept by hardware with ``counted_activations=False``."""
LEGACY_ACT_F = 3
"""The earlier round count of f-wide MLP activations (gate, up, product)."""
NORMS = {"1d": 2, "2d": 3}
"""RMSNorms per layer; each keeps one fp32 statistic per token (CUDA's fused RMSNorm saves input and rstd)."""
STAT_BYTES = 4
"""Bytes of one fp32 statistic: the attention's log-sum-exp per head and token, a norm's rstd per token."""
DTYPE_NAMES = {4: "float32", 2: "bfloat16", 1: "float8"}
"""Names written into TableMeta.dtype."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    """Per-rank speeds of one accelerator (or CPU process) and its interconnect."""

    name: str
    """Written into TableMeta.hardware, e.g. 'cpu-small' or 'NVIDIA H200 (analytic)'."""
    matmul_flops_per_s: float
    """Sustained dense-matmul throughput of one rank at the table's dtype (FLOP/s)."""
    attention_efficiency: float = 0.7
    """Fraction of matmul_flops_per_s an attention kernel reaches (softmax and masking cost extra)."""
    mem_bandwidth_bytes_per_s: float
    """Sustained memory bandwidth of one rank for elementwise ops (bytes/s)."""
    intra_node_bw_bytes_per_s: float
    """Per-rank all-to-all bandwidth inside a node (NVLink, or loopback for CPU processes) (bytes/s)."""
    inter_node_bw_bytes_per_s: float
    """Per-rank all-to-all bandwidth across nodes (InfiniBand/Ethernet) (bytes/s)."""
    collective_latency_s: float
    """Fixed start-up time of one collective call (s)."""
    ranks_per_node: int
    """Ranks sharing the intra-node interconnect."""
    kernel_overhead_s: float
    """Fixed launch/dispatch cost of one kernel (s); dominates tiny shapes on CPU."""
    mem_capacity_bytes: float
    """Memory of one rank (bytes); the default capacity for tables built for this hardware."""
    linear_efficiency: float = 1.0
    """Fraction of matmul_flops_per_s the layer GEMMs (and the head's) reach at the table's shapes."""
    backward_factor: float = BACKWARD_FLOPS_FACTOR
    """Backward / forward time of a layer's linear and elementwise work."""
    attention_backward_factor: float = BACKWARD_FLOPS_FACTOR
    """Backward / forward time of attention (2 by FLOPs; flash attention recomputes QK^T: 2.5)."""
    attention_flops_per_s_by_seq: tuple[tuple[int, float], ...] = ()
    """Measured attention throughput (forward + backward, FLOP/s counted as (1 + attention_backward_factor)
    x the forward) by sequence length, increasing lengths; empty: attention_efficiency x matmul."""
    head_extra_bytes_per_logit: float = 0.0
    """Logit bytes the loss moves beyond the 4 d the model always counts (e.g. an fp32 cross-entropy)."""
    const_h_tensors: float = 0.0
    """h-wide tensors (model dtype) read or written per token outside the layers (embedding, positions,
    final norm, head input and their gradients)."""
    micro_batch_overhead_s: float = 0.0
    """Fixed host time of one micro-batch outside the layers (input preparation, masks, loss, launches)."""
    counted_activations: bool = True
    """m_act from the reference models' saved tensors under CUDA kernels (``activation_bytes_per_token``);
    False keeps the earlier round count ``(LEGACY_ACT_H * A * h + LEGACY_ACT_F * f) * d`` (the CPU model:
    CPU runs plan from measured tables, its composite RMSNorm keeps other tensors, and the planner's tests
    are sized on it)."""
    step_overhead_s: float = 0.0
    """Fixed framework time per optimizer step beyond compute, gradient sync and the optimizer: the
    runtime manager's step start (plan broadcast, stats gather), collation in the main loop and the
    engine's update bookkeeping. Added by the simulator to every step's optimizer time."""
    context_attention_efficiency: float = 1.0
    """A context rank's attention rate over the rate of one call over the whole sequence at the same FLOPs: its
    chunks run as short-query, long-key calls under a lower-right causal bias (``dcp.runtime.context_parallel``)."""

    def __post_init__(self) -> None:
        for name in (
            "matmul_flops_per_s",
            "attention_efficiency",
            "context_attention_efficiency",
            "mem_bandwidth_bytes_per_s",
            "intra_node_bw_bytes_per_s",
            "inter_node_bw_bytes_per_s",
            "mem_capacity_bytes",
            "linear_efficiency",
            "backward_factor",
            "attention_backward_factor",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"HardwareSpec.{name} ({getattr(self, name)!r}) must be > 0: give a measured figure"
                )
        for name in ("collective_latency_s", "kernel_overhead_s", "head_extra_bytes_per_logit", "const_h_tensors",
                     "micro_batch_overhead_s", "step_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"HardwareSpec.{name} ({getattr(self, name)!r}) must be >= 0: use 0 to ignore it"
                )
        if self.ranks_per_node < 1:
            raise ValueError(f"HardwareSpec.ranks_per_node ({self.ranks_per_node}) must be >= 1: e.g. 8")
        seqs = [s for s, _ in self.attention_flops_per_s_by_seq]
        if any(b <= a for a, b in zip(seqs, seqs[1:], strict=False)) or any(
            not (s > 0 and f > 0) for s, f in self.attention_flops_per_s_by_seq
        ):
            raise ValueError(
                f"HardwareSpec.attention_flops_per_s_by_seq ({self.attention_flops_per_s_by_seq!r}) must hold "
                "(sequence length, FLOP/s) pairs > 0 with increasing lengths: list measured points in order"
            )

    def attention_time_s(self, flops_fwd: float, seq: int) -> tuple[float, float]:
        """(forward, backward) seconds of attention doing ``flops_fwd`` forward FLOPs over sequences of ``seq``."""
        if flops_fwd <= 0:
            return 0.0, 0.0
        if not self.attention_flops_per_s_by_seq:
            t_f = flops_fwd / (self.matmul_flops_per_s * self.attention_efficiency)
            return t_f, self.attention_backward_factor * t_f
        pts = self.attention_flops_per_s_by_seq
        x = math.log2(max(seq, 1))
        xs = [math.log2(s) for s, _ in pts]
        if x <= xs[0]:
            rate = pts[0][1]
        elif x >= xs[-1]:
            rate = pts[-1][1]
        else:
            i = next(k for k in range(1, len(xs)) if x <= xs[k])
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            rate = pts[i - 1][1] + w * (pts[i][1] - pts[i - 1][1])
        total = flops_fwd * (1 + self.attention_backward_factor) / rate
        return total / (1 + self.attention_backward_factor), total * self.attention_backward_factor / (
            1 + self.attention_backward_factor
        )


CPU_SMALL = HardwareSpec(
    name="cpu-small",
    # One rank per core of a 2-core x86 CPU: AVX2 FMA peak ~80 GFLOP/s per core at 2.5 GHz, eager
    # PyTorch fp32 matmuls reach about half of it.
    matmul_flops_per_s=40e9,
    attention_efficiency=0.5,
    # DDR4 shared by both cores: ~20 GB/s total, ~10 GB/s per rank in practice for elementwise kernels.
    mem_bandwidth_bytes_per_s=10e9,
    # gloo over loopback TCP moves ~1-2 GB/s per rank; all ranks share one machine, so intra == inter.
    intra_node_bw_bytes_per_s=1.5e9,
    inter_node_bw_bytes_per_s=1.5e9,
    collective_latency_s=100e-6,
    ranks_per_node=8,
    # PyTorch eager dispatch of one small CPU op: ~10 us.
    kernel_overhead_s=10e-6,
    mem_capacity_bytes=4 * 1024**3,
    counted_activations=False,
    # Measured in an instrumented W = 2 cpu_small run (docs/benchmarks.md, "Simulator"): the manager's step
    # start 1.0-3.6 ms (stats all-gather with stats_every = 1), collation in the main loop 0.2-2.0 ms, the
    # engine's update 2-3 ms beyond the profiler's stand-in update: midpoints 2.3 + 1.1 + 2.5 ms.
    step_overhead_s=5.9e-3,
)
"""A laptop-class 2-core CPU running one gloo rank per core (the project's test machine)."""


def _attentions(attention: str) -> int:
    if attention not in ("1d", "2d"):
        raise ValueError(f"attention ({attention!r}) is not '1d' or '2d': pick the model's attention layout")
    return 1 if attention == "1d" else 2


def layer_linear_params(model: ModelShapeConfig, attention: str = "1d") -> int:
    """Parameters of the matmuls of one layer: A*4h^2 (q, k, v, o per attention) + 3hf (gated MLP)."""
    h = model.hidden_size
    return _attentions(attention) * 4 * h * h + 3 * h * model.ffn_size


def attention_flops_fwd(
    model: ModelShapeConfig,
    seq_len: int,
    micro_batch_size: int,
    sp_size: int,
    *,
    attention: str = "1d",
    frames: int | None = None,
) -> float:
    """Forward attention FLOPs per rank of one layer (QK^T and AV; heads are split over the p ranks)."""
    h, b, s = model.hidden_size, micro_batch_size, seq_len
    if _attentions(attention) == 1:
        return 2.0 * b * s * s * h / sp_size
    t = frames if frames else max(1, round(math.sqrt(s)))
    spatial = s / t
    return 4.0 * b * (t * spatial * spatial + spatial * t * t) * h / sp_size


def attention_time_s(
    model: ModelShapeConfig,
    seq_len: int,
    micro_batch_size: int,
    sp_size: int,
    hardware: HardwareSpec,
    *,
    attention: str = "1d",
    frames: int | None = None,
) -> tuple[float, float]:
    """(forward, backward) attention seconds per rank of one layer; 2d splits spatial (over s / T) and
    temporal (over T) attention so each is priced at its own sequence length."""
    h, b, s = model.hidden_size, micro_batch_size, seq_len
    if _attentions(attention) == 1:
        return hardware.attention_time_s(2.0 * b * s * s * h / sp_size, s)
    t = frames if frames else max(1, round(math.sqrt(s)))
    spatial = s / t
    sf, sb = hardware.attention_time_s(4.0 * b * t * spatial * spatial * h / sp_size, max(1, round(spatial)))
    tf, tb = hardware.attention_time_s(4.0 * b * spatial * t * t * h / sp_size, t)
    return sf + tf, sb + tb


def activation_bytes_per_token(model: ModelShapeConfig, attention: str = "1d", dtype_bytes: int = 4) -> float:
    """Bytes one layer keeps for backward per local token (see ACT_H): h- and f-wide tensors at the model's
    dtype, the attention's fp32 log-sum-exp per head (heads / p per rank, over s tokens: per local token
    that is all heads) and each norm's fp32 rstd."""
    a = _attentions(attention)
    h, f = model.hidden_size, model.ffn_size
    return (ACT_H[attention] * h + ACT_F * f) * dtype_bytes + STAT_BYTES * (a * model.num_heads + NORMS[attention])


def all_to_all_time_s(bytes_per_rank: float, sp_size: int, hardware: HardwareSpec) -> float:
    """One Ulysses all-to-all over p ranks: latency + bytes * (p-1)/p over intra- or inter-node bandwidth."""
    if sp_size <= 1:
        return 0.0
    bw = (
        hardware.intra_node_bw_bytes_per_s
        if sp_size <= hardware.ranks_per_node
        else hardware.inter_node_bw_bytes_per_s
    )
    return hardware.collective_latency_s + bytes_per_rank * (sp_size - 1) / sp_size / bw


def analytic_row(
    model: ModelShapeConfig,
    seq_group: int,
    seq_len: int,
    micro_batch_size: int,
    sp_size: int,
    *,
    world_size: int,
    hardware: HardwareSpec,
    dtype_bytes: int = 4,
    attention: str = "1d",
    frames: int | None = None,
    engine: str = "deepspeed",
    loss_chunk_tokens: int = 0,
) -> ProfileRow:
    """One ProfileRow from the formulas in the module docstring (feasible=True; the caller checks memory)."""
    a = _attentions(attention)
    h, f, v, d = model.hidden_size, model.ffn_size, model.vocab_size, dtype_bytes
    n = micro_batch_size * seq_len / sp_size  # local tokens per rank
    mm = hardware.matmul_flops_per_s * hardware.linear_efficiency
    bw = hardware.mem_bandwidth_bytes_per_s
    lin = 2.0 * n * layer_linear_params(model, attention) / mm
    att_f, att_b = attention_time_s(model, seq_len, micro_batch_size, sp_size, hardware, attention=attention, frames=frames)
    slow = context_slowdown(model, sp_size, hardware, attention)
    att_f, att_b = att_f * slow, att_b * slow
    elem = (ELEMENTWISE_H * h + ELEMENTWISE_F * f) * n * d / bw
    launch = KERNELS_PER_LAYER * hardware.kernel_overhead_s
    # Ulysses all-to-alls (K/V unexpanded) and, past the K/V heads, the context axis's K/V all-gather.
    a2a = layout_comm_s(model, micro_batch_size, seq_len, sp_size, hardware, dtype_bytes=d, attentions=a)
    t_f = lin + att_f + elem + launch + a2a
    t_b = hardware.backward_factor * (lin + elem + launch) + att_b + a2a
    t_const = (
        (6.0 * n * v * h) / mm
        + (4.0 * d + hardware.head_extra_bytes_per_logit) * n * v / bw
        + hardware.const_h_tensors * n * h * d / bw
        + CONST_KERNELS * hardware.kernel_overhead_s
        + hardware.micro_batch_overhead_s
    )
    if engine == "fsdp2-zero3":  # each layer at least its gathers (prefetched); the root unit's are not hidden
        gather = zero3_gather_s(layer_linear_params(model, attention) * model.param_bytes, world_size, hardware)
        root = zero3_gather_s(2 * v * h * model.param_bytes, world_size, hardware)
        t_f, t_b, t_const = max(t_f, gather), max(t_b, 2 * gather), t_const + 3 * root
    if hardware.counted_activations:
        m_act = activation_bytes_per_token(model, attention, d) * n
    else:
        m_act = (LEGACY_ACT_H * a * h + LEGACY_ACT_F * f) * n * d
    m_act += layout_saved_bytes(model, micro_batch_size, seq_len, sp_size, dtype_bytes=d)
    # M_C holds the larger of the head's (logits + gradient) and one recomputed layer's working set, as the
    # profiler measures it: Eq. 6 at r = L otherwise has no room for the layer being recomputed.
    m_const = model.constant_mem_bytes(engine, dp_size=world_size, compute_bytes=d) + 2.0 * n * h * d + max(
        2.0 * (min(n, loss_chunk_tokens) if loss_chunk_tokens > 0 else n) * v * d, m_act)
    return ProfileRow(seq_group=seq_group, seq_len=seq_len, micro_batch_size=micro_batch_size, sp_size=sp_size,
                      t_f_s=t_f, t_b_s=t_b, m_act_bytes=m_act, m_inp_bytes=n * h * d, t_const_s=t_const,
                      m_const_bytes=m_const, num_layers=model.num_layers, feasible=True)


def zero3_gather_s(param_bytes: float, world_size: int, hardware: HardwareSpec) -> float:
    """One all-gather (or reduce-scatter) of ``param_bytes`` sharded over ``world_size`` ranks (ring)."""
    return 0.0 if world_size <= 1 else all_to_all_time_s(param_bytes, world_size, hardware)


def grad_sync_time_s(model: ModelShapeConfig, hardware: HardwareSpec, world_size: int) -> float:
    """Once per optimizer step: ring all-reduce (ZeRO-1: reduce-scatter + all-gather) of the gradients."""
    return 2 * zero3_gather_s(model.num_params * model.param_bytes, world_size, hardware)  # two rounds


def optimizer_step_time_s(model: ModelShapeConfig, hardware: HardwareSpec, world_size: int) -> float:
    """Once per optimizer step: memory-bound Adam update of this rank's 1/W shard (ZeRO-1)."""
    per_param = 3 * model.param_bytes + 2 * model.optimizer_bytes_per_param  # read p, g; write p; r/w state
    return model.num_params * per_param / max(1, world_size) / hardware.mem_bandwidth_bytes_per_s


def _table_args(model: ModelShapeConfig, seq_group_edges: Sequence[int], *, sp_sizes: Sequence[int],
                max_micro_batch_size: int, world_size: int, dtype_bytes: int, attention: str,
                frames_per_sample: int | Sequence[int] | None) -> tuple[tuple[int, ...], list]:
    """``analytic_table``'s arguments checked (one clear error each): the edges and the frames per seq_group."""
    _attentions(attention)
    edges = tuple(int(e) for e in seq_group_edges)
    if not edges or any(e < 1 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(
            f"seq_group_edges ({list(edges)}) must be positive and strictly increasing: sort them"
        )
    if max_micro_batch_size < 1:
        raise ValueError(f"max_micro_batch_size ({max_micro_batch_size}) must be >= 1: e.g. 8")
    if world_size < 1:
        raise ValueError(f"world_size ({world_size}) must be >= 1: pass the number of ranks")
    if dtype_bytes not in DTYPE_NAMES:
        raise ValueError(
            f"dtype_bytes ({dtype_bytes}) is not one of {sorted(DTYPE_NAMES)}: use 4 (fp32) or 2 (bf16)"
        )
    bad = [p for p in sp_sizes if p < 1 or (model.num_heads % p and (p < model.num_heads or p % model.kv_heads))]
    if bad:
        raise ValueError(
            f"sp_sizes ({list(sp_sizes)}) contains {bad}, which do not divide model.num_heads ({model.num_heads}) "
            f"nor are multiples of its K/V heads ({model.kv_heads}) above it: Ulysses shards heads, context "
            "parallelism the sequence past them; use such sizes"
        )
    if frames_per_sample is None or isinstance(frames_per_sample, int):
        frames = [frames_per_sample] * len(edges)
    else:
        frames = list(frames_per_sample)
        if len(frames) != len(edges):
            raise ValueError(
                f"frames_per_sample ({frames}) has {len(frames)} entries for {len(edges)} seq_groups: "
                "give one value or one per seq_group"
            )
    return edges, frames


def analytic_table(
    model: ModelShapeConfig,
    seq_group_edges: Sequence[int],
    *,
    sp_sizes: Sequence[int],
    max_micro_batch_size: int,
    world_size: int,
    hardware: HardwareSpec,
    dtype_bytes: int = 4,
    attention: str = "1d",
    frames_per_sample: int | Sequence[int] | None = None,
    mem_capacity_bytes: float | None = None,
    engine: str = "deepspeed",
    loss_chunk_tokens: int = 0,
) -> ProfileTable:
    """Rows for every seq_group edge, p in sp_sizes (p <= world_size) and b = 1, 2, 4, ... <= max.

    ``frames_per_sample`` (2d only): T per sample, one value or one per seq_group; None splits
    s = S x T as a square. A row whose memory at r = L exceeds ``mem_capacity_bytes`` is kept with
    feasible=False and larger b at that (seq_group, p) are not generated (memory grows with b).
    """
    edges, frames = _table_args(model, seq_group_edges, sp_sizes=sp_sizes, max_micro_batch_size=max_micro_batch_size,
                                world_size=world_size, dtype_bytes=dtype_bytes, attention=attention,
                                frames_per_sample=frames_per_sample)
    rows = []
    for g, s in enumerate(edges):
        for p in sorted(set(sp_sizes)):
            if p > world_size:
                continue
            b = 1
            while b <= max_micro_batch_size:
                row = analytic_row(model, g, s, b, p, world_size=world_size, hardware=hardware, engine=engine,
                                   loss_chunk_tokens=loss_chunk_tokens,
                                   dtype_bytes=dtype_bytes, attention=attention, frames=frames[g])
                if not (mem_capacity_bytes is None or micro_batch_mem_bytes(row, row.num_layers) <= mem_capacity_bytes):
                    rows.append(dataclasses.replace(row, feasible=False))
                    break
                rows.append(row)
                b *= 2
    meta = TableMeta(
        model=model.name,
        hardware=hardware.name,
        dtype=DTYPE_NAMES[dtype_bytes],
        world_size=world_size,
        seq_group_edges=edges,
        source="analytic",
        extra={"attention": attention, "frames_per_sample": frames, "mem_capacity_bytes": mem_capacity_bytes},
    )
    return ProfileTable(rows, meta)


def analytic_table_for(
    config: DCPConfig,
    world_size: int,
    *,
    hardware: HardwareSpec = CPU_SMALL,
    sp_sizes: Sequence[int] | None = None,
    mem_capacity_bytes: float | None = None,
) -> ProfileTable:
    """``analytic_table`` for a run config: its model shape (2D attention when the model has two
    attentions per layer), seq_group edges, SP sizes, micro-batch bound and memory capacity."""
    return analytic_table(
        config.model,
        config.profiling.seq_group_edges,
        sp_sizes=config.planning.sp_sizes if sp_sizes is None else sp_sizes,
        max_micro_batch_size=config.profiling.max_micro_batch_size,
        world_size=world_size,
        hardware=hardware,
        attention="2d" if config.model.attentions_per_layer == 2 else "1d",
        mem_capacity_bytes=config.planning.mem_capacity_bytes if mem_capacity_bytes is None else mem_capacity_bytes,
        engine=config.runtime.engine,
    )
