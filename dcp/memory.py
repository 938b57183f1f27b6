"""The one memory model of an engine's state: bytes per rank of parameters, gradients and optimizer state.

The config check (``ModelShapeConfig.constant_mem_bytes``), the analytic profile rows' M_C
(``dcp.planner.analytic``) and the simulator's derived rows (``dcp.sim.derive``) all count it here, so they
cannot disagree about which engine shards what.
"""

from __future__ import annotations

from dcp.validate import fail

ENGINE_NAMES = ("ddp", "deepspeed", "fsdp2")
"""runtime.engine values (dcp.runtime.engines builds them)."""


def state_bytes(num_params: int, param_bytes: int, optimizer_bytes_per_param: int, engine: str,
                dp_size: int | None) -> int:
    """Per-rank state of ``engine`` over ``dp_size`` data-parallel ranks (None: as many as wanted, the floor any
    world size reaches).

    - ddp: parameters, gradients and optimizer state replicated on every rank.
    - deepspeed (ZeRO-1): the optimizer state / dp.
    - fsdp2: the parameter shards and the optimizer state / dp, plus the full parameters gathered for the step
      and its gradients accumulated unsharded until the step's single reduce-scatter. Ranks run unequal
      micro-batch counts, so both stay full during the step (dcp.runtime.fsdp); only one micro-batch per step
      would let them be freed per layer.
    """
    n, pb = num_params, param_bytes
    if engine == "ddp":
        return n * (2 * pb + optimizer_bytes_per_param)
    if engine not in ENGINE_NAMES:
        fail("runtime.engine", engine, f"is not one of {list(ENGINE_NAMES)}", "pick one of those")
    sharded = n * optimizer_bytes_per_param + (n * pb if engine == "fsdp2" else 0)
    return 2 * n * pb + (0 if dp_size is None else sharded // max(1, dp_size))


LOSS_CHUNK_TOKENS = 1024
"""Token rows per piece of the reference models' chunked cross-entropy (dcp.models.loss): the head holds the
logits (and their gradient) of this many tokens at once, not of the whole micro-batch."""
