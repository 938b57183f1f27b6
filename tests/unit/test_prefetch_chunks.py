"""The prefetch thread collates the loop's next micro-batches in chunks (dcp.runtime.prefetch): up to ``depth``
ahead, woken once per chunk rather than once per micro-batch, with the same batches in the same order as
collating each one on the calling thread."""

from __future__ import annotations

import threading

import pytest
import torch

from dcp.runtime.data import SyntheticTokenDataset
from dcp.runtime.prefetch import PREFETCH_DEPTH, REFILL_AT, BatchPrefetcher

LENGTHS = [6, 9, 4, 7, 5, 8, 3, 10, 6, 5, 7, 4, 9, 3, 8, 6, 5, 7, 4, 6]


class _Recording(SyntheticTokenDataset):
    """Records the thread that reads each sample, and the most reads in progress at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads, self.busy, self.most, self._lock = [], 0, 0, threading.Lock()

    def __getitem__(self, index):
        with self._lock:
            self.busy += 1
            self.most = max(self.most, self.busy)
        try:
            self.threads.append(threading.current_thread().name)
            return super().__getitem__(index)
        finally:
            with self._lock:
                self.busy -= 1


class _CountingQueue:
    """The worker's request queue, counting the chunks put (each wakes the worker once)."""

    def __init__(self, inner):
        self.inner, self.chunks = inner, []

    def put(self, item):
        if item is not None:
            self.chunks.append(item)
        self.inner.put(item)


@pytest.mark.parametrize(("depth", "refill_at"), [(PREFETCH_DEPTH, REFILL_AT), (6, 2)])
def test_wanted_micro_batches_are_collated_ahead_in_chunks_in_order(depth, refill_at):
    lengths = LENGTHS * 5  # 100 micro-batches: several chunks of the default depth too
    data = _Recording(lengths, vocab_size=16)
    ids = [(i,) for i in range(len(lengths))]
    fetch = BatchPrefetcher(data, torch.device("cpu"), enabled=True, depth=depth, refill_at=refill_at)
    counting = fetch._requests = _CountingQueue(fetch._requests)
    try:
        first = fetch.take(ids[0])  # the first one on the calling thread, then the rest ahead
        fetch.want(ids[1:])
        got = [first]
        for k in ids[1:]:
            assert len(fetch._inflight) <= depth
            got.append(fetch.take(k))
    finally:
        fetch.close()
    want = [data.collate([data[i] for i in k]) for k in ids]
    assert [b.sample_ids for b in got] == ids
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert fetch.prefetched == len(ids) - 1
    # the worker was woken once per chunk: the first of up to depth, then depth - refill_at
    sizes = [len(c) for c in counting.chunks]
    assert sizes[0] == depth and sum(sizes) == len(ids) - 1
    assert all(s == depth - refill_at for s in sizes[1:-1]) and len(sizes) == 1 + -(-(len(ids) - 1 - depth) // (depth - refill_at))
    assert [k for c in counting.chunks for k in c] == ids[1:]
    assert data.threads[0] == threading.current_thread().name
    assert set(data.threads[1 : len(ids)]) == {"dcp-collate"}
    assert data.most == 1  # the dataset is never read by two threads at once


def test_a_take_out_of_order_drops_what_is_ahead_and_collates_here():
    data = _Recording(LENGTHS, vocab_size=16)
    fetch = BatchPrefetcher(data, torch.device("cpu"), enabled=True, depth=3)
    try:
        fetch.want([(1,), (2,), (3,), (4,)])
        assert fetch.take((1,)).sample_ids == (1,) and fetch.prefetched == 1
        reads = len(data.threads)
        assert fetch.take((7, 8)).sample_ids == (7, 8)  # not the next one wanted: everything ahead is dropped
        assert data.threads[-2:] == [threading.current_thread().name] * 2
        assert len(data.threads) >= reads + 2 and not fetch._inflight and not fetch._wanted
        assert fetch.take((2,)).sample_ids == (2,) and fetch.prefetched == 1  # collated here: nothing was ahead
        assert data.most == 1
    finally:
        fetch.close()


def test_close_stops_a_chunk_in_flight_and_the_depth_is_checked():
    data = SyntheticTokenDataset(LENGTHS, vocab_size=16)
    fetch = BatchPrefetcher(data, torch.device("cpu"), enabled=True)
    worker = fetch._thread
    fetch.want([(i,) for i in range(len(LENGTHS))])
    fetch.close()
    assert not worker.is_alive() and not fetch.enabled and not fetch._inflight
    with pytest.raises(ValueError, match=r"depth \(0\) must be >= 1"):
        BatchPrefetcher(data, torch.device("cpu"), enabled=True, depth=0)
    with pytest.raises(ValueError, match=r"refill_at \(-1\) must be >= 0"):
        BatchPrefetcher(data, torch.device("cpu"), enabled=True, refill_at=-1)
