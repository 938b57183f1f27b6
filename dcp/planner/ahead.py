"""Planning off the critical path: a background thread computes the next steps' plans ahead.

``PlanAhead(plans, depth)`` wraps any iterator of StepPlans (an ``EpochPlanner``). One daemon thread pulls
plans from it in order into a buffer of at most ``depth`` plans; ``next()`` takes the oldest. The plans, and
their order, are exactly those of the wrapped iterator (each rank runs its own deterministic planner, so the
per-epoch plan digest check is unchanged); only *when* they are computed moves. While the training loop runs
step s (GPU kernels, collectives: the GIL is released), the thread plans steps s + 1 .. s + depth, so a
planner costing tens of milliseconds per step at thousands of ranks never delays a step whose compute takes
longer than that. The thread still shares the GIL with the training loop: its CPU time is taken in
switch-interval slices from the loop's own Python (kernel launches). A planner child process per rank, which
held its own GIL, was measured against this thread (``dcp bench scale``, W 64 and 512, interleaved): the training
thread's host CPU per step within noise (0.58 vs 0.63 ms at 512), its wall time and the first batch's wait
(+1.0-1.3 s per epoch, the child's start) worse; it was removed.

An exception raised by the planner is re-raised by the ``next()`` that would have returned that plan. Used
plans are freed on the planning thread while it runs, each once the plan after the next one is taken (a loop
may still hold the one before the last it took); those left when it has ended, on whichever thread drops the
PlanAhead.
``close()`` (also on garbage collection, or ``with PlanAhead(...)``) stops the thread and joins it; it never blocks
for longer than one plan's computation.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

DEFAULT_DEPTH = 2
"""Plans computed ahead of the one in use."""

_END = object()
_POLL_S = 0.05
"""How often a producer waiting for room looks again (a close wakes it at once)."""


class _Buffer:
    """The plans computed ahead. Taking one wakes the producer only when the consumer is about to block.

    With a queue.Queue, ``get()`` notified the waiting producer, which then asked for the GIL while the
    consumer still held it; the consumer had to hand it over at its next switch check and wait a whole
    switch interval (5 ms) for the CPU-bound producer to give it back. ``next()`` blocked ~8 ms at 4096
    ranks though its plan was ready (``dcp bench planner``, exposed_median_ms). Now a producer waiting for
    room looks again every _POLL_S, and the consumer wakes it at once only when it takes the last plan in
    hand or finds none: a loop faster than the polling is not held to ``depth`` plans per _POLL_S, and a
    loop slower than it (steps of hundreds of ms at thousands of ranks) never pays the hand-over."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.items: deque[tuple[Any, BaseException | None]] = deque()
        self.ready = threading.Condition()
        self.wake = threading.Event()
        """Set by a consumer about to block, and by close(): the producer stops waiting for room."""
        self.retired: deque[Any] = deque()
        """Plans the consumer is done with, freed here by the producer (see ``PlanAhead.__next__``)."""

    def free_retired(self) -> None:
        while self.retired:
            self.retired.popleft()  # the last reference, usually: the plan is freed on this thread

    def put(self, stop: threading.Event, entry: tuple[Any, BaseException | None]) -> bool:
        """Append ``entry`` once there is room, unless the consumer closed first; True when it was put."""
        while len(self.items) >= self.depth:
            self.free_retired()
            self.wake.wait(_POLL_S)
            self.wake.clear()
            if stop.is_set():
                return False
        if stop.is_set():
            return False
        with self.ready:
            self.items.append(entry)
            self.ready.notify()
        self.free_retired()  # after the hand-over: a consumer waiting for this plan does not wait for the free
        return True

    def take(self) -> tuple[Any, BaseException | None]:
        with self.ready:
            while not self.items:
                self.wake.set()
                self.ready.wait()
            item = self.items.popleft()
            if not self.items:
                # the last plan in hand: a loop this fast cannot wait for the next poll
                self.wake.set()
            return item


def _produce(it: Iterator[Any], buf: _Buffer, stop: threading.Event, prepare: Callable[[Any], Any] | None) -> None:
    """Thread body: references only the source, the buffer and the event (not the PlanAhead), so dropping
    the PlanAhead closes it."""
    try:
        for item in it:
            if not buf.put(stop, (item if prepare is None else prepare(item), None)):
                return
        last: tuple[Any, BaseException | None] = (_END, None)
    except BaseException as exc:  # re-raised in the consumer
        last = (None, exc)
    buf.put(stop, last)


class PlanAhead:
    """Iterator over the plans of ``plans``, computed ``depth`` steps ahead by one background thread;
    ``prepare``: applied to each plan on that thread (the runtime's per-rank view of the step,
    ``dcp.runtime.stepview``), its results are what ``next()`` returns."""

    def __init__(self, plans: Iterable[Any], depth: int = DEFAULT_DEPTH,
                 prepare: Callable[[Any], Any] | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth ({depth}) must be >= 1: the number of plans computed ahead, e.g. 2")
        self._buffer = _Buffer(depth)
        self._current: Any = None
        self._previous: Any = None
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_produce, args=(iter(plans), self._buffer, self._stop, prepare), name="dcp-plan-ahead",
            daemon=True
        )
        self._thread.start()

    def __iter__(self) -> PlanAhead:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item, err = self._buffer.take()
        if err is not None:
            self._done = True
            self.close()
            raise err
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        # Hand the plan before the previous one to the producer to free: freeing a plan of ~20,000 micro-batches
        # took 6-23 ms at 4096 ranks, on the training loop's thread. Not the previous one: a step loop still
        # holds it after taking this one (it closes step k once step k + 1's plan is in hand), and when the
        # producer freed its reference first, the loop's was the last (3 of 8 plans at 4096 ranks).
        if self._previous is not None:
            self._buffer.retired.append(self._previous)
        self._previous, self._current = self._current, item
        return item

    def close(self) -> None:
        """Stop the planning thread (idempotent); plans not yet taken are dropped."""
        self._done = True
        self._stop.set()
        self._buffer.wake.set()
        # while the interpreter finalizes, a daemon thread is frozen where it stood: joining it never returns
        if self._thread.is_alive() and threading.current_thread() is not self._thread and not sys.is_finalizing():
            self._thread.join()
        # the plans in hand (_current, _previous) and those retired go with this object (the producer, which
        # would have freed the retired ones, has ended)

    @property
    def alive(self) -> bool:
        """Whether the planning thread is still running."""
        return self._thread.is_alive()

    def __enter__(self) -> PlanAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            self._buffer.wake.set()


def planned_ahead(planner_kwargs: dict[str, Any], depth: int = DEFAULT_DEPTH,
                  prepare: Callable[[Any], Any] | None = None) -> PlanAhead:
    """The plans of ``EpochPlanner(**planner_kwargs)``, computed ``depth`` steps ahead on a background thread;
    ``prepare`` (see PlanAhead) runs on that thread too."""
    from dcp.planner.assemble import EpochPlanner

    return PlanAhead(EpochPlanner(**planner_kwargs), depth, prepare)


__all__ = ["DEFAULT_DEPTH", "PlanAhead", "planned_ahead"]
