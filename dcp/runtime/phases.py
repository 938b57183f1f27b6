"""Where every rank is, so a failed or timed-out collective names the rank that stalled or died.

Every rank writes its current phase ("micro-batch 2/3 of epoch 0 step 5", "gradient sync of epoch 0 step 5",
"plan check of epoch 1", ...) into the job's rendezvous store (the TCPStore that ``init_process_group``
made; torchrun's agent hosts it outside the workers, so it outlives a dead rank). A collective that raises
(gloo's timeout after ``runtime.collective_timeout_s``, or a peer's closed connection when it died) is
re-raised as :class:`CollectiveError` naming every rank that is not in the same phase, the phase it last
reported and how long ago: the rank that stalled (or died) and where.

One ``store.set`` per phase change (a few per micro-batch at most): a small TCP message, no device sync.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
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
        self.phase = "start"
        self.note = ""
        """Appended to every phase from now on (e.g. that this rank left get_data_iter() early)."""

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

    def enter(self, phase: str) -> None:
        """Record that this rank is now in ``phase``."""
        self.phase = phase + (f" ({self.note})" if self.note else "")
        try:
            self.store.set(f"{self.prefix}{self.rank}", json.dumps({"phase": self.phase, "t": time.time()}))
        except Exception:  # noqa: BLE001 - the board only helps diagnose; it must never fail a step
            pass

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
            others = self.others()
        except Exception:  # noqa: BLE001
            others = {}
        elsewhere = {r: v for r, v in others.items() if v is None or v[0] != self.phase}
        if not others:
            return head + ": the other ranks' phases are unavailable (the rendezvous store is gone): check their logs"
        if not elsewhere:
            return (head + ": every rank reported this phase, so the collective itself failed (network, a rank "
                    "killed inside it): check the ranks' logs")
        lines = []
        for r, v in sorted(elsewhere.items()):
            if v is None:
                lines.append(f"rank {r} never reported a phase")
            elif v[1] < 0:
                lines.append(f"rank {r}'s phase is unknown (the rendezvous store did not answer)")
            else:
                lines.append(f"rank {r} is in '{v[0]}' (since {v[1]:.1f} s)")
        culprits = sorted(elsewhere)
        return (head + f": {'; '.join(lines)}: rank{'s' if len(culprits) > 1 else ''} "
                f"{', '.join(map(str, culprits))} stalled or died there (check its log; a rank that exited also "
                "shows here), or left the loop early; if that phase legitimately takes longer, raise "
                "runtime.collective_timeout_s (runtime.plan_check_timeout_s for the plan check)")

    @contextmanager
    def collective(self, phase: str, *, timeout_s: float | None = None) -> Iterator[None]:
        """Run a collective in ``phase``; a RuntimeError from it becomes a CollectiveError naming the culprit."""
        self.enter(phase)
        t0 = time.perf_counter()
        try:
            yield
        except CollectiveError:
            raise
        except RuntimeError as exc:
            raise CollectiveError(self.diagnose(self.phase, exc, time.perf_counter() - t0, timeout_s)) from exc
