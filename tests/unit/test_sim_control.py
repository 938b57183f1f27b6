"""The simulator charges the runtime's control plane: measured host time per step and the census's
collectives priced on the simulated fabric (dcp.sim.control)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dcp.config import RuntimeConfig
from dcp.planner.analytic import CPU_SMALL
from dcp.sim import control
from dcp.sim.cluster import simulate
from dcp.sim.control import ControlCollective, collective_time_s, control_plane_s, host_s, logged_fraction
from dcp.sim.hardware import H200
from dcp.sim.scenario import paper_config, paper_table, scenario


def test_ring_and_tree_prices():
    row = control.CENSUS[0]
    assert (row.kind, row.nbytes, row.when) == ("all_gather", 112, "logged")
    nccl, gloo = control.HOP_LATENCY_S["nccl"], control.HOP_LATENCY_S["gloo"]
    ring = collective_time_s(row, 4096, H200)
    assert ring == pytest.approx(4095 * (nccl + 112 / H200.inter_node_bw_bytes_per_s))
    tcp = collective_time_s(dataclasses.replace(row, transport="gloo"), 4096, H200)
    assert tcp == pytest.approx(4095 * (gloo + 112 / H200.inter_node_bw_bytes_per_s))
    tree = collective_time_s(dataclasses.replace(row, algorithm="tree"), 4096, H200)
    assert tree == pytest.approx(24 * nccl + 112 * 4096 / H200.inter_node_bw_bytes_per_s)
    assert tree < ring / 10  # a ring's hops grow with W, a tree's with log W
    assert collective_time_s(row, 1, H200) == 0.0
    # inside one node the intra-node bandwidth applies
    assert collective_time_s(row, 8, H200) == pytest.approx(7 * (nccl + 112 / H200.intra_node_bw_bytes_per_s))


def test_host_time_interpolates_the_measured_points():
    (w0, un0, lg0), *_, (w1, un1, lg1) = control.HOST_MS_BY_WORLD
    assert host_s(w0, False) == pytest.approx(un0 / 1e3) and host_s(w1, True) == pytest.approx(lg1 / 1e3)
    assert host_s(8, False) == host_s(w0, False) and host_s(10**6, True) == host_s(w1, True)  # clamped
    points = control.HOST_MS_BY_WORLD
    for (wa, ua, _), (wb, ub, _) in zip(points, points[1:], strict=False):  # between two measured W: between their values
        w = int((wa * wb) ** 0.5)
        assert min(ua, ub) / 1e3 <= host_s(w, False) <= max(ua, ub) / 1e3
        assert host_s(w, False) == pytest.approx((ua + ub) / 2e3, rel=1e-3)  # the geometric middle: half way in log2 W


def test_logged_fraction_and_cadence():
    assert logged_fraction(1) == 1.0 and logged_fraction(10) == 0.1
    assert logged_fraction(4, 6) == pytest.approx(1 / 4 + 1 / 6 - 1 / 12)  # steps 12, 24, ... counted once
    every = control_plane_s(4096, H200, log_every=1)
    sparse = control_plane_s(4096, H200, log_every=100)
    ring = collective_time_s(control.CENSUS[0], 4096, H200)
    assert every - sparse == pytest.approx(0.99 * (ring + host_s(4096, True) - host_s(4096, False)))
    with pytest.raises(ValueError, match=r"log_every \(0\) must be >= 1"):
        logged_fraction(0)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("kind", "scatter", r"ControlCollective.kind \('scatter'\)"),
    ("when", "epoch", r"ControlCollective.when \('epoch'\)"),
    ("algorithm", "star", r"ControlCollective.algorithm \('star'\)"),
    ("transport", "mpi", r"ControlCollective.transport \('mpi'\)"),
])
def test_control_collective_refuses_bad_fields(field, value, match):
    kw = dict(kind="all_gather", nbytes=8, when="logged", algorithm="ring", transport="nccl")
    kw[field] = value
    with pytest.raises(ValueError, match=match):
        ControlCollective(**kw)


def test_simulate_charges_the_control_plane_on_gpus_only():
    sc = scenario("t1d-5b", "h200")
    lengths = [4096] * 64 + [65536] * 8
    table = paper_table(sc, 16)
    cfg = paper_config(sc, "dcp-intra")
    charged, steps = simulate(lengths, table, cfg, 16, hardware=sc.hardware, return_steps=True)
    free = simulate(lengths, table, cfg, 16, hardware=sc.hardware, control_plane=False)
    per_step = control_plane_s(16, sc.hardware, log_every=cfg.runtime.log_every)
    assert all(s.control_time_s == pytest.approx(per_step) for s in steps)
    assert charged.total_time_s - free.total_time_s == pytest.approx(per_step * charged.num_steps)
    assert charged.control_plane_share == pytest.approx(charged.control_time_s / charged.total_time_s)
    assert free.control_plane_share == 0.0
    # the CPU model's measured step overhead already holds the runtime's host time: nothing added
    cpu = dataclasses.replace(CPU_SMALL, mem_capacity_bytes=sc.hardware.mem_capacity_bytes)
    assert simulate(lengths, table, cfg, 16, hardware=cpu).control_time_s == 0.0
    # logging less often charges less
    rare = cfg.replace(runtime=RuntimeConfig(log_every=50))
    assert simulate(lengths, table, rare, 16, hardware=sc.hardware).control_time_s < charged.control_time_s


def test_simulate_json_reports_control_plane_share(capsys):
    from dcp.cli import main

    assert main(["simulate", "--dataset", "t1d-balanced", "--num-samples", "300", "--gpus", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < out["control_plane_share"] < 1 and math.isfinite(out["control_plane_share"])
