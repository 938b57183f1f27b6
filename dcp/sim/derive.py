"""Measured compute, modelled network: a single-GPU profile table (p = 1) extended to Ulysses SP sizes p > 1.

A user with one GPU profiles their model there (``dcp profile``, sp_sizes = (1,)) and gets cluster
predictions from it: ``dcp simulate --table FILE`` calls ``derive_sp_table`` when FILE holds only p = 1 rows.
Per (seq_group, b) row measured at p = 1 and each p > 1 (per rank of the SP group):

- the layer's time is split into attention and the rest with the analytic model's share for the same
  shape (``dcp.planner.analytic``, the simulated hardware): attention runs over the whole sequence s with
  heads / p, so its measured part is divided by p; the rest (the linear layers and elementwise work on the
  b s / p local tokens) is divided by p down to the hardware's fixed per-layer launch cost, which stays;
- the layout's communication (Ulysses all-to-alls with K/V unexpanded, 4 per attention forward and 4
  backward, and past the K/V heads the context axis's K/V all-gather) comes from the network model
  (``layout.layout_comm_s``: intra-node bandwidth up to ``ranks_per_node`` ranks, inter-node beyond);
- T_C (embedding, head, loss on the local tokens) is divided by p down to the hardware's fixed
  per-micro-batch cost;
- m_act and m_inp are divided by p (every kept tensor is per local token, the attention's per-head
  statistics too); M_C keeps the measured working set divided by p plus the all-to-all buffers, and the
  model state of the simulated world size (ZeRO-1) instead of the profiled one.

Gradient sync and the optimizer step come from the network model in ``dcp.sim.cluster`` as for any table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dcp.config import ModelShapeConfig
from dcp.planner.analytic import (
    CONST_KERNELS,
    KERNELS_PER_LAYER,
    HardwareSpec,
    analytic_row,
    attention_time_s,
)
from dcp.planner.layout import context_slowdown, layout_comm_s, layout_saved_bytes
from dcp.planner.table import ProfileRow, ProfileTable, TableMeta


class DeriveError(ValueError):
    """The table cannot be extended (rows at p > 1 already, no p = 1 rows, a bad SP size)."""


def is_single_gpu(table: ProfileTable) -> bool:
    """True when every row of ``table`` was measured at p = 1."""
    return bool(table.rows) and all(r.sp_size == 1 for r in table.rows)


def _dtype_bytes(meta: TableMeta) -> int:
    """Bytes per activation element: the compute precision's (bf16 autocast over fp32 parameters moves bf16
    activations), else the parameters' dtype (tables without a recorded precision)."""
    if meta.extra.get("precision") == "bf16":
        return 2
    return {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}.get(meta.dtype, 4)


def derive_row(
    row: ProfileRow,
    p: int,
    *,
    model: ModelShapeConfig,
    attention: str,
    hardware: HardwareSpec,
    dtype_bytes: int,
    world_size: int,
    state_bytes_measured: float,
    frames: int | None = None,
    engine: str = "deepspeed",
) -> ProfileRow:
    """The per-rank row at SP size ``p`` from the p = 1 ``row`` (see the module docstring)."""
    if row.sp_size != 1:
        raise DeriveError(f"row sp_size ({row.sp_size}) is not 1: derive from rows measured on one GPU")
    if p < 1 or (model.num_heads % p and (p < model.num_heads or p % model.kv_heads)):
        raise DeriveError(f"sp_size ({p}) must divide num_heads ({model.num_heads}) or be a multiple of its K/V heads "
                          f"({model.kv_heads}) above it: Ulysses shards heads, context parallelism the sequence")
    shape = dataclasses.replace(model, num_layers=row.num_layers)
    a = 1 if attention == "1d" else 2
    ref = analytic_row(shape, row.seq_group, row.seq_len, row.micro_batch_size, 1, world_size=1, hardware=hardware,
                       dtype_bytes=dtype_bytes, attention=attention, frames=frames)
    n = row.micro_batch_size * row.seq_len / p
    a2a = layout_comm_s(model, row.micro_batch_size, row.seq_len, p, hardware, dtype_bytes=dtype_bytes, attentions=a)
    launch_f = KERNELS_PER_LAYER * hardware.kernel_overhead_s
    launch_b = hardware.backward_factor * launch_f

    slow = context_slowdown(shape, p, hardware, attention)

    def scale(measured: float, model_p1: float, model_att_p1: float, fixed: float) -> float:
        # The model's attention share of this pass at p = 1 splits the measured time; a context axis slows it.
        share = min(1.0, model_att_p1 / model_p1) if model_p1 > 0 else 0.0
        att, rest = measured * share, measured * (1 - share)
        return att * slow / p + max(min(rest, fixed), fixed + (rest - fixed) / p)

    att_f1, att_b1 = attention_time_s(shape, row.seq_len, row.micro_batch_size, 1, hardware, attention=attention,
                                      frames=frames)
    t_f = scale(row.t_f_s, ref.t_f_s, att_f1, launch_f) + a2a
    t_b = scale(row.t_b_s, ref.t_b_s, att_b1, launch_b) + a2a
    fixed_c = CONST_KERNELS * hardware.kernel_overhead_s + hardware.micro_batch_overhead_s
    t_c = max(min(row.t_const_s, fixed_c), fixed_c + (row.t_const_s - fixed_c) / p)
    working = max(0.0, row.m_const_bytes - state_bytes_measured)
    m_const = (shape.constant_mem_bytes(engine, dp_size=world_size, compute_bytes=dtype_bytes) + working / p
               + 2.0 * n * model.hidden_size * dtype_bytes)
    return dataclasses.replace(row, sp_size=p, t_f_s=t_f, t_b_s=t_b, t_const_s=t_c, m_act_bytes=row.m_act_bytes / p + layout_saved_bytes(
                                   model, row.micro_batch_size, row.seq_len, p, dtype_bytes=dtype_bytes),
                               m_inp_bytes=row.m_inp_bytes / p, m_const_bytes=m_const)


def derive_sp_table(
    table: ProfileTable,
    *,
    model: ModelShapeConfig,
    attention: str,
    hardware: HardwareSpec,
    sp_sizes: Sequence[int],
    world_size: int,
    frames_per_group: Sequence[int | None] | None = None,
    engine: str = "deepspeed",
) -> ProfileTable:
    """``table`` (p = 1 rows only) plus derived rows for every p in ``sp_sizes`` with 1 < p <= world_size;
    their state memory is ``engine``'s at ``world_size`` (ModelShapeConfig.constant_mem_bytes).

    Rows whose derived memory exceeds the table's capacity (``extra`` mem_capacity_bytes or
    mem_capacity_gib, else the hardware's) are kept with feasible = False, as an analytic table marks them.
    """
    if not is_single_gpu(table):
        bad = sorted({r.sp_size for r in table.rows})
        raise DeriveError(f"table sp_sizes ({bad}) are not all 1: pass a table profiled on one GPU "
                          "(sp_sizes = [1]) or use it as it is")
    from dcp.planner.cost import micro_batch_mem_bytes

    d = _dtype_bytes(table.meta)
    shape = dataclasses.replace(model, num_layers=table.num_layers)
    state = table.meta.extra.get("state_bytes")
    state_measured = float(state) if isinstance(state, (int, float)) else float(
        shape.constant_mem_bytes("deepspeed", dp_size=max(1, table.meta.world_size)))
    extra = table.meta.extra
    cap = extra.get("mem_capacity_bytes") or (extra["mem_capacity_gib"] * 1024**3 if isinstance(
        extra.get("mem_capacity_gib"), (int, float)) else hardware.mem_capacity_bytes)
    frames = list(frames_per_group) if frames_per_group is not None else [None] * len(table.seq_group_edges)
    rows = list(table.rows)
    for r in table.rows:
        for p in sorted(set(sp_sizes)):
            if p <= 1 or p > world_size:
                continue
            new = derive_row(r, p, model=model, attention=attention, hardware=hardware, dtype_bytes=d,
                             world_size=world_size, state_bytes_measured=state_measured, frames=frames[r.seq_group],
                             engine=engine)
            if not r.feasible or micro_batch_mem_bytes(new, new.num_layers) > cap:
                new = dataclasses.replace(new, feasible=False)
            rows.append(new)
    meta = dataclasses.replace(table.meta, world_size=world_size, source=f"{table.meta.source} p=1 + modelled network",
                               extra={**table.meta.extra, "derived_sp_sizes": sorted(set(sp_sizes)),
                                      "network": hardware.name})
    return ProfileTable(rows, meta)
