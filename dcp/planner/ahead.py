"""Planning off the critical path: a background thread computes the next steps' plans ahead.

``PlanAhead(plans, depth)`` wraps any iterator of StepPlans (an ``EpochPlanner``). One daemon thread pulls
plans from it in order into a bounded queue of ``depth`` plans; ``next()`` takes the oldest. The plans, and
their order, are exactly those of the wrapped iterator (each rank runs its own deterministic planner, so the
per-epoch plan digest check is unchanged); only *when* they are computed moves. While the training loop runs
step s (GPU kernels, collectives: the GIL is released), the thread plans steps s + 1 .. s + depth, so a
planner costing tens of milliseconds per step at thousands of ranks never delays a step whose compute takes
longer than that.

An exception raised by the planner is re-raised by the ``next()`` that would have returned that plan.
``close()`` (also on garbage collection, or ``with PlanAhead(...)``) stops the thread; it never blocks for
longer than one plan's computation.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

DEFAULT_DEPTH = 2
"""Plans computed ahead of the one in use."""

_END = object()
_POLL_S = 0.05
"""How often a thread blocked on a full queue checks whether it was closed."""


def _put(out: queue.Queue, stop: threading.Event, entry: tuple[Any, BaseException | None]) -> bool:
    """Put ``entry`` unless the consumer closed first (checked every _POLL_S); True when it was put."""
    while not stop.is_set():
        try:
            out.put(entry, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _produce(it: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
    """Thread body: references only the source, the queue and the event (not the PlanAhead), so dropping
    the PlanAhead closes it."""
    try:
        for item in it:
            if not _put(out, stop, (item, None)):
                return
        last: tuple[Any, BaseException | None] = (_END, None)
    except BaseException as exc:  # re-raised in the consumer
        last = (None, exc)
    _put(out, stop, last)


class PlanAhead:
    """Iterator over the plans of ``plans``, computed ``depth`` steps ahead by one background thread."""

    def __init__(self, plans: Iterable[Any], depth: int = DEFAULT_DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth ({depth}) must be >= 1: the number of plans computed ahead, e.g. 2")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=_produce, args=(iter(plans), self._queue, self._stop), name="dcp-plan-ahead", daemon=True
        )
        self._thread.start()

    def __iter__(self) -> PlanAhead:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item, err = self._queue.get()
        if err is not None:
            self._done = True
            self.close()
            raise err
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the planning thread (idempotent); plans not yet taken are dropped."""
        self._done = True
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

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


__all__ = ["DEFAULT_DEPTH", "PlanAhead"]
