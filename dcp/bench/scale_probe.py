"""The clocks of ``dcp bench scale`` (dcp.bench.scale) on the training thread: the per-step probe, the plan
iterator's wrapper, and the calibration of their own cost (``harness_cost``), which the bench reports as
``harness_ms_per_step`` and takes out of ``host_ms_per_step`` (see dcp.bench.scale's docstring)."""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections import Counter
from typing import Any

CALIBRATION_ROUNDS = 7
"""Rounds of the harness calibration (``harness_cost``); the median round is used."""
CALIBRATION_CALLS = 2000
"""Micro-batches (and steps) of probe calls per calibration round."""


class Plans:
    """An epoch's plan iterator that counts the plans taken and times each wait for one (on the training thread)."""

    def __init__(self, inner: Any, probe: Probe) -> None:
        self.inner, self.probe = iter(inner), probe

    def __iter__(self) -> Plans:
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            plan = next(self.inner)
        finally:
            self.probe.plan_wait_s[self.probe.tick()] += time.perf_counter() - t0
        self.probe.plans_taken += 1
        return plan

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class Probe:
    """Per-step clocks of one rank's loop, keyed by the manager's finished steps (``global_step``)."""

    def __init__(self) -> None:
        self.mgr: Any = None
        self.model_s: Counter = Counter()
        self.model_cpu_s: Counter = Counter()
        """Training-thread CPU seconds inside the model (forward, backward, optimizer step), per tick."""
        self.plan_wait_s: Counter = Counter()
        self.manager_s: Counter = Counter()
        self.manager_cpu_s: Counter = Counter()
        """Wall / training-thread CPU seconds of the manager's own work run inside ``engine.step`` (its step_done:
        closing the step, recording its samples in the epoch's position), per tick: host time, not model."""
        self.plans_taken = 0
        self.micro_batches: Counter = Counter()
        """Micro-batches this rank ran, per tick (host time grows with them: collation, phase, engine)."""
        self.step_start: dict[int, tuple[float, float, float]] = {}
        """tick -> (wall, process CPU, training-thread CPU) when the manager reached it."""
        self.switches: dict[int, tuple[int, int]] = {}
        """tick -> the training thread's (voluntary, involuntary) context switches so far, when it was reached."""

    def tick(self) -> int:
        return self.mgr.global_step if self.mgr is not None else -1

    def mark(self) -> None:
        t = self.tick()
        if t not in self.step_start:
            self.step_start[t] = (time.perf_counter(), time.process_time(), time.thread_time())
            use = resource.getrusage(resource.RUSAGE_THREAD)
            self.switches[t] = (use.ru_nvcsw, use.ru_nivcsw)

    def model_done(self, tick: int, t0: float, c0: float) -> None:
        """The end of the forward's bracket (opened with ``tick(), perf_counter(), thread_time()``)."""
        self.model_s[tick] += time.perf_counter() - t0
        self.model_cpu_s[tick] += time.thread_time() - c0

    def timed(self, fn: Any, census: Any = None, tag: str = "") -> Any:
        """``fn`` with its wall time filed as model time (and its collectives under ``tag``)."""
        def call(*args: Any, **kwargs: Any) -> Any:
            self.mark()  # a step finished outside a wrapper (an idle step's step_done) starts the next one here
            tick, t0, c0 = self.tick(), time.perf_counter(), time.thread_time()
            if census is not None:
                census.tag = tag
            try:
                return fn(*args, **kwargs)
            finally:
                if census is not None:
                    census.tag = ""
                self.model_s[tick] += time.perf_counter() - t0
                self.model_cpu_s[tick] += time.thread_time() - c0
                self.mark()  # engine.step() / idle_step() end a step: the next one starts here

        return call

    def manager_part(self, fn: Any) -> Any:
        """``fn`` (a manager call made from inside a model-timed wrapper) with its time filed back as host time."""
        def call(*args: Any, **kwargs: Any) -> Any:
            tick, t0, c0 = self.tick(), time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.manager_s[tick] += time.perf_counter() - t0
                self.manager_cpu_s[tick] += time.thread_time() - c0

        return call


def harness_cost(mgr: Any, census: Any) -> tuple[float, float]:
    """Training-thread CPU seconds that the bench's own probe calls add to host time, per micro-batch and per
    step: the calls ``dcp.bench.scale.measure`` makes, run with no-ops in place of the runtime's and the
    model's functions, and accounted as ``dcp.bench.scale._row`` accounts (thread CPU, minus what the probe's
    brackets filed as model, plus what ``manager_part`` filed back as host). Per micro-batch: the loop's
    ``mark`` and micro-batch count, the forward's bracket, ``timed`` around backward and step. Per step:
    ``Plans.__next__`` over an iterator that costs nothing, the loop's ``step_done`` wrapper (a ``mark``), and
    ``manager_part``'s own bracket (inside engine.step's model bracket only its inner part counts as host).
    Run hot (the same calls back to back), so it is about the least these calls cost; in the loop, with
    colder caches, they cost more, and a step's first ``mark`` (its clocks and ``getrusage``) and the census's
    counting of a control collective are not calibrated: the bench's cost is under-, never over-subtracted."""
    def noop(*args: Any) -> None:
        return None

    per_mb, per_step = [], []
    for _ in range(CALIBRATION_ROUNDS):
        probe = Probe()
        probe.mgr = mgr
        probe.mark()  # the tick is marked: later marks only look it up, as within a step
        bwd, stp = probe.timed(noop, census, "grad-sync"), probe.timed(noop, census, "grad-sync")
        c0 = time.thread_time()
        for _ in range(CALIBRATION_CALLS):
            probe.mark()
            probe.micro_batches[probe.tick()] += 1
            tick, t0, c = probe.tick(), time.perf_counter(), time.thread_time()
            probe.model_done(tick, t0, c)
            bwd(None)
            stp()
        per_mb.append((time.thread_time() - c0 - sum(probe.model_cpu_s.values())) / CALIBRATION_CALLS)
        plans, done = Plans(itertools.repeat(None), probe), probe.manager_part(noop)
        c0 = time.thread_time()
        for _ in range(CALIBRATION_CALLS):
            next(plans)
            probe.mark()
        step = time.thread_time() - c0
        for _ in range(CALIBRATION_CALLS):
            done(None)
        per_step.append((step + sum(probe.manager_cpu_s.values())) / CALIBRATION_CALLS)
    return statistics.median(per_mb), statistics.median(per_step)
