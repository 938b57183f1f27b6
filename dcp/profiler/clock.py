"""How the profiler times one region of work (a layer's forward, its backward, the constant part).

- ``wall``: elapsed host time between two device synchronisations.
- ``cpu``: this process's CPU time (robust on a shared, oversubscribed CPU machine; blind to waits).
- ``pipelined`` (CUDA only): what the region costs inside a whole model. There the host enqueues a layer's
  kernels while the GPU still runs the previous layer's, so neither the host's launch latency nor the gaps
  between small kernels show unless the host is the slower of the two. A region timed between two
  synchronisations starts with an empty GPU queue instead, and each kernel waits for its launch: on one
  H100 host the dual-layer rows timed that way over-predicted whole 8-layer steps by 10-29 % at 4k tokens
  per micro-batch (docs/benchmarks.md); on an H200 host they did not (``auto`` below). Here a sleep kernel first holds the GPU for longer than the host needs
  to enqueue the region, CUDA events around the region then give its GPU time without the launch
  latency, and the host's own enqueue time is taken too. The region costs ``max(host, GPU)``: the rate at
  which a chain of such regions runs, GPU-bound or host-bound.
- ``auto``: ``wall`` (what ``advanced.clock`` defaults to). On an H200 (2026-11-26, Transformer-1D 5B and
  Transformer-2D 1.2B shapes at 8 layers, bf16) the wall clock's rows predicted measured whole-model steps at
  (3072 x 3), 12288 and 49152 tokens within 0.83 % (median of 6), the pipelined clock's under-predicted them
  by 6.8 %: the whole model does not hide as much of a layer's launch latency as ``max(host, GPU)`` assumes
  on that host. ``pipelined`` stays available (docs/profiler.md, *Clocks*).

Inside an SP group every rank holds its GPU for the same, group-agreed time, so no rank's region starts
early and times its wait for a peer in the first all-to-all.

The hold must outlast the host's enqueueing, and the clock checks that it did: if the GPU had already
passed the hold when the host finished (its start event is complete), the host was blocked inside the
region (a ``.item()`` or a mask check of some Hugging Face models, a full launch queue, an allocator
``cudaFree`` near capacity) or was slower than the last time. Its host time then includes waiting for
the hold, so the repetition counts max(host, GPU), an over-estimate, the lead grows at most
MAX_LEAD_GROWTH-fold, and after MAX_UNCOVERED such repetitions the region is timed with the wall clock
(a region that blocks inside cannot be pipelined inside the whole model either).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import torch

from dcp.config import CLOCKS

HOLD_FACTOR = 1.5
"""The GPU is held for this many times the region's last host enqueue time (plus HOLD_MARGIN_S)."""
HOLD_MARGIN_S = 0.001
FIRST_LEAD_S = 0.02
"""Host enqueue time assumed for a region never timed before (a warm-up repetition usually comes first)."""
MAX_LEAD_GROWTH = 2.0
"""After a repetition the hold did not cover, the next lead is at most this many times the last one."""
MAX_UNCOVERED = 2
"""Repetitions of a region the hold may fail to cover before the region is timed with the wall clock."""
SLEEP_RATES_HZ = (1e7, 1e11)
"""Plausible range of the sleep kernel's cycles per second (GPU clocks are 1-3 GHz)."""


def resolve_clock(name: str, device: torch.device | str) -> str:
    """``name`` with 'auto' resolved on ``device``; ValueError for an unknown name or 'pipelined' off CUDA."""
    device = torch.device(device)
    if name not in CLOCKS:
        raise ValueError(f"advanced.clock ({name!r}) is not one of {list(CLOCKS)}: write clock = \"auto\"")
    if name == "auto":
        return "wall"
    if name == "pipelined" and device.type != "cuda":
        raise ValueError(
            f"advanced.clock ('pipelined') needs a CUDA device, the model is on {device}: "
            "use clock = \"auto\" (wall time off CUDA) or \"wall\""
        )
    return name


class DeviceQueue(Protocol):
    """The stream operations the pipelined clock needs (CUDA; tests give a simulated queue)."""

    def sync(self) -> None: ...
    def hold(self, seconds: float) -> None: ...
    def mark(self) -> Any: ...
    def done(self, event: Any) -> bool: ...
    def elapsed_s(self, start: Any, end: Any) -> float: ...


class CudaQueue:
    """The current CUDA stream of ``device``: sleep kernels calibrated in seconds, and CUDA events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cycles_per_s = self._calibrate()

    def _calibrate(self, cycles: int = 1 << 22) -> float:
        """Cycles the sleep kernel spins per second on this GPU (the second of two timings: the first warms up)."""
        rate = 0.0
        for _ in range(2):
            start = self.mark()
            self._sleep(cycles)
            end = self.mark()
            self.sync()
            rate = cycles / max(self.elapsed_s(start, end), 1e-9)
        if not SLEEP_RATES_HZ[0] <= rate <= SLEEP_RATES_HZ[1]:
            raise RuntimeError(
                f"advanced.clock ('pipelined'): the GPU sleep kernel on {self.device} ran at {rate:.3g} cycles/s, "
                f"outside {SLEEP_RATES_HZ}: its hold cannot be trusted; use advanced.clock = \"wall\""
            )
        return rate

    def _sleep(self, cycles: int) -> None:
        with torch.cuda.device(self.device):  # the model's GPU, not whichever is current
            torch.cuda._sleep(cycles)

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def hold(self, seconds: float) -> None:
        self._sleep(max(1, int(seconds * self.cycles_per_s)))

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def done(self, event: torch.cuda.Event) -> bool:
        return event.query()

    def elapsed_s(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1e3


class RegionClock:
    """Times regions of work with one of CLOCKS (resolved on ``device``).

    ``barrier`` runs before every region (the SP group's barrier: ranks start together); ``agree`` turns a
    list of this rank's values into the group's element-wise MAX (identity for one rank). ``failures``: the
    exception types (out of memory) a region's failure on one rank is agreed on (see ``time``). ``queue``
    and ``now`` replace the CUDA stream and the host clock in tests.
    """

    def __init__(self, name: str, device: torch.device | str, *, barrier: Callable[[], None] = lambda: None,
                 agree: Callable[[list[float]], list[float]] = lambda values: values,
                 queue: DeviceQueue | None = None, now: Callable[[], float] | None = None,
                 failures: tuple[type[BaseException], ...] = ()) -> None:
        self.device = torch.device(device)
        self._failures = failures
        self.name = resolve_clock(name, self.device) if queue is None else name
        self._barrier, self._agree = barrier, agree
        self._now = now or (time.process_time if self.name == "cpu" else time.perf_counter)
        self._queue = queue
        if self.name == "pipelined" and queue is None:
            self._queue = CudaQueue(self.device)
        self._lead_s: dict[str, float] = {}
        """Per region key: the group-agreed host enqueue time of its last timing (how long to hold the GPU)."""
        self.last_host_s = 0.0
        """Host enqueue time of the last pipelined region (diagnostics)."""
        self.last_device_s = 0.0
        """GPU time of the last pipelined region (diagnostics)."""
        self.last_covered = False
        """Whether the hold covered the host's enqueueing of the last region (its host time is then clean)."""
        self._uncovered: Counter[str] = Counter()
        """Per region key: repetitions whose hold did not cover the host (group-agreed)."""

    def _sync(self) -> None:
        if self._queue is not None:
            self._queue.sync()
        elif self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], Any], key: str = "") -> tuple[float, Any]:
        """(seconds, fn's result) of running ``fn`` as one region; ``key`` names the region across repetitions.

        With ``failures`` given, a rank whose ``fn`` raises one of them (out of memory) tells its group in the
        region's agreement, and every rank of the group raises: no rank goes on to the next region's barrier
        while another waits in the profiler's out-of-memory agreement. (An error inside one of fn's own
        collectives still leaves the peers waiting there until the collective timeout.)"""
        self.last_covered = False
        self._barrier()
        self._sync()
        pipelined = self.name == "pipelined" and self._uncovered[key] < MAX_UNCOVERED
        lead_s = self._lead_s.get(key, FIRST_LEAD_S)
        if pipelined:
            self._queue.hold(HOLD_FACTOR * lead_s + HOLD_MARGIN_S)
            start = self._queue.mark()
        t0 = self._now()
        failed: BaseException | None = None
        try:
            out = fn()
        except self._failures as exc:
            out, failed = None, exc
        host_s = self._now() - t0
        if pipelined:
            covered = not self._queue.done(start)  # the GPU was still held when the host had enqueued everything
            end = self._queue.mark()
        self._sync()
        elapsed_s = self._now() - t0
        if not (pipelined or self._failures):
            return elapsed_s, out
        # One collective on every rank, whatever happened: whether some rank failed, and when pipelined, how
        # long the group holds next time (its slowest host) and whether any rank's hold did not cover its
        # host (so that all switch to the wall clock together).
        values = [0.0 if failed is None else 1.0]
        if pipelined:
            covered = covered and failed is None
            values += [host_s if covered else min(host_s, MAX_LEAD_GROWTH * lead_s), 0.0 if covered else 1.0]
        agreed = self._agree(values)
        if agreed[0] > 0:
            raise failed if failed is not None else self._peer_failure(
                f"another rank of the SP group ran out of memory in the profiler's region {key!r}")
        if not pipelined:
            return elapsed_s, out
        self._lead_s[key] = agreed[1]
        self._uncovered[key] += int(agreed[2] > 0)
        device_s = self._queue.elapsed_s(start, end)
        self.last_host_s, self.last_device_s, self.last_covered = host_s, device_s, covered
        return max(host_s, device_s), out

    def _peer_failure(self, message: str) -> BaseException:
        oom = getattr(torch, "OutOfMemoryError", None)
        return oom(message) if oom in self._failures else self._failures[0](message)
