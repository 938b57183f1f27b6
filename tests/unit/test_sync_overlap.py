"""The simulator's every-group rule for the ddp all-reduce left after the compute phase (exposed_sync_groups_s)."""

from __future__ import annotations

import numpy as np
import pytest

from dcp.sim.cluster import DDP_BUCKET_BYTES, exposed_sync_groups_s, exposed_sync_s

GRAD_BYTES = 10 * DDP_BUCKET_BYTES  # 10 buckets


def rule(ends, bw, sync_s, buckets):
    return exposed_sync_groups_s(sync_s, ends, bw, buckets * DDP_BUCKET_BYTES)


def test_one_group_is_the_slowest_group_rule():
    # a 1 s last backward hides a 0.5 s sync of 10 buckets but its last bucket (0.05 s), as the simulator says
    got = rule(np.array([10.0]), np.array([1.0]), 0.5, 10)
    assert got == pytest.approx(0.05)
    assert got == pytest.approx(exposed_sync_s(0.5, 1.0, GRAD_BYTES))
    # a 0.2 s last backward: the simulator leaves the 0.3 s after it; here its first bucket waits 0.02 s more
    assert rule(np.array([10.0]), np.array([0.2]), 0.5, 10) == pytest.approx(0.32)
    assert exposed_sync_s(0.5, 0.2, GRAD_BYTES) == pytest.approx(0.3)


def test_every_group_counts():
    # the slowest group ends at 10 s after a 2 s backward (the simulator: only the last bucket left); a group
    # ending at 9.9 s after a 0.2 s backward starts its first bucket at 9.72 s: the sync ends at 10.22 s
    ends, bw = np.array([10.0, 9.9]), np.array([2.0, 0.2])
    assert rule(ends, bw, 0.5, 10) == pytest.approx(0.22)
    assert exposed_sync_s(0.5, 2.0, GRAD_BYTES) == pytest.approx(0.05)

