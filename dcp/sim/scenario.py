"""Paper scenarios: the DCPConfig and analytic profile table of (model, hardware, GPUs, method).

Tables depend on the world size only through ZeRO-1's optimizer shard in M_C, so callers that sweep methods
build one table per (model, hardware, world size) with ``paper_table`` and reuse it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcp.config import AdvancedConfig, DCPConfig, ModelShapeConfig, PlanningConfig, ProfilingConfig
from dcp.named_models import MODELS, PAPER_MODELS
from dcp.planner.analytic import HardwareSpec, analytic_table, grad_sync_time_s
from dcp.planner.table import ProfileTable
from dcp.sim.hardware import HARDWARE, T1D_SEQ_GROUP_EDGES, T2D_SEQ_GROUP_EDGES

MAX_MICRO_BATCH_SIZE = 256
"""Largest b the analytic table lists; rows stop earlier where b no longer fits 80 GB with full recompute
(b = 128 of 1k-token samples is the largest that fits for t1d-5b), so the baselines get the largest b memory allows."""
BF16_BYTES = 2
"""The paper trains in bf16."""


DCP_METHODS = ("dcp-inter", "dcp-intra")
"""The methods whose planner uses ``advanced.grad_sync_s``."""


class ScenarioError(ValueError):
    """An unknown model/hardware name or a bad scenario argument."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Scenario:
    """What a simulated paper experiment needs besides the lengths."""

    model_name: str
    """t1d-5b or t2d-1.2b."""
    model: ModelShapeConfig
    """The model shape."""
    attention: str
    """'1d' or '2d'."""
    hardware: HardwareSpec
    """Per-GPU speeds and interconnect."""
    seq_group_edges: tuple[int, ...]
    """Upper token bound of every seq_group."""
    sp_sizes: tuple[int, ...]
    """SP sizes the planner may choose."""


def scenario(model_name: str, hardware_name: str) -> Scenario:
    if model_name not in PAPER_MODELS:
        raise ScenarioError(f"model ({model_name!r}) is not one of {sorted(PAPER_MODELS)}: pick one of those")
    if hardware_name not in HARDWARE:
        raise ScenarioError(f"hardware ({hardware_name!r}) is not one of {sorted(HARDWARE)}: pick one of those")
    named = MODELS[model_name]
    model, attention = named.paper_shape, named.attention
    edges = T1D_SEQ_GROUP_EDGES if attention == "1d" else T2D_SEQ_GROUP_EDGES
    return Scenario(model_name=model_name, model=model, attention=attention, hardware=HARDWARE[hardware_name],
                    seq_group_edges=edges, sp_sizes=named.sp_sizes)


def frames_per_group(edges: Sequence[int], shapes: Sequence[tuple[int, int]]) -> list[int | None]:
    """2d: the frame count each seq_group is profiled with.

    Per-token attention cost of a (T frames x S spatial) sample grows with S + T, so each group takes the
    frames of its most expensive shape among ``shapes`` (None, a square split, when no shape falls in it).
    """
    out: list[int | None] = []
    lo = 0
    for e in edges:
        inside = [(f, s) for f, s in set(shapes) if lo < f * s <= e]
        out.append(max(inside, key=lambda fs: (fs[0] + fs[1], fs[0]))[0] if inside else None)
        lo = e
    return out


def video_shapes() -> list[tuple[int, int]]:
    """Every (frames, spatial_tokens) bucket of the paper-scale video grid (datasets/grids.toml [t2d.paper])."""
    from dcp.data_dists import load_grid_scale

    return load_grid_scale("t2d", "paper").buckets()


def paper_table(sc: Scenario, world_size: int, *, shapes: Sequence[tuple[int, int]] | None = None,
                engine: str = "deepspeed", loss_chunk_tokens: int = 0) -> ProfileTable:
    """Analytic bf16 table of the scenario; 2d groups take their frames from ``shapes`` (default: video grid);
    state memory of ``engine`` (the paper ran DeepSpeed ZeRO-1); ``loss_chunk_tokens`` > 0: a chunked loss.

    Its M_C already holds one recomputed layer's working set, as a measured table's does
    (see dcp.planner.analytic), so full recompute leaves room for the layer being recomputed.
    """
    frames = None
    if sc.attention == "2d":
        frames = frames_per_group(sc.seq_group_edges, shapes if shapes is not None else video_shapes())
        frames = [f if f is not None else max(1, round((e / 1000) ** 0.5)) for f, e in zip(frames, sc.seq_group_edges,
                                                                                             strict=True)]
    return analytic_table(sc.model, sc.seq_group_edges, sp_sizes=[p for p in sc.sp_sizes if p <= world_size],
                          max_micro_batch_size=MAX_MICRO_BATCH_SIZE, world_size=world_size, hardware=sc.hardware,
                          dtype_bytes=BF16_BYTES, attention=sc.attention, frames_per_sample=frames,
                          mem_capacity_bytes=sc.hardware.mem_capacity_bytes, engine=engine,
                          loss_chunk_tokens=loss_chunk_tokens)


def told_grad_sync_s(method: str, model: ModelShapeConfig, hardware: HardwareSpec, world_size: int) -> float:
    """``advanced.grad_sync_s`` of a simulated run: the gradient sync the simulator will price on ``world_size``
    GPUs for the DCP methods (dcp.planner.syncend), 0 for the others or without a world size."""
    return grad_sync_time_s(model, hardware, world_size) if world_size > 0 and method in DCP_METHODS else 0.0


def paper_config(sc: Scenario, method: str, *, gmin: int = 1, gmax: int = 4, seed: int = 0,
                 world_size: int = 0) -> DCPConfig:
    """DCPConfig of the scenario: 80 GB per GPU, 8 GPUs per node, the scenario's SP sizes. ``world_size`` > 0:
    the DCP methods are told the gradient sync the simulator prices on that many GPUs (``advanced.grad_sync_s``,
    dcp.planner.syncend), as a real run is told its measured one; 0 leaves it unknown."""
    sync = told_grad_sync_s(method, sc.model, sc.hardware, world_size)
    return DCPConfig(
        model=sc.model,
        profiling=ProfilingConfig(seq_group_edges=sc.seq_group_edges, max_micro_batch_size=MAX_MICRO_BATCH_SIZE),
        planning=PlanningConfig(method=method, mem_capacity_gib=sc.hardware.mem_capacity_bytes / 1024**3,
                                gmin=gmin, gmax=gmax, ranks_per_node=sc.hardware.ranks_per_node,
                                sp_sizes=sc.sp_sizes, seed=seed),
        advanced=AdvancedConfig(grad_sync_s=sync),
    )
