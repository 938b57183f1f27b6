"""The next micro-batch, collated (and pinned, on CUDA) on a background thread while the current one trains.

Collation (``dataset[i]`` for every sample and ``dataset.collate``) and the pinned host copy that a
non-blocking host-to-device copy needs are host work that the training thread would otherwise do between
two micro-batches, with the GPU idle. ``BatchPrefetcher`` runs them for the NEXT micro-batch on one worker
thread; the training thread only enqueues the (non-blocking) copy to the device. At most one collation is
in flight and the training thread never collates while it is, so the dataset is never read by two threads
at once. The batches and their order are exactly those of the loop without prefetching (runtime.prefetch).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any

import torch

from dcp.distributed.device import move_batch


def pin_batch(batch: Any) -> Any:
    """``batch`` with its host tensors ``inputs`` / ``targets`` in pinned memory (other objects unchanged)."""
    if not (dataclasses.is_dataclass(batch) and isinstance(getattr(batch, "inputs", None), torch.Tensor)):
        return batch
    changes = {name: t.pin_memory() for name in ("inputs", "targets")
               if isinstance(t := getattr(batch, name, None), torch.Tensor) and t.device.type == "cpu"}
    return dataclasses.replace(batch, **changes) if changes else batch


class BatchPrefetcher:
    """Collates micro-batches by sample ids, one ahead on a worker thread when ``enabled``.

    The worker is one daemon thread fed through ``queue.SimpleQueue`` (a request, then its result or its
    exception): a hand-over costs the training thread a few microseconds, where a ThreadPoolExecutor's
    submit (a Future, a work item, the pool's bookkeeping) cost ~10 us per micro-batch more."""

    def __init__(self, dataset: Any, device: torch.device, *, enabled: bool) -> None:
        self.dataset, self.device = dataset, torch.device(device)
        self._pin = self.device.type == "cuda"
        self._move = move_batch if self.device.type != "cpu" else None
        """How a host batch reaches the run's device (None on CPU: it is there)."""
        self._requests: queue.SimpleQueue | None = None
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if enabled:
            self._requests = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._work, args=(self._requests, self._results),
                                            name="dcp-collate", daemon=True)
            self._thread.start()
        self._ahead: tuple[int, ...] | None = None
        """Sample ids of the micro-batch the worker is collating (None: none in flight)."""
        self.prefetched = 0
        """Micro-batches taken from the worker (collated while the previous one trained)."""

    @property
    def enabled(self) -> bool:
        """True while a worker thread collates ahead."""
        return self._requests is not None

    def ahead(self, sample_ids: tuple[int, ...]) -> None:
        """Start collating the micro-batch of ``sample_ids`` (ignored without a worker or with one in flight)."""
        if self._requests is not None and self._ahead is None:
            self._ahead = tuple(sample_ids)
            self._requests.put(self._ahead)

    def take(self, sample_ids: tuple[int, ...], then: tuple[int, ...] | None = None) -> Any:
        """The micro-batch of ``sample_ids`` on the run's device (the prefetched one when it is that one);
        ``then``: the micro-batch to collate next (``ahead(then)`` once this one is in hand)."""
        ids, self._ahead = self._ahead, None
        if ids is not None:
            batch, error = self._results.get()
            if error is not None:
                raise error  # the worker's exception, here on the training thread
            if ids == tuple(sample_ids):
                self.prefetched += 1
            else:
                batch = self._collate(tuple(sample_ids))
        else:
            batch = self._collate(tuple(sample_ids))
        if then is not None and self._requests is not None:
            self._ahead = tuple(then)
            self._requests.put(self._ahead)
        return batch if self._move is None else self._move(batch, self.device)

    def _collate(self, sample_ids: tuple[int, ...]) -> Any:
        batch = self.dataset.collate([self.dataset[j] for j in sample_ids])
        return pin_batch(batch) if self._pin else batch

    def _work(self, requests: queue.SimpleQueue, results: queue.SimpleQueue) -> None:
        """Thread body: collate each requested micro-batch, in order, until the None that close() sends."""
        while (ids := requests.get()) is not None:
            try:
                results.put((self._collate(ids), None))
            except BaseException as exc:  # re-raised by take() on the training thread
                results.put((None, exc))

    def close(self) -> None:
        """Stop the worker (a collation in flight finishes; its batch is dropped)."""
        self._ahead = None
        if self._requests is not None:
            self._requests.put(None)
            self._thread.join()
            self._requests = self._thread = None
