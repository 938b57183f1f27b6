"""Where every rank is, so a failed or timed-out collective names the rank that stalled or died.

Every rank writes its current phase ("micro-batch 2/3 of epoch 0 step 5", "gradient sync of epoch 0 step 5",
"plan check of epoch 1", ...) into the job's rendezvous store (the TCPStore that ``init_process_group``
made; torchrun's agent hosts it outside the workers, so it outlives a dead rank). A collective that raises
(gloo's timeout after ``runtime.collective_timeout_s``, or a peer's closed connection when it died) is
re-raised as :class:`CollectiveError` naming every rank that is not in the same phase, the phase it last
reported and how long ago: the rank that stalled (or died) and where.

A phase is written to the store (one ``store.set``: a small TCP message, no device sync) on the calling thread
when the rank enters a collective, the first micro-batch of a step, or leaves the loop, before the work starts,
so a rank that dies the moment it enters one is still named in it. From a step's first micro-batch the board
follows the step (``follow``): the phase of the micro-batch in flight is formatted only when read, and the
heartbeat thread writes it when it next beats, so the store server serves O(W) writes per step, not O(W x
micro-batches), and the training thread does nothing per micro-batch for the board. A rank that dies between
beats is therefore named in its step, with the micro-batch it last published (the step's first, or a later one
written by a beat).
(The step's first micro-batch was once written by the heartbeat thread, woken for it, to spare the training
thread one round trip a step: a rank that died within the thread's wake-up was then named at its previous
phase, the last step's gradient sync, in 4 of 6 runs of tests/dist/test_rank_failures.py.)

A rank killed (or stopped) inside a collective leaves the same phase as its peers on the board; so a board can
also beat: :meth:`PhaseBoard.heartbeat` counts up a per-rank key every ``period_s`` from a daemon thread while
the work runs (the profiler's search, whose ranks share every all-to-all). On a failure the survivors read the
counters twice, ``3 * period_s`` apart: a rank whose counter stood still is named as dead or stopped, with its
last phase. Counters, not clocks, so the hosts' clocks need not agree.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PREFIX = "dcp/phase/"


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the ranks that were elsewhere and their phase."""


class PhaseBoard:
    """This rank's phase in a shared key-value store (``torch.distributed.Store``), and the others' on demand."""

    def __init__(self, store: Any, rank: int, world_size: int, *, job: str = "") -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.prefix = f"{PREFIX}{job}/" if job else PREFIX
        self._entered: tuple[str, float] = ("start", time.time())
        """(phase, time.time() when entered): what the heartbeat publishes when it differs from the last write."""
        self._live: Callable[[], tuple[str, float]] | None = None
        """What ``follow`` gave: the current (phase, time entered), read instead of ``_entered`` until ``enter``."""
        self._published: tuple[str, float] | None = None
        self.note = ""
        """Appended to every phase from now on (e.g. that this rank left get_data_iter() early)."""
        self.beat_period_s = 0.0
        """Period of this rank's heartbeat while :meth:`heartbeat` runs (0: no heartbeat)."""

    @classmethod
    def for_default_group(cls, *, job: str = "") -> PhaseBoard | None:
        """The board on the default process group's store; None without torch.distributed, at W = 1, or when
        the store cannot be reached (then failures are reported without the other ranks' phases)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):
            return None
        return cls(store, dist.get_rank(), dist.get_world_size(), job=job)

    @property
    def phase(self) -> str:
        """This rank's current phase, the note included."""
        return self._current()[0]

    def _current(self) -> tuple[str, float]:
        live = self._live
        if live is None:
            return self._entered
        phase, t = live()
        return phase + (f" ({self.note})" if self.note else ""), t

    def enter(self, phase: str, *, publish: bool = True) -> None:
        """Record that this rank is now in ``phase`` and write it to the store; ``publish=False``: only here,
        written at the heartbeat's next beat (or the next published phase)."""
        self._live = None
        self._entered = (phase + (f" ({self.note})" if self.note else ""), time.time())
        if publish:
            self._publish(self._entered)

    @property
    def following(self) -> bool:
        """True while the board follows a phase (``follow``), until the next ``enter``."""
        return self._live is not None

    def follow(self, phase_of: Callable[[], tuple[str, float]]) -> None:
        """From now until the next ``enter``, this rank's phase is ``phase_of()`` (phase, time.time() entered),
        read when it is needed: here, where it is written to the store now, by the heartbeat at each beat, and by
        a failure's message. For a phase that changes every micro-batch (the step loop's
        ``OpenStep.micro_batch_phase``): nothing is formatted per micro-batch. An ``enter`` per micro-batch
        cost the training thread ~5 us each, ~0.2 ms a step at 4096 ranks (``dcp bench scale``, 9 of 10
        pairs); ``phase_of`` must be safe to call from the heartbeat thread."""
        self._live = phase_of
        self._publish(self._current())

    def _publish(self, entered: tuple[str, float]) -> None:
        try:
            self.store.set(f"{self.prefix}{self.rank}", json.dumps({"phase": entered[0], "t": entered[1]}))
            self._published = entered
        except Exception:  # noqa: BLE001 - the board only helps diagnose; it must never fail a step
            pass

    @contextmanager
    def heartbeat(self, period_s: float | None = None, *, watch_s: float = 0.0) -> Iterator[None]:
        """Count this rank's heartbeat key up every ``period_s`` (a daemon thread) while the block runs, and write
        this rank's phase when it changed since the last write (a followed step's micro-batch, or an
        ``enter(..., publish=False)``) at each beat.
        Default period: 1 s, and 1 s per 1000 ranks beyond that, so the store serves at most ~1000 beats per
        second. ``watch_s`` > 0: also watch the next rank (``dcp.runtime.watchdog.PeerWatch``): a peer whose beat
        stood still this long ends every rank's process, naming it."""
        from dcp.runtime.watchdog import PeerWatch

        period_s = period_s or max(1.0, self.world_size / 1000)
        stop = threading.Event()
        key = f"{self.prefix}beat/{self.rank}"
        watch = (PeerWatch(self.store, self.prefix, self.rank, self.world_size, watch_s, period_s=period_s)
                 if watch_s > 0 else None)
        if watch is not None:
            watch.beating(True)

        def beat() -> None:
            due = 0.0
            while not stop.is_set():
                entered = self._current()  # the training thread replaces _entered and _live, never mutates them
                if entered != self._published:
                    self._publish(entered)
                    latest = self._current()
                    if latest != entered:  # the training thread moved on (and may have written) during that write:
                        self._publish(latest)  # its phase, not the one read before, is what the store keeps
                if time.monotonic() >= due:
                    try:
                        self.store.add(key, 1)
                    except Exception:  # noqa: BLE001 - a gone store: the failure is reported by the collective
                        pass
                    due = time.monotonic() + period_s
                    if watch is not None:
                        watch.check()
                stop.wait(max(0.0, due - time.monotonic()))

        thread = threading.Thread(target=beat, name=f"dcp-heartbeat-{self.rank}", daemon=True)
        self.beat_period_s = period_s
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5 * period_s)
            self.beat_period_s = 0.0
            if watch is not None:
                watch.beating(False)
            if not thread.is_alive() and (entered := self._current()) != self._published:
                self._publish(entered)  # entered while the thread stopped: written here, not lost

    def silent(self) -> set[int]:
        """Other ranks whose heartbeat stood still over ``3 * beat_period_s`` (waited here): dead or stopped.
        Empty without a heartbeat, and for ranks that never beat (they did not run one)."""
        if not self.beat_period_s:
            return set()

        def counts() -> dict[int, int]:
            out = {}
            for r in range(self.world_size):
                key = f"{self.prefix}beat/{r}"
                try:
                    if r != self.rank and self.store.check([key]):
                        out[r] = int(self.store.add(key, 0))
                except Exception:  # noqa: BLE001 - a gone store: nothing is known
                    pass
            return out

        before = counts()
        time.sleep(3 * self.beat_period_s)
        after = counts()
        return {r for r, n in before.items() if after.get(r) == n}

    def others(self) -> dict[int, tuple[str, float] | None]:
        """Every other rank's last (phase, seconds ago); None for a rank that never reported; ("", -1.0) when
        the store did not answer."""
        out: dict[int, tuple[str, float] | None] = {}
        now = time.time()
        for r in range(self.world_size):
            if r == self.rank:
                continue
            key = f"{self.prefix}{r}"
            try:
                if not self.store.check([key]):
                    out[r] = None
                    continue
                raw = json.loads(self.store.get(key))
                out[r] = (str(raw["phase"]), max(0.0, now - float(raw["t"])))
            except Exception:  # noqa: BLE001 - a dead store host: report what is known
                out[r] = ("", -1.0)
        return out

    def diagnose(self, phase: str, exc: BaseException, elapsed_s: float, timeout_s: float | None) -> str:
        """The message of a failed collective: who is elsewhere, where, since when, and the fix."""
        limit = f" (timeout {timeout_s:g} s)" if timeout_s else ""
        head = (f"rank {self.rank}: {phase} failed after {elapsed_s:.1f} s{limit}: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        try:
            silent = self.silent()
            others = self.others()
        except Exception:  # noqa: BLE001
            silent, others = set(), {}
        elsewhere = {r: v for r, v in others.items() if v is None or v[0] != self.phase or r in silent}
        if not others:
            return head + ": the other ranks' phases are unavailable (the rendezvous store is gone): check their logs"
        if not elsewhere:
            return (head + ": every rank reported this phase, so the collective itself failed (network, a rank "
                    "killed inside it): check the ranks' logs")
        lines = []
        for r, v in sorted(elsewhere.items()):
            if r in silent and v is not None and v[1] >= 0:
                lines.append(f"rank {r} is in '{v[0]}' (since {v[1]:.1f} s) and its heartbeat stopped "
                             f"{3 * self.beat_period_s:g} s ago or more: it died or was stopped there")
            elif v is None:
                lines.append(f"rank {r} never reported a phase")
            elif v[1] < 0:
                lines.append(f"rank {r}'s phase is unknown (the rendezvous store did not answer)")
            else:
                lines.append(f"rank {r} is in '{v[0]}' (since {v[1]:.1f} s)")
        culprits = sorted(elsewhere)
        return (head + f": {'; '.join(lines)}: rank{'s' if len(culprits) > 1 else ''} "
                f"{', '.join(map(str, culprits))} stalled or died there (check its log; a rank that exited also "
                "shows here), or left the loop early; if that phase legitimately takes longer, raise "
                "runtime.collective_timeout_s (advanced.plan_check_timeout_s for the plan check)")

    @contextmanager
    def collective(self, phase: str, *, timeout_s: float | None = None, comm_only: bool = False) -> Iterator[None]:
        """Run a collective in ``phase``; a RuntimeError from it becomes a CollectiveError naming the culprit.
        ``comm_only``: only errors of the communication backend (a block that also computes keeps its own)."""
        self.enter(phase)
        t0 = time.perf_counter()
        try:
            yield
        except CollectiveError:
            raise
        except RuntimeError as exc:
            if comm_only and not is_comm_failure(exc):
                raise
            raise CollectiveError(self.diagnose(self.phase, exc, time.perf_counter() - t0, timeout_s)) from exc


_COMM_WORDS = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "gloo", "nccl",
               "socket", "peer")


def is_comm_failure(exc: BaseException) -> bool:
    """True for an error of the communication backend (torch's DistError family, or gloo / NCCL / socket
    wording), False for a computation's own error (a shape mismatch, an out-of-memory)."""
    import torch.distributed as dist

    family = tuple(c for c in (getattr(dist, "DistError", None),) if c is not None)
    return (bool(family) and isinstance(exc, family)) or any(w in str(exc).lower() for w in _COMM_WORDS)
