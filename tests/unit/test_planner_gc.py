"""Planning on the plan-ahead thread leaves the process's garbage collector alone.

The planner once paused the cyclic collector (gc.disable) around every step. On the plan-ahead thread that
switched it off for the whole process, training thread included, while a step was planned.
"""

from __future__ import annotations

import gc
import threading

import pytest

from dcp.planner import EpochPlanner, plan_epoch
from dcp.planner.ahead import PlanAhead
from tests.unit.test_planner_assemble import lengths_for, make


@pytest.mark.parametrize("world", [8, 512])  # the best fit and the numpy packer
@pytest.mark.parametrize("method", ["dcp-intra", "bucket"])
def test_planning_on_a_thread_never_switches_the_collector_off(world, method, monkeypatch):
    assert gc.isenabled()
    switched: list[str] = []
    real_disable = gc.disable

    def refuse() -> None:
        switched.append(threading.current_thread().name)
        raise AssertionError("the planner called gc.disable()")

    monkeypatch.setattr(gc, "disable", refuse)
    seen_in_planner: list[tuple[bool, bool]] = []
    """(collector on, on the main thread) at the start and end of every DCP step"""
    from dcp.planner import assemble

    real_step = assemble.plan_step

    def watched(*args, **kwargs):
        on_main = threading.current_thread() is threading.main_thread()
        seen_in_planner.append((gc.isenabled(), on_main))
        plan = real_step(*args, **kwargs)
        seen_in_planner.append((gc.isenabled(), on_main))
        return plan

    monkeypatch.setattr(assemble, "plan_step", watched)
    cfg, table = make(world, method=method)
    lengths = lengths_for(40 * world, seed=1)
    want = [p.digest() for p in plan_epoch(lengths, table, cfg, world)]
    seen_in_main: list[bool] = []
    with PlanAhead(EpochPlanner(lengths, table, cfg, world), depth=2) as ahead:
        got = []
        while True:
            seen_in_main.append(gc.isenabled())  # while the planning thread works on the next steps
            try:
                got.append(next(ahead).digest())
            except StopIteration:
                break
        while ahead.alive:
            seen_in_main.append(gc.isenabled())
    monkeypatch.setattr(gc, "disable", real_disable)
    assert got == want and len(got) >= 2
    assert not switched, f"gc.disable() called on {switched}"
    assert all(seen_in_main) and all(on for on, _ in seen_in_planner)
    if method.startswith("dcp"):  # checked inside the planning thread at every step
        assert sum(not main for _, main in seen_in_planner) == 2 * len(got)
    assert gc.isenabled()
