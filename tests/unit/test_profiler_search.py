"""Candidate search: which (b, p) get profiled, and when growing b stops."""

from __future__ import annotations

import pytest

from dcp.planner.table import ProfileRow
from dcp.profiler.search import (
    BatchSearch,
    SearchError,
    assign_round_robin,
    pending_groups,
    sp_sizes_to_try,
)

MIB = 2**20


def row(b: int, *, t: float, m_act: float = 1 * MIB, m_const: float = 10 * MIB, feasible: bool = True,
        group: int = 0, p: int = 1) -> ProfileRow:
    """A row whose full-recompute time is 4 * (2 t_f + t_b) + T_C = t * b and memory scales with b."""
    return ProfileRow(seq_group=group, seq_len=100, micro_batch_size=b, sp_size=p, t_f_s=t * b / 12,
                      t_b_s=t * b / 12, m_act_bytes=m_act * b, m_inp_bytes=0.25 * MIB * b, t_const_s=0.0,
                      m_const_bytes=m_const, num_layers=4, feasible=feasible)


def run(search: BatchSearch, make) -> list[int]:
    tried = []
    while (b := search.next_b()) is not None:
        tried.append(b)
        search.record(make(b))
    return tried


def test_sp_sizes_filtered_by_heads_world_and_adapter():
    assert sp_sizes_to_try([1, 2, 3, 4, 8], num_heads=8, world_size=4) == [1, 2, 4]
    assert sp_sizes_to_try([1, 2, 4], num_heads=8, world_size=4, max_sp_size=1) == [1]
    # past the heads: multiples of the K/V heads, for a model that states them (a context axis)
    assert sp_sizes_to_try([1, 2, 4, 6, 8, 16], num_heads=4, world_size=16, num_kv_heads=2) == [1, 2, 4, 6, 8, 16]
    assert sp_sizes_to_try([1, 2, 4, 8], num_heads=4, world_size=16) == [1, 2, 4]
    assert sp_sizes_to_try([1, 2, 4, 8], num_heads=4, world_size=4, num_kv_heads=4) == [1, 2, 4]
    with pytest.raises(SearchError, match="include 1 in planning.sp_sizes"):
        sp_sizes_to_try([3], num_heads=8, world_size=4)


def test_grows_b_until_max_when_time_per_token_improves():
    s = BatchSearch(max_micro_batch_size=8, capacity_bytes=1e12, state_bytes=10 * MIB)
    assert run(s, lambda b: row(b, t=1.0 / (1 + b))) == [1, 2, 4, 8]  # time per token keeps falling
    assert s.reason == "max-b" and s.fits_at_b1


def test_stops_when_time_per_token_stops_improving():
    s = BatchSearch(max_micro_batch_size=8, capacity_bytes=1e12, state_bytes=10 * MIB)
    assert run(s, lambda b: row(b, t=1.0)) == [1, 2]
    assert s.reason == "no-gain"


def test_stops_at_the_capacity_and_skips_predicted_misfits():
    # memory at r = L: 4 * 0.25 MiB * b + 10 MiB -> b=1: 11, b=2: 12, b=4: 14 MiB
    s = BatchSearch(max_micro_batch_size=8, capacity_bytes=12.5 * MIB, state_bytes=10 * MIB)
    assert run(s, lambda b: row(b, t=1.0 / (1 + b))) == [1, 2]  # b=4 predicted at 14 MiB: never run
    assert s.reason == "predicted"
    s = BatchSearch(max_micro_batch_size=8, capacity_bytes=10.5 * MIB, state_bytes=10 * MIB)
    assert run(s, lambda b: row(b, t=1.0)) == [1]
    assert s.reason == "capacity" and not s.fits_at_b1


def test_infeasible_row_stops_the_search():
    s = BatchSearch(max_micro_batch_size=8, capacity_bytes=1e12, state_bytes=0)
    assert run(s, lambda b: row(b, t=1.0 / (1 + b), feasible=b < 2)) == [1, 2]
    assert s.reason == "infeasible"


def test_pending_groups_grow_p_only_where_b1_did_not_fit():
    rows = [row(1, t=1.0, group=0), row(1, t=1.0, group=1, feasible=False)]
    assert pending_groups(3, rows, 2, 1e12, grow_only=True) == [1, 2]
    assert pending_groups(3, rows, 2, 1e12, grow_only=False) == [0, 1, 2]


def test_round_robin_spreads_long_groups_first():
    assert assign_round_robin([0, 1, 2, 3, 4], 2) == [[0, 2, 4], [1, 3]]
    assert assign_round_robin([0, 1], 3) == [[1], [0], []]
