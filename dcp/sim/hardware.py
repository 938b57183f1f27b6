"""The simulated clusters (H100, H200); the paper's two model shapes are in ``dcp.named_models``.

The formulas live in ``dcp.planner.analytic`` (FLOPs and bytes per layer, Ulysses all-to-all, ZeRO-1 sync,
optimizer step); this module only supplies the numbers, each with its source.

Sources:

- [paper] Testbed section (4.1) of the DCP paper: "a cluster of NVIDIA H200 GPUs. Each node contains 8 GPUs
  connected via 900GB/s NVLink, with an 8x400Gbs InfiniBand network for internode communication. Although
  H200 GPUs have 141GB of memory, we limit usage to 80GB". The blog measures on 32 H100s (NVLink + IB).
- [vendor] NVIDIA H100 / H200 SXM datasheets: dense BF16 989 TFLOP/s (1979 with sparsity) on both; HBM3 3.35
  TB/s (H100, 80 GB), HBM3e 4.8 TB/s (H200, 141 GB); NVLink 4 at 900 GB/s total per GPU (450 GB/s each way).
- [measured] bf16 dense GEMM (large square matmuls, torch.matmul) sustains 788-798 TFLOP/s on both H100 SXM
  and H200 SXM (the project's measurement; about 80% of the 989 TFLOP/s datasheet figure); we use 790.
- [assumed] fractions of a peak that a real kernel or collective sustains; each is named where it is used.
- [calib] ``dcp/sim/data/h100-bf16-2026-11-22.json`` (committed with the package;
  a copy of the team's shared record): the project's dual-layer profiler on one H100 80GB HBM3, bf16, eager mode, SDPA, the
  paper's shapes at 8 layers: 32 rows (20 t1d-5b, 12 t2d-1.2b) plus kernel ceilings.
- [fit] five constants (``FITTED_*``) fitted on those 32 rows by ``dcp.sim.calibration.fit`` (``dcp bench
  calibration FILE --fit`` refits them and prints a leave-one-model-out error); everything else is measured,
  counted from the code, or from a datasheet.
"""

from __future__ import annotations

from dcp.planner.analytic import CPU_SMALL, HardwareSpec

GB = 1e9
GIB = 1024**3

BF16_MATMUL_FLOPS_PER_S = 790e12
"""[measured] Sustained dense bf16 matmul of one H100/H200 SXM (788-798 TFLOP/s measured; datasheet 989)."""
FLASH_ATTENTION_EFFICIENCY = 0.45
"""[assumed] FlashAttention-2 forward/backward at head dim 64-128 reaches ~330-400 TFLOP/s on H100-class GPUs
(FlashAttention-3 paper's FA2 baselines), i.e. ~0.45 of the 790 TFLOP/s matmul figure."""
HBM_EFFICIENCY = 0.8
"""[assumed] Fraction of datasheet HBM bandwidth that elementwise kernels sustain."""
NVLINK_BYTES_PER_S = 450 * GB * 0.8
"""[paper][vendor] 900 GB/s NVLink is 450 GB/s per direction per GPU; [assumed] NCCL all-to-all reaches ~80%
of it (bus bandwidth ~360 GB/s)."""
IB_BYTES_PER_S = 400e9 / 8 * 0.8
"""[paper] 8 x 400 Gb/s InfiniBand per node of 8 GPUs = one 400 Gb/s (50 GB/s) NIC per GPU;
[assumed] ~80% sustained by NCCL rings and all-to-alls (40 GB/s per GPU)."""
COLLECTIVE_LATENCY_S = 20e-6
"""[assumed] Start-up cost of one NCCL collective (~10 us inside a node, tens of us across nodes)."""
H100_MATMUL_FLOPS_PER_S = 766.6e12
"""[calib] ceilings.bf16_matmul_8192_tflops: 766.6 TFLOP/s on the calibration H100 (80GB HBM3)."""
SDPA_FLOPS_PER_S_BY_SEQ = ((4096, 240.8e12), (16384, 442.7e12), (32768, 433.4e12))
"""[calib] ceilings.sdpa_causal_48x64_fwd_bwd_tflops: PyTorch SDPA causal attention, 48 heads x 64, forward +
backward, counted as 3.5 x the causal forward FLOPs; interpolated in log2(seq), clamped outside 4k-32k.
[assumed] The H200 (same GH100 compute) reaches the same."""
ATTENTION_BACKWARD_FACTOR = 2.5
"""[paper] FlashAttention-2 (Dao, 2023): the backward recomputes QK^T, 2.5 x the forward's FLOPs; the same
3.5 x convention as the measured SDPA figures."""
CONTEXT_ATTENTION_EFFICIENCY = 0.71
"""[calib] ``dcp bench gpu --only cp`` on one H200 (docs/benchmarks.md, GPU): each context rank's lower-right
causal SDPA calls (32 query / 8 K/V heads of 128, one document a row, 32k-128k tokens, c = 4 and 8) ran at
0.69-0.74 of the rate the SDPA_FLOPS_PER_S_BY_SEQ ceilings give one call; the mean. Fitted on those three
points, so within them by construction (3.2 % under to 4.4 % over)."""
HEAD_EXTRA_BYTES_PER_LOGIT = 30.0
"""[counted] dcp/models/t1d.py head_loss: bf16 logits cast to fp32 (read 2, write 4), log_softmax (read 4,
write 4), its backward (write 4, read 4 + 4, write 4), the cast back (read 4, write 2): 38 bytes per logit
per token, 30 beyond the 4 d = 8 the analytic model always counts."""
FITTED_KERNEL_OVERHEAD_S = 13.3e-6
"""[fit] Exposed host time per kernel launch in eager mode (24 per layer forward, 48 backward, 16 outside):
~1 ms per layer forward + backward, the 'per-layer overhead' that dominates micro-batches below 8k tokens."""
FITTED_LINEAR_EFFICIENCY = 0.88
"""[fit] Fraction of the 766.6 TFLOP/s GEMM ceiling the layer GEMMs (and the LM head) reach at the
profiled shapes (the elementwise count ELEMENTWISE_H/F is a round count; this fraction absorbs its error)."""
FITTED_BACKWARD_FACTOR = 2.35
"""[fit] Backward / forward time of a layer's linear and elementwise work (2 by FLOPs; the elementwise
backward of norms, RoPE and SwiGLU costs more)."""
FITTED_MICRO_BATCH_OVERHEAD_S = 2.1e-3
"""[fit] Fixed host time per micro-batch outside the layers (input preparation, masks, RoPE tables,
embedding, head, loss and their backward in eager mode); t2d-1.2b's whole T_C at 4k tokens is ~2.5 ms."""
FITTED_CONST_H_TENSORS = 26.7
"""[fit] h-wide bf16 tensors read or written per token outside the layers (t2d-1.2b: fp32 sinusoidal
positions, patch embedding, final norm, fp32 MSE loss and their backward)."""
KERNEL_OVERHEAD_S = FITTED_KERNEL_OVERHEAD_S
"""Exposed launch cost per kernel ([fit]; before calibration an assumed 2 us)."""
MEM_LIMIT_BYTES = 80 * GIB
"""[paper] Memory used per GPU is limited to 80 GB (H200 has 141 GB; H100 has 80 GB). We use 80 GiB, the
same figure as the planner's default planning.mem_capacity_gib."""

CALIBRATED = dict(
    linear_efficiency=FITTED_LINEAR_EFFICIENCY,
    backward_factor=FITTED_BACKWARD_FACTOR,
    attention_backward_factor=ATTENTION_BACKWARD_FACTOR,
    attention_flops_per_s_by_seq=SDPA_FLOPS_PER_S_BY_SEQ,
    context_attention_efficiency=CONTEXT_ATTENTION_EFFICIENCY,
    head_extra_bytes_per_logit=HEAD_EXTRA_BYTES_PER_LOGIT,
    const_h_tensors=FITTED_CONST_H_TENSORS,
    micro_batch_overhead_s=FITTED_MICRO_BATCH_OVERHEAD_S,
)
"""The calibrated HardwareSpec fields shared by H100 and H200 (same compute die, eager PyTorch)."""

H100 = HardwareSpec(
    name="NVIDIA H100 SXM (analytic)",
    matmul_flops_per_s=H100_MATMUL_FLOPS_PER_S,
    attention_efficiency=FLASH_ATTENTION_EFFICIENCY,
    mem_bandwidth_bytes_per_s=3.35e12 * HBM_EFFICIENCY,  # [vendor] HBM3 3.35 TB/s
    intra_node_bw_bytes_per_s=NVLINK_BYTES_PER_S,
    inter_node_bw_bytes_per_s=IB_BYTES_PER_S,
    collective_latency_s=COLLECTIVE_LATENCY_S,
    ranks_per_node=8,  # [paper] 8 GPUs per node
    kernel_overhead_s=KERNEL_OVERHEAD_S,
    mem_capacity_bytes=MEM_LIMIT_BYTES,
    **CALIBRATED,
)
"""One H100 SXM of an 8-GPU node (NVLink inside, one 400 Gb/s IB NIC per GPU across nodes)."""

H200 = HardwareSpec(
    name="NVIDIA H200 SXM (analytic)",
    matmul_flops_per_s=H100_MATMUL_FLOPS_PER_S,  # [assumed] same GH100 compute as the calibrated H100
    attention_efficiency=FLASH_ATTENTION_EFFICIENCY,
    mem_bandwidth_bytes_per_s=4.8e12 * HBM_EFFICIENCY,  # [vendor] HBM3e 4.8 TB/s
    intra_node_bw_bytes_per_s=NVLINK_BYTES_PER_S,
    inter_node_bw_bytes_per_s=IB_BYTES_PER_S,
    collective_latency_s=COLLECTIVE_LATENCY_S,
    ranks_per_node=8,
    kernel_overhead_s=KERNEL_OVERHEAD_S,
    mem_capacity_bytes=MEM_LIMIT_BYTES,  # [paper] limited to 80 GB of its 141 GB
    **CALIBRATED,  # [assumed] the H100's calibration: same compute die, eager PyTorch; HBM bandwidth its own
)
"""One H200 SXM, memory limited to 80 GB as in the paper's testbed."""

HARDWARE = {"h100": H100, "h200": H200, "cpu": CPU_SMALL}
"""Names accepted by ``dcp simulate --hardware`` (cpu: the planner's 2-core CPU model, for measured CPU tables)."""

T1D_SEQ_GROUP_EDGES = tuple(2**k for k in range(10, 20))
"""Transformer-1D seq_groups: 1k, 2k, ..., 512k tokens (the length range of the paper's Figure 10)."""

T2D_SEQ_GROUP_EDGES = (4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 786432)
"""Transformer-2D seq_groups up to 786k tokens, covering 720p x 204 frames (734,400 tokens)."""
