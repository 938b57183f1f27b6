"""dcp.profiler.clock: region timing, the pipelined clock against a simulated GPU stream."""

from __future__ import annotations

import pytest
import torch

from dcp.config import ProfilingConfig
from dcp.profiler.clock import FIRST_LEAD_S, HOLD_FACTOR, HOLD_MARGIN_S, RegionClock, resolve_clock


class SimStream:
    """One in-order GPU stream fed by a host: a kernel launched at host time h starts at max(h, when the
    stream is free) and runs its GPU duration; launching costs the host its own time; an event completes
    when the work before it does; sync makes the host wait for the stream."""

    def __init__(self) -> None:
        self.host = 0.0
        self.free_at = 0.0
        self.holds: list[float] = []
        self.syncs = 0

    def now(self) -> float:
        return self.host

    def launch(self, gpu_s: float, host_s: float) -> None:
        self.host += host_s
        self.free_at = max(self.free_at, self.host) + gpu_s

    # DeviceQueue
    def sync(self) -> None:
        self.host = max(self.host, self.free_at)

    def hold(self, seconds: float) -> None:
        self.holds.append(seconds)
        self.launch(seconds, 5e-6)

    def mark(self) -> float:
        self.free_at = max(self.free_at, self.host)
        return self.free_at

    def elapsed_s(self, start: float, end: float) -> float:
        return end - start

    def run_counting_syncs(self, fn):
        self.syncs = 0
        return fn(), self.syncs

    def block(self) -> None:
        """What ``.item()`` does inside a region: the host waits for the stream."""
        self.syncs += 1
        self.sync()


# A layer that opens with small host-bound kernels (norms, RoPE: 30 us to launch, 5 us to run), then large
# GPU-bound ones (matmuls): 0.8 ms of host time for ~10 ms of GPU time.
LAYER = [(5e-6, 30e-6)] * 20 + [(2e-3, 40e-6)] * 5


def run_layer(sim: SimStream, kernels=LAYER) -> None:
    for gpu_s, host_s in kernels:
        sim.launch(gpu_s, host_s)


def chain_time(kernels, n: int) -> float:
    """n regions back to back with no sync between them: how a whole model runs them."""
    sim = SimStream()
    for _ in range(n):
        run_layer(sim, kernels)
    sim.sync()
    return sim.host


def region_times(name: str, kernels, reps: int = 3) -> list[float]:
    sim = SimStream()
    clock = RegionClock(name, "cpu", queue=sim, now=sim.now)
    return [clock.time(lambda: run_layer(sim, kernels), "layer")[0] for _ in range(reps)]


def test_pipelined_region_times_predict_a_chain_of_regions_where_synced_wall_time_over_predicts():
    n = 8
    chain = chain_time(LAYER, n)
    pipelined = region_times("pipelined", LAYER)[-1]
    wall = region_times("wall", LAYER)[-1]
    assert abs(n * pipelined - chain) / chain < 0.01
    # each synced region pays the host-bound start-up that the chain overlaps with the previous layer
    assert (n * wall - chain) / chain > 0.04


def test_a_host_bound_region_costs_its_host_time():
    kernels = [(5e-6, 30e-6)] * 50
    n = 8
    chain = chain_time(kernels, n)
    t = region_times("pipelined", kernels)[-1]
    assert t == pytest.approx(50 * 30e-6)
    assert abs(n * t - chain) / chain < 0.01


def test_the_gpu_is_held_longer_than_the_last_host_enqueue_time_and_the_group_agrees_on_it():
    sim = SimStream()
    agreed: list[list[float]] = []

    def agree(values: list[float]) -> list[float]:  # a slower peer: its host needed 3 ms
        agreed.append(values)
        return [max(values[0], 3e-3)]

    clock = RegionClock("pipelined", "cpu", queue=sim, now=sim.now, agree=agree)
    clock.time(lambda: run_layer(sim), "layer")
    clock.time(lambda: run_layer(sim), "layer")
    clock.time(lambda: None, "other")
    host = sum(h for _, h in LAYER)
    assert agreed[0] == [pytest.approx(host)]
    assert sim.holds == pytest.approx([FIRST_LEAD_S * HOLD_FACTOR + HOLD_MARGIN_S,
                                       3e-3 * HOLD_FACTOR + HOLD_MARGIN_S,
                                       FIRST_LEAD_S * HOLD_FACTOR + HOLD_MARGIN_S])
    assert clock.last_host_s == 0 and clock.last_device_s == 0


def test_a_hold_shorter_than_the_host_still_never_under_reports():
    # the first region has no lead yet (20 ms assumed) and its host needs 60 ms: the GPU waits for the host
    kernels = [(1e-3, 2e-3)] * 30
    sim = SimStream()
    clock = RegionClock("pipelined", "cpu", queue=sim, now=sim.now)
    first, _ = clock.time(lambda: run_layer(sim, kernels), "layer")
    second, _ = clock.time(lambda: run_layer(sim, kernels), "layer")
    assert first >= 30 * 2e-3 - 1e-12 and second == pytest.approx(30 * 2e-3)


def test_a_region_that_syncs_inside_costs_its_gpu_time_and_does_not_grow_the_hold():
    # half a layer, a host read of a GPU value, the other half: a whole model drains its queue there too
    def synced_layer(sim):
        run_layer(sim, LAYER[:22])
        sim.block()
        run_layer(sim, LAYER[22:])

    n = 4
    chain = SimStream()
    for _ in range(n):
        synced_layer(chain)
    chain.sync()
    sim = SimStream()
    clock = RegionClock("pipelined", "cpu", queue=sim, now=sim.now)
    times = [clock.time(lambda: synced_layer(sim), "layer")[0] for _ in range(3)]
    assert clock.synced_regions == 3
    assert sim.holds == pytest.approx([FIRST_LEAD_S * HOLD_FACTOR + HOLD_MARGIN_S] * 3)
    # the host's time would have counted the 31 ms hold; the GPU's time is the region's cost in the chain
    assert abs(n * times[-1] - chain.host) / chain.host < 0.02


def test_barrier_runs_before_every_region():
    calls = []
    clock = RegionClock("wall", "cpu", barrier=lambda: calls.append("barrier"))
    t, out = clock.time(lambda: calls.append("work") or 7)
    assert out == 7 and t >= 0 and calls == ["barrier", "work"]


def test_resolve_clock():
    assert resolve_clock("auto", "cpu") == "wall"
    assert resolve_clock("auto", torch.device("cuda", 0)) == "pipelined"
    assert resolve_clock("cpu", "cpu") == "cpu"
    assert resolve_clock("pipelined", "cuda") == "pipelined"
    with pytest.raises(ValueError, match=r"profiling.clock \('pipelined'\) needs a CUDA device.*clock = \"auto\""):
        resolve_clock("pipelined", "cpu")
    with pytest.raises(ValueError, match=r"profiling.clock \('tsc'\) is not one of"):
        resolve_clock("tsc", "cpu")


def test_profiling_clock_defaults_to_auto_and_a_cpu_table_keeps_the_wall_key():
    from dcp.config import DCPConfig
    from dcp.models import build_model
    from dcp.profiler.dual_layer import cache_key_for

    assert ProfilingConfig().clock == "auto"
    key = cache_key_for(build_model("t1d-tiny"), DCPConfig(), 1)
    assert key.clock == "wall"  # resolved: tables cached before 'auto' existed still match on CPU


def test_measuring_with_the_pipelined_clock_off_cuda_is_one_clear_error():
    from dcp.models import build_model
    from dcp.profiler.adapters import get_adapter
    from dcp.profiler.measure import MeasureSettings, measure_candidate
    from dcp.runtime.context import SPContext

    adapter = get_adapter(build_model("t1d-tiny"))
    with pytest.raises(ValueError, match=r"'pipelined'\) needs a CUDA device"):
        measure_candidate(adapter, SPContext.single(), 1, 16, MeasureSettings(clock="pipelined"))
