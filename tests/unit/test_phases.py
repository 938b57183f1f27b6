"""PhaseBoard: a failed collective names the ranks that are elsewhere (unit level, on a HashStore)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from dcp.runtime.phases import CollectiveError, PhaseBoard


def boards(world: int) -> list[PhaseBoard]:
    store = dist.HashStore()
    return [PhaseBoard(store, r, world) for r in range(world)]


def fail_in(board: PhaseBoard, phase: str) -> str:
    with pytest.raises(CollectiveError) as info, board.collective(phase, timeout_s=3.0):
        raise RuntimeError("Timed out waiting 3000ms for recv operation to complete")
    assert isinstance(info.value.__cause__, RuntimeError)
    return str(info.value)


def test_the_rank_in_another_phase_is_named():
    b0, b1, b2 = boards(3)
    b1.enter("micro-batch 2/3 of epoch 0 step 4")
    b2.enter("gradient sync of epoch 0 step 4")
    msg = fail_in(b0, "gradient sync of epoch 0 step 4")
    assert msg.startswith("rank 0: gradient sync of epoch 0 step 4 failed after")
    assert "(timeout 3 s)" in msg and "Timed out waiting" in msg
    assert "rank 1 is in 'micro-batch 2/3 of epoch 0 step 4'" in msg and "rank 1 stalled or died there" in msg
    assert "rank 2" not in msg  # it is in the same phase


def test_a_rank_that_never_reported_and_a_note():
    b0, b1 = boards(2)
    msg = fail_in(b0, "the plan check of epoch 0")
    assert "rank 1 never reported a phase" in msg
    b1.note = "after leaving get_data_iter() early at epoch 0 step 2"
    b1.enter("outside get_data_iter()")
    msg = fail_in(b0, "gradient sync of epoch 0 step 3")
    assert "rank 1 is in 'outside get_data_iter() (after leaving get_data_iter() early at epoch 0 step 2)'" in msg


def test_every_rank_in_the_same_phase_blames_the_collective():
    b0, b1 = boards(2)
    b1.enter("gradient sync of epoch 0 step 0")
    assert "every rank reported this phase" in fail_in(b0, "gradient sync of epoch 0 step 0")


def test_a_store_that_is_gone_is_reported_and_never_fails_a_step():
    class Gone:
        def set(self, *_):
            raise RuntimeError("connection refused")

        def check(self, *_):
            raise RuntimeError("connection refused")

    board = PhaseBoard(Gone(), 0, 2)
    board.enter("micro-batch 1/1 of epoch 0 step 0")  # does not raise
    assert "rank 1's phase is unknown (the rendezvous store did not answer)" in fail_in(board, "gradient sync")
    with board.collective("gradient sync"):
        pass  # no failure: nothing raised


def test_registry_timeout_must_be_finite():
    from dcp.runtime.registry import SPGroupRegistry

    with pytest.raises(ValueError, match=r"timeout_s \(nan\) must be a finite number"):
        SPGroupRegistry(1, 8, [1], timeout_s=float("nan"))
    assert SPGroupRegistry(1, 8, [1], timeout_s=5.0).timeout_s == 5.0


def test_busy_and_idle_ranks_report_the_same_gradient_sync_phase():
    # a failed sync names the ranks in ANOTHER phase: an idle rank must not read as elsewhere
    import contextlib
    from types import SimpleNamespace

    import torch

    from dcp.runtime.engines import DDPEngine

    model = torch.nn.Linear(2, 2)
    eng = DDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    phases: list[str] = []

    @contextlib.contextmanager
    def collective(what, timeout_s=None):
        phases.append(what)
        yield

    watch = SimpleNamespace(start=lambda: 0, stop=lambda token: 0.0)
    # the engine drives its manager only through the public EngineHooks (dcp.runtime.hooks)
    eng.attach(SimpleNamespace(collective=collective, at_boundary=lambda: True, watch=lambda: watch,
                               step_done=lambda busy: None, finite_step=lambda grads: True))
    eng.idle_step()
    model(torch.ones(1, 2)).sum().backward()
    assert eng.step()
    assert phases == ["gradient sync", "gradient sync"] and eng.optimizer_steps == 2


def test_registry_for_config_takes_the_configs_node_size_and_collective_timeout():
    from dcp.config import DCPConfig, PlanningConfig, RuntimeConfig
    from dcp.runtime.registry import SPGroupRegistry

    cfg = DCPConfig(planning=PlanningConfig(ranks_per_node=1), runtime=RuntimeConfig(collective_timeout_s=7.0))
    reg = SPGroupRegistry.for_config(cfg, 1, [1])
    assert (reg.world_size, reg.ranks_per_node, reg.sp_sizes, reg.timeout_s) == (1, 1, (1,), 7.0)


def test_a_rank_whose_heartbeat_stopped_is_named_even_in_the_same_phase():
    b0, b1, b2 = boards(3)
    phase = "profiling seq_group 0 (s=128) b=1 p=2"
    for b in (b1, b2):
        b.enter(phase)
    with b1.heartbeat(period_s=0.05):
        pass  # rank 1 beat, then stopped (killed): its counter stands still
    with b0.heartbeat(period_s=0.05), b2.heartbeat(period_s=0.05):
        msg = fail_in(b0, phase)
    assert "rank 1 is in 'profiling seq_group 0 (s=128) b=1 p=2'" in msg and "heartbeat stopped" in msg
    assert "it died or was stopped there" in msg and "rank 2" not in msg  # rank 2 still beats
    assert b0.beat_period_s == 0.0  # the heartbeat ends with its block


def test_is_comm_failure_tells_the_backend_from_the_computation():
    from dcp.runtime.phases import is_comm_failure

    assert is_comm_failure(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert not is_comm_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"))


def test_an_unpublished_phase_is_written_by_the_next_heartbeat_beat():
    # later micro-batches of a step are recorded locally (no store write each) and written by the heartbeat
    import time

    b0, b1 = boards(2)
    b1.enter("micro-batch 1/3 of epoch 0 step 4")
    b1.enter("micro-batch 2/3 of epoch 0 step 4", publish=False)
    assert b1.phase == "micro-batch 2/3 of epoch 0 step 4"
    assert b0.others()[1][0] == "micro-batch 1/3 of epoch 0 step 4"  # not written yet
    with b1.heartbeat(period_s=0.05):
        deadline = time.monotonic() + 30.0
        while b0.others()[1][0] != "micro-batch 2/3 of epoch 0 step 4" and time.monotonic() < deadline:
            time.sleep(0.01)
    assert b0.others()[1][0] == "micro-batch 2/3 of epoch 0 step 4"
    msg = fail_in(b0, "gradient sync of epoch 0 step 4")
    assert "rank 1 is in 'micro-batch 2/3 of epoch 0 step 4'" in msg


class _ThreadNotingStore:
    """A HashStore that notes which thread wrote each key."""

    def __init__(self) -> None:
        self.inner, self.writers = dist.HashStore(), []

    def set(self, key, value):
        import threading

        self.writers.append((key, threading.current_thread().name))
        self.inner.set(key, value)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_published_phase_is_written_on_the_calling_thread_and_the_last_one_is_not_lost():
    # a step's first micro-batch and a collective: written by the calling thread before the work runs (a rank
    # that dies the moment it enters one is named there); a micro-batch entered unpublished is written by the
    # heartbeat, and one entered as the heartbeat stops is written on its way out
    import threading

    store = _ThreadNotingStore()
    b0, b1 = PhaseBoard(store, 0, 2), PhaseBoard(store, 1, 2)
    with b1.heartbeat(period_s=60.0):
        b1.enter("micro-batch 1/2 of epoch 0 step 7")
        assert store.writers[-1] == ("dcp/phase/1", threading.current_thread().name)
        assert b0.others()[1][0] == "micro-batch 1/2 of epoch 0 step 7"
        with b1.collective("gradient sync of epoch 0 step 7"):  # written before it runs, by this thread
            assert store.writers[-1] == ("dcp/phase/1", threading.current_thread().name)
        b1.enter("micro-batch 2/2 of epoch 0 step 7", publish=False)
    assert b0.others()[1][0] == "micro-batch 2/2 of epoch 0 step 7"
    b1.enter("outside get_data_iter()")
    assert store.writers[-1] == ("dcp/phase/1", threading.current_thread().name)
    assert b0.others()[1][0] == "outside get_data_iter()"


def test_a_followed_phase_is_read_when_needed_and_written_by_the_heartbeat():
    # the step loop's micro-batches: the board follows the step (formatted when read), written now once and
    # then by the heartbeat's beats; enter() ends the following
    import threading
    import time

    store = _ThreadNotingStore()
    b0, b1 = PhaseBoard(store, 0, 2), PhaseBoard(store, 1, 2)
    current = {"i": 1}
    reads = []

    def phase_of():
        reads.append(threading.current_thread().name)
        return f"micro-batch {current['i']}/3 of epoch 0 step 4", 100.0 + current["i"]

    b1.follow(phase_of)
    assert store.writers[-1] == ("dcp/phase/1", threading.current_thread().name)  # the first: written now
    assert b0.others()[1][0] == "micro-batch 1/3 of epoch 0 step 4"
    writes = len(store.writers)
    current["i"] = 2  # the loop moves on: nothing is written or formatted for it
    assert len(store.writers) == writes and b1.phase == "micro-batch 2/3 of epoch 0 step 4"
    b1.note = "late"
    assert b1.phase == "micro-batch 2/3 of epoch 0 step 4 (late)"
    b1.note = ""
    with b1.heartbeat(period_s=0.05):
        deadline = time.monotonic() + 30.0
        while b0.others()[1][0] != "micro-batch 2/3 of epoch 0 step 4" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any(name.startswith("dcp-heartbeat") for name in reads)  # read on the heartbeat's thread
        writes, beats = len(store.writers), len(reads)
        while len(reads) < beats + 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(store.writers) == writes  # a phase that did not change is not written again at each beat
        current["i"] = 3
    assert b0.others()[1][0] == "micro-batch 3/3 of epoch 0 step 4"  # the last one is written as the beat stops
    msg = fail_in(b0, "gradient sync of epoch 0 step 4")
    assert "rank 1 is in 'micro-batch 3/3 of epoch 0 step 4'" in msg
    b1.enter("gradient sync of epoch 0 step 4")  # no longer following
    current["i"] = 1
    assert b1.phase == "gradient sync of epoch 0 step 4"
