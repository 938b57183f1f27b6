"""The one memory model of an engine's state: bytes per rank of parameters, gradients and optimizer state.

The config check (``ModelShapeConfig.constant_mem_bytes``), the analytic profile rows' M_C
(``dcp.planner.analytic``) and the simulator's derived rows (``dcp.sim.derive``) all count it here, so they
cannot disagree about which engine shards what.
"""

from __future__ import annotations

from typing import Any

from dcp.validate import fail

ENGINE_NAMES = ("ddp", "deepspeed", "fsdp2", "fsdp2-zero3")
"""runtime.engine values (dcp.runtime.engines builds them)."""


def state_bytes(num_params: int, param_bytes: int, optimizer_bytes_per_param: int, engine: str,
                dp_size: int | None, gathered_params: int = 0, staged_params: int = 0,
                compute_bytes: int | None = None) -> int:
    """Per-rank state of ``engine`` over ``dp_size`` data-parallel ranks (None: as many as wanted, the floor any
    world size reaches).

    - ddp: parameters, gradients and optimizer state replicated on every rank (each bucket's flat all-reduce
      buffer takes over its gradients, ``dcp.distributed.comm.all_reduce_grads_flat``: held once).
    - deepspeed (ZeRO-1): the optimizer state / dp.
    - fsdp2: the parameter shards and the optimizer state / dp, plus the full parameters gathered for the step
      (in the compute precision, ``compute_bytes``: bf16 under its MixedPrecisionPolicy; None: ``param_bytes``)
      and its gradients accumulated unsharded, in ``param_bytes`` (FSDP2 accumulates unsynced gradients in its
      fp32 reduce dtype), until the step's single reduce-scatter. Ranks run unequal
      micro-batch counts, so both stay full during the step (dcp.runtime.fsdp); only one micro-batch per step
      would let them be freed per layer. The reduce-scatters under the last backward stage a unit's gradients
      in a flat fp32 input besides them (``REDUCE_BYTES``): ``staged_params``, the largest unit (measured:
      ``scripts/state_memory.py``).
    - fsdp2-zero3: parameters, gradients and optimizer state / dp, plus ``gathered_params`` held unsharded at
      the peak (the units gathered at once: the root's embedding and head, the layer computing and the one
      prefetched) with their gradients before each backward's reduce-scatter.
    """
    n, pb = num_params, param_bytes
    if engine == "fsdp2-zero3":
        return 2 * gathered_params * pb + (0 if dp_size is None else n * (2 * pb + optimizer_bytes_per_param)
                                           // max(1, dp_size))
    if engine == "ddp":
        return n * (2 * pb + optimizer_bytes_per_param)
    if engine not in ENGINE_NAMES:
        fail("runtime.engine", engine, f"is not one of {list(ENGINE_NAMES)}", "pick one of those")
    sharded = n * optimizer_bytes_per_param + (n * pb if engine == "fsdp2" else 0)
    staged = staged_params * REDUCE_BYTES if engine == "fsdp2" else 0
    gathered = pb if engine != "fsdp2" or compute_bytes is None else min(pb, compute_bytes)
    return n * (gathered + pb) + staged + (0 if dp_size is None else sharded // max(1, dp_size))


REDUCE_BYTES = 4
"""Bytes per parameter of fsdp2's reduce-scatter input: gradients are reduced in fp32 also under bf16
(``dcp.runtime.fsdp``'s mixed-precision policy)."""


def staging_bytes(shape: Any, engine: str) -> int:
    """The transient part of ``shape_state_bytes``: fsdp2's reduce-scatter input of its largest unit (0 for the
    other engines). A measured state (the profiler's, of the whole model) never holds it."""
    if engine != "fsdp2":
        return 0
    root = 2 * shape.vocab_size * shape.hidden_size
    return max(root, (shape.num_params - root) // max(1, shape.num_layers)) * REDUCE_BYTES


def weight_copy_bytes(shape: Any) -> int:
    """Bytes of one layer's bf16 weight copies that autocast saves for backward (2 per matmul parameter: q and o,
    k and v at the K/V heads' width, per attention, and the gated MLP). A profiled m_act under autocast holds
    them; fsdp2 engines compute on their gathered bf16 parameters (counted in their state) and make none."""
    h = shape.hidden_size
    kv_width = h // shape.num_heads * shape.kv_heads
    return 2 * (shape.attentions_per_layer * 2 * h * (h + kv_width) + 3 * h * shape.ffn_size)


def shape_state_bytes(shape: Any, engine: str, dp_size: int | None, compute_bytes: int | None = None) -> int:
    """``state_bytes`` of a ``ModelShapeConfig``; fsdp2-zero3's gathered units are its root (embedding and head:
    fully_shard keeps the root gathered over a micro-batch) and two layers (the one computing, the prefetched);
    fsdp2's staged unit is the larger of the root and a layer. ``compute_bytes``: the compute precision's bytes
    (2 under bf16), where fsdp2 holds its gathered parameters; None counts them at ``param_bytes``."""
    n, layers, root = shape.num_params, shape.num_layers, 2 * shape.vocab_size * shape.hidden_size
    layer = (n - root) // max(1, layers)
    return state_bytes(n, shape.param_bytes, shape.optimizer_bytes_per_param, engine, dp_size,
                       gathered_params=root + min(2, layers) * layer, staged_params=max(root, layer),
                       compute_bytes=compute_bytes)


def gather_rounds(engine: str, ga_slots: int) -> int:
    """Rounds of parameter-sized collectives per step on each rank (an all-gather or a reduce-scatter of every
    parameter; a ring round moves (W-1)/W of the parameter bytes in and out of each rank): ddp and deepspeed
    (ZeRO-1) 1 (the all-reduce counts as the reduce-scatter and all-gather it is made of: 2); fsdp2 2 (one
    all-gather, one reduce-scatter); fsdp2-zero3 3 per micro-batch slot, ``ga_slots`` being the step's largest
    ga_steps (an all-gather in forward, one in backward, a reduce-scatter)."""
    if engine not in ENGINE_NAMES:
        fail("runtime.engine", engine, f"is not one of {list(ENGINE_NAMES)}", "pick one of those")
    if ga_slots < 1:
        fail("ga_slots", ga_slots, "must be >= 1", "pass the step's largest ga_steps")
    return 3 * ga_slots if engine == "fsdp2-zero3" else 2


LOSS_CHUNK_TOKENS = 1024
"""Token rows per piece of the reference models' chunked cross-entropy (dcp.models.loss): the head holds the
logits (and their gradient) of this many tokens at once, not of the whole micro-batch."""
