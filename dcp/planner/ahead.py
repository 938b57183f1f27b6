"""Planning off the critical path: a background thread computes the next steps' plans ahead.

``PlanAhead(plans, depth)`` wraps any iterator of StepPlans (an ``EpochPlanner``). One daemon thread pulls
plans from it in order into a buffer of at most ``depth`` plans; ``next()`` takes the oldest. The plans, and
their order, are exactly those of the wrapped iterator (each rank runs its own deterministic planner, so the
per-epoch plan digest check is unchanged); only *when* they are computed moves. While the training loop runs
step s (GPU kernels, collectives: the GIL is released), the thread plans steps s + 1 .. s + depth, so a
planner costing tens of milliseconds per step at thousands of ranks never delays a step whose compute takes
longer than that. The thread still shares the GIL with the training loop: its CPU time is taken in
switch-interval slices from the loop's own Python (kernel launches), which a planner process would avoid.

An exception raised by the planner is re-raised by the ``next()`` that would have returned that plan. Used
plans are freed on the planning thread while it runs, each once the plan after the next one is taken (a loop
may still hold the one before the last it took); those left when it has ended, on whichever thread drops the
PlanAhead.
``close()`` (also on garbage collection, or ``with PlanAhead(...)``) stops the thread; it never blocks for
longer than one plan's computation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dcp.planner.serve import receive, send
from dcp.planner.stream import PlanningError

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
        self._source = plans
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
        """Stop the planning thread (idempotent); plans not yet taken are dropped. A ``RemotePlans`` source
        is terminated too (its process; a generator is left alone: it may be running on the thread)."""
        self._done = True
        self._stop.set()
        self._buffer.wake.set()
        _terminate(self._source)
        # while the interpreter finalizes, a daemon thread is frozen where it stood: joining it never returns
        if self._thread.is_alive() and threading.current_thread() is not self._thread and not sys.is_finalizing():
            self._thread.join()
        # the plans in hand (_current, _previous) and those retired go with this object: a PlanFeed drops it on a
        # helper thread (dcp.runtime.stepview), so the training thread frees no plan here (the producer, which
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
            _terminate(getattr(self, "_source", None))


def _terminate(source: Any) -> None:
    terminate = getattr(source, "terminate", None)
    if terminate is not None:
        terminate()


_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from dcp.planner.serve import main; sys.exit(main(int(sys.argv[2])))"
"""The child's command: the parent's own ``dcp`` first on its path (with ``-P``: not the working directory)."""


class RemotePlans:
    """The StepPlans of ``EpochPlanner(**planner_kwargs)``, computed by a child process
    (``dcp.planner.serve``) that holds its own GIL; wrap it in ``PlanAhead`` (whose thread only reads and
    unpickles: ~1-30 ms per plan at 4096 ranks, ~1-10 MB of arrays each). The same plans in the same order as
    the EpochPlanner in this process (tested). ``prepare`` (picklable; e.g. the runtime's
    ``dcp.runtime.stepview.StepViews``) is sent to the child and applied there to each plan, in order: what
    ``next()`` returns is its result, and an exception it raises is re-raised by the ``next()`` that would
    have returned that plan, as on PlanAhead's thread. The child imports this process's ``dcp`` and writes its
    messages to a pipe of their own (never stdout, where a stray print would corrupt them). A planner error is
    re-raised here; ``terminate()`` (also on garbage collection, and by ``PlanAhead.close()``) ends the child.
    """

    def __init__(self, planner_kwargs: dict[str, Any], prepare: Callable[[Any], Any] | None = None) -> None:
        import dcp

        root = os.path.dirname(os.path.dirname(os.path.abspath(dcp.__file__)))
        read_fd, write_fd = os.pipe()
        _widen(read_fd)
        try:
            self._proc = subprocess.Popen([sys.executable, "-P", "-c", _CHILD, root, str(write_fd)],
                                          stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child holds it now: reading ends when the child does
        self._messages = os.fdopen(read_fd, "rb")
        self._kwargs: tuple[dict[str, Any], Callable[[Any], Any] | None] | None = (planner_kwargs, prepare)
        self._closed = self._ended = False

    def __iter__(self) -> RemotePlans:
        return self

    def __next__(self) -> Any:
        if self._ended or self._closed:
            raise StopIteration
        proc = self._proc
        if self._kwargs is not None:  # on the reading thread: the constructor never waits for the child
            kwargs, self._kwargs = self._kwargs, None
            try:
                send(proc.stdin, kwargs)
                proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass  # the child is gone (or terminated): reading says why
        try:
            kind, value = receive(self._messages)
        except (EOFError, ValueError, OSError):
            self._ended = True
            if self._closed:
                raise StopIteration from None
            code = proc.wait()
            raise PlanningError(
                f"the planner process (dcp.planner.serve) ended without a plan (exit code {code}; a negative "
                "code is the signal that ended it, else its error is on stderr): advanced.plan_ahead = "
                '"thread" plans in this process'
            ) from None
        if kind == "plan":
            return value
        self._ended = True
        proc.wait()
        if kind == "end":
            raise StopIteration
        raise value

    def terminate(self) -> None:
        """End the child process (idempotent, any thread)."""
        self._closed = True
        proc = getattr(self, "_proc", None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, getattr(self, "_messages", None)):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass

    def __del__(self) -> None:
        self.terminate()


PIPE_BYTES = 1 << 20
"""The plans' pipe capacity asked of Linux (its default is 64 KiB, and /proc/sys/fs/pipe-max-size, 1 MiB by
default, caps it): a plan of 4096 ranks is 1-10 MB, and each 64 KiB the child writes wakes the reading thread,
which takes this process's GIL for each read."""


def _widen(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # not Linux, or a lower pipe-max-size: the default capacity only costs more wake-ups


def planned_ahead(planner_kwargs: dict[str, Any], where: str = "thread", depth: int = DEFAULT_DEPTH,
                  prepare: Callable[[Any], Any] | None = None) -> PlanAhead:
    """The plans of ``EpochPlanner(**planner_kwargs)``, computed ``depth`` steps ahead on a background thread
    (``where = "thread"``) or in a child process that the thread reads (``"process"``, ``RemotePlans``):
    ``advanced.plan_ahead``. The same plans either way; ``prepare`` (see PlanAhead) runs on the thread, or in
    the child process (it must pickle then): the training process only reads its results."""
    if where == "process":
        return PlanAhead(RemotePlans(planner_kwargs, prepare), depth)
    from dcp.planner.assemble import EpochPlanner

    return PlanAhead(EpochPlanner(**planner_kwargs), depth, prepare)


__all__ = ["DEFAULT_DEPTH", "PlanAhead", "RemotePlans", "planned_ahead"]
