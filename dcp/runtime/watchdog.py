"""The peer watch: a rank that died or was stopped is named by every survivor within a bound that does not grow
with the step, and every survivor exits non-zero.

A SIGKILLed rank closes its sockets, and gloo fails its peers' collectives at once; a stopped one (SIGSTOP, a
hung host, a process frozen in the kernel) keeps them open, and its peers would wait in their collective for
``runtime.collective_timeout_s`` (minutes, sized for the longest micro-batch). So each rank's heartbeat thread
(``dcp.runtime.phases.PhaseBoard.heartbeat``) also watches ONE peer, the next rank in a ring: when that peer's
beat counter stood still for ``advanced.peer_timeout_s`` while the peer is inside its epoch (its ``rest`` key
says so: a rank between epochs, e.g. saving a checkpoint, is not beating and not suspected), the watcher writes
one ``lost`` key to the job's store. Every rank reads that key at each beat. A rank that finds it logs one line
naming the lost rank and its last phase, and ends its process with exit status :data:`PEER_LOST_EXIT`: its
training thread may be blocked inside a collective that no Python code can interrupt, so the process is ended
the way NCCL's watchdog ends one (torchrun then stops the job). Each rank reads two keys and writes one per beat
(O(W) store operations per beat for the job, whatever W), and a lost rank is named within ``peer_timeout_s`` plus
two beats. Counters, not clocks: the hosts' clocks need not agree.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

PEER_LOST_EXIT = 3
"""Exit status of a rank that ended itself because a peer was lost."""


def _end_process(code: int) -> None:
    sys.stderr.flush()
    os._exit(code)


class PeerWatch:
    """One rank's watch over the next rank's heartbeat (``check`` runs at each beat, on the heartbeat thread)."""

    def __init__(self, store: Any, prefix: str, rank: int, world_size: int, timeout_s: float, *,
                 period_s: float = 1.0, end: Callable[[int], None] = _end_process) -> None:
        self.store, self.prefix, self.rank, self.world_size = store, prefix, rank, world_size
        self.timeout_s = timeout_s
        self.peer = (rank + 1) % world_size
        self._end = end
        self.period_s = period_s
        """The heartbeat's period: the rank that finds a peer lost waits two of them before it ends, so every
        other rank reads the news and names the peer itself (a launcher stops the job once one rank ends)."""
        self._count: int | None = None
        self._since = time.monotonic()

    def beating(self, on: bool) -> None:
        """Say whether this rank is inside its epoch (watched) or resting between epochs (not watched)."""
        try:
            self.store.set(f"{self.prefix}rest/{self.rank}", "0" if on else "1")
        except Exception:  # noqa: BLE001 - a gone store: the collectives report the failure
            pass

    def check(self) -> None:
        """Read the ``lost`` key and the peer's counter; end this process when a peer is lost."""
        try:
            lost_key = f"{self.prefix}lost"
            if self.store.check([lost_key]):
                self._give_up(json.loads(self.store.get(lost_key)))
                return
            count = int(self.store.add(f"{self.prefix}beat/{self.peer}", 0))
            now = time.monotonic()
            if count != self._count:
                self._count, self._since = count, now
                return
            if now - self._since < self.timeout_s or not self._peer_beating():
                return
            news = {"rank": self.peer, "seen_by": self.rank, "silent_s": round(now - self._since, 1),
                    "phase": self._peer_phase()}
            self.store.set(lost_key, json.dumps(news))
            self._give_up(news, linger_s=2 * self.period_s)
        except Exception:  # noqa: BLE001 - a gone store (its host died): the collectives report the failure
            return

    def _peer_beating(self) -> bool:
        key = f"{self.prefix}rest/{self.peer}"
        if not self.store.check([key]):
            return False  # never started an epoch: its own start-up is not this watch's business
        return self.store.get(key) == b"0"

    def _peer_phase(self) -> str:
        key = f"{self.prefix}{self.peer}"
        try:
            return str(json.loads(self.store.get(key))["phase"]) if self.store.check([key]) else "no phase reported"
        except Exception:  # noqa: BLE001
            return "unknown"

    def _give_up(self, news: dict[str, Any], linger_s: float = 0.0) -> None:
        logging.getLogger("dcp").error(
            f"rank {self.rank}: rank {news['rank']} is lost: its heartbeat stood still for {news['silent_s']} s "
            f"(seen by rank {news['seen_by']}) in '{news['phase']}': it died or was stopped there; ending this "
            f"rank with exit status {PEER_LOST_EXIT} (advanced.peer_timeout_s = {self.timeout_s:g}; restart the job "
            "from its last checkpoint)")
        time.sleep(linger_s)
        self._end(PEER_LOST_EXIT)


__all__ = ["PEER_LOST_EXIT", "PeerWatch"]
