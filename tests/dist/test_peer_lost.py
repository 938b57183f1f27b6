"""A rank that is stopped (SIGSTOP) or killed while its peers wait in a collective, or compute a long micro-batch,
is named by every survivor, which exits non-zero within advanced.peer_timeout_s plus a few beats, whatever the step's
length and the collective timeout (dcp.runtime.watchdog)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcp.distributed.launch import DistributedFailure, free_port, run_distributed
from dcp.runtime.watchdog import PEER_LOST_EXIT
from tests.dist._peer_lost_job import LONG_S, PEER_TIMEOUT_S, peer_lost_job

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 30.0
"""The reliability target: every survivor has named the lost rank and exited this long after the fault."""


def test_a_stopped_rank_is_named_by_every_survivor_which_exits_non_zero():
    tag = f"dcp-peer-lost-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1",
           "DCP_TEST_TAG": tag}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--master_port", str(free_port()),
           str(ROOT / "tests/dist/_peer_lost_job.py"), "stop"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, fault, named = [], None, {}
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            now = time.monotonic()
            if fault is None and "rank 1 stops itself" in line:
                fault = now
            m = re.search(r"rank (\d): rank 1 is lost", line)
            if m and fault is not None:
                named.setdefault(int(m.group(1)), now - fault)
            if len(named) == 2 or now > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent waiting for the stopped rank
        proc.wait()
        _kill_tagged(tag)  # the stopped rank itself (torchrun starts each worker in a process group of its own)
    text = "".join(lines)
    assert fault is not None, text[-3000:]
    assert set(named) == {0, 2}, text[-3000:]
    assert max(named.values()) < BOUND_S, named
    assert "heartbeat stood still for" in text and "in 'micro-batch 1/1 of epoch 0 step 1'" in text, text[-3000:]
    print(f"survivors named the stopped rank after {named} s")


def _kill_tagged(tag: str) -> None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"DCP_TEST_TAG={tag}".encode() in f.read():
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def test_a_killed_rank_ends_a_peer_inside_a_long_micro_batch():
    t0 = time.monotonic()
    with pytest.raises(DistributedFailure) as info:
        # dead_rank_grace_s beyond the bound: only the peer watch can end rank 0, asleep in its micro-batch
        run_distributed(peer_lost_job, 3, "kill", timeout_s=LONG_S, dead_rank_grace_s=LONG_S)
    took = time.monotonic() - t0
    text = str(info.value)
    assert f"rank 0 exited with code {PEER_LOST_EXIT}" in text or "rank 0 of 3 failed" in text, text[-3000:]
    assert "rank 1" in text, text[-3000:]
    assert took < BOUND_S + 60.0 + PEER_TIMEOUT_S, took  # start-up on a loaded host included; the step is 300 s
