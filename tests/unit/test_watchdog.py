"""PeerWatch on an in-process store: a silent peer inside its epoch is lost, a resting one is not, and the news
reaches every rank (dcp.runtime.watchdog)."""

from __future__ import annotations

import json

import torch.distributed as dist

from dcp.runtime.watchdog import PEER_LOST_EXIT, PeerWatch


def _watch(store, rank, ended, timeout_s=0.0):
    return PeerWatch(store, "dcp/phase/", rank, 3, timeout_s, period_s=0.0, end=ended.append)


def test_a_silent_peer_inside_its_epoch_is_lost_and_every_rank_hears_of_it():
    store, ended = dist.HashStore(), []
    store.set("dcp/phase/1", json.dumps({"phase": "micro-batch 1/2 of epoch 0 step 3", "t": 0.0}))
    watcher, other = _watch(store, 0, ended), _watch(store, 2, ended)
    _watch(store, 1, []).beating(True)
    watcher.check()  # the first reading of the peer's counter
    assert ended == []
    watcher.check()  # unchanged past the timeout (0 s)
    assert ended == [PEER_LOST_EXIT]
    news = json.loads(store.get("dcp/phase/lost"))
    assert news["rank"] == 1 and news["seen_by"] == 0 and news["phase"] == "micro-batch 1/2 of epoch 0 step 3"
    other.check()
    assert ended == [PEER_LOST_EXIT, PEER_LOST_EXIT]


def test_a_beating_or_resting_peer_is_not_lost():
    store, ended = dist.HashStore(), []
    watcher = _watch(store, 0, ended)
    peer = _watch(store, 1, [])
    peer.beating(True)
    watcher.check()
    store.add("dcp/phase/beat/1", 1)  # it beat
    watcher.check()
    assert ended == []
    peer.beating(False)  # between epochs (a checkpoint save): silent, not suspected
    watcher.check()
    watcher.check()
    assert ended == [] and not store.check(["dcp/phase/lost"])


def test_a_peer_that_never_started_is_not_suspected_before_the_timeout():
    store, ended = dist.HashStore(), []
    watcher = _watch(store, 0, ended)
    watcher.check()
    watcher.check()
    assert ended == []  # no rest key: it has not entered its epoch yet
    slow = _watch(store, 2, ended, timeout_s=3600.0)
    _watch(store, 0, []).beating(True)
    slow.check()
    slow.check()
    assert ended == []  # inside its epoch but within the timeout
