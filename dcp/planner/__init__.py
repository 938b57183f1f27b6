"""The DCP planner: pure Python + numpy (no torch). Profile table in, StepPlans out.

- ``cost``: the paper's time/memory model of one micro-batch (Eq. 4-6).
- ``analytic``: profile tables from FLOP/byte counts of a HardwareSpec.
- ``intra``: per seq_group settings (b, p, r): DCP-intra (Algorithm 1) and DCP-inter.
- ``assemble``: an epoch's sample stream -> StepPlans; ``baselines``: bucket and packed parallel.
"""

from dcp.planner.analytic import CPU_SMALL, HardwareSpec, analytic_table, analytic_table_for
from dcp.planner.assemble import EpochPlanner, lookahead_samples, plan_epoch
from dcp.planner.cost import micro_batch_mem_bytes, micro_batch_time_s, min_recompute_layers
from dcp.planner.intra import Setting, best_settings, settings_by_sp
from dcp.planner.plan import GroupPlan, MicroBatch, StepPlan
from dcp.planner.stream import PlanningError
from dcp.planner.table import ProfileRow, ProfileTable, TableError, TableMeta

__all__ = [
    "CPU_SMALL",
    "EpochPlanner",
    "GroupPlan",
    "HardwareSpec",
    "MicroBatch",
    "PlanningError",
    "ProfileRow",
    "ProfileTable",
    "Setting",
    "StepPlan",
    "TableError",
    "TableMeta",
    "analytic_table",
    "analytic_table_for",
    "best_settings",
    "lookahead_samples",
    "micro_batch_mem_bytes",
    "micro_batch_time_s",
    "min_recompute_layers",
    "plan_epoch",
    "settings_by_sp",
]
