"""Run a function on N local processes joined by a process group: the multi-process launcher of ``dcp demo``,
``dcp parity``, the local sweeps, the benchmarks and the multi-process tests (gloo on CPU by default).

``run_distributed(fn, world_size, *args)`` spawns N processes, each initialises ``torch.distributed`` with
a free TCP port, calls ``fn(rank, world_size, *args)`` and sends its return value back. The parent
returns the list of results in rank order, or raises ``DistributedFailure`` carrying the failing
child's traceback. Children that hang are killed after ``timeout_s``; the process group is always torn
down.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any


class DistributedFailure(RuntimeError):
    """A child process raised, died or timed out; the message holds its traceback."""

    def summary(self) -> str:
        """One line for a command's user: the failing rank's exception (its traceback's last line, without
        the module path) and the ranks that exited without reporting; the full text stays in str(self)."""
        lines = [ln.strip() for ln in str(self).splitlines() if ln.strip()]
        dead = [ln for ln in lines if ln.endswith("without reporting")]
        failed = next((ln for ln in lines if " failed:" in ln and ln.startswith("rank ")), "")
        last = lines[-1] if lines else ""
        if failed and last != failed and not last.endswith("without reporting"):
            kind, sep, message = last.partition(": ")
            last = f"{failed} {kind.rpartition('.')[2]}{sep}{message}"
        return "; ".join([last, *[d for d in dead if d != last]])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple,
    results: Any,
    backend: str,
    env: dict[str, str],
    pg_timeout_s: float,
) -> None:
    if backend == "gloo":
        # CPU processes: DeepSpeed must take its CPU accelerator even on a host with GPUs (it picks one at
        # import and would otherwise place rank r's model on cuda:r). An explicit env entry wins.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    import torch
    import torch.distributed as dist

    # Two processes on two cores: one intra-op thread each keeps them from fighting over cores.
    torch.set_num_threads(int(env.get("DCP_TEST_THREADS", "1")))
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout_s)
        )
        out = fn(rank, world_size, *args)
        results.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent with its traceback
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - teardown after a failed collective may itself fail
                pass


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 180.0,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
    pg_timeout_s: float = 60.0,
    dead_rank_grace_s: float = 30.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; return results by rank.

    ``fn`` and ``args`` must be picklable (a module-level function). Raises DistributedFailure with the
    first failing rank's traceback, or with a timeout message naming the ranks that did not finish.
    ``dead_rank_grace_s``: once a rank died without reporting (a signal, ``os._exit``), how long the others get
    to report before they are stopped. A survivor's gloo collective fails at once on the closed connection and
    reports where the dead rank was; one waiting on the store for it (a group's creation, a rendezvous) would
    otherwise wait the whole collective timeout.
    """
    if world_size < 1:
        raise ValueError(f"world_size ({world_size}) must be >= 1: pass the number of processes to start")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, rank, world_size, port, args, results, backend, dict(env or {}), pg_timeout_s),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: dict[int, str] = {}
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while len(out) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, status, payload = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if not p.is_alive() and i not in out and i not in errors]
                # a child that died without reporting (segfault, os._exit) is an error too
                for i in dead:
                    try:
                        rank, status, payload = results.get(timeout=0.5)
                    except queue.Empty:
                        errors[i] = f"rank {i} exited with code {procs[i].exitcode} without reporting"
                        deadline = min(deadline, time.monotonic() + dead_rank_grace_s)
                        continue
                    (out if status == "ok" else errors)[rank] = payload
                continue
            if status == "ok":
                out[rank] = payload
            else:
                errors[rank] = payload
                # one failure usually leaves the others blocked in a collective: stop waiting for them
                break
    finally:
        for p in procs:
            p.join(timeout=0.5 if errors else 5.0)
        # ranks that died on their own (os._exit, a signal) before the survivors were killed below
        died = {i: p.exitcode for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out}
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        results.close()
    if errors:
        rank = min(errors)
        dead = "".join(f"rank {i} exited with code {code} without reporting\n"
                       for i, code in sorted(died.items()) if i != rank)
        raise DistributedFailure(f"{dead}rank {rank} of {world_size} failed:\n{errors[rank]}")
    missing = [r for r in range(world_size) if r not in out]
    if missing:
        raise DistributedFailure(f"ranks {missing} of {world_size} did not finish within {timeout_s} s")
    return [out[r] for r in range(world_size)]
