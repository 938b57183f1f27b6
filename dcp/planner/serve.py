"""A planner in its own process: ``main(fd)`` plans one epoch and streams its StepPlans to file descriptor fd.

The parent (``dcp.planner.ahead.RemotePlans``) starts ``python -P -c ...`` (its own ``dcp`` first on the
path), writes one message, the EpochPlanner's arguments and a ``prepare`` callable or None, to the child's
stdin; the child writes ``("plan", StepPlan)`` per step (``prepare(plan)`` when given: the runtime's per-rank
view of the step, made here rather than on a thread of the training process, whose GIL it would hold), then
``("end", None)``, or ``("error", exception)``, to a pipe of their own (not stdout: a print anywhere, even at
interpreter start, must not corrupt them). A message is an 8-byte
little-endian length and a pickle. A full pipe blocks the child: the parent's reading pace bounds how far it
plans ahead. The child holds its own GIL, so a training loop busy in Python no longer starves the planning
(a thread got ~10% of the GIL there).

A plain subprocess, never multiprocessing: a spawned multiprocessing child re-imports the training script's
main module (and would run an unguarded script again), a forked one inherits CUDA and NCCL state.
"""

from __future__ import annotations

import pickle
import sys
import traceback
from typing import IO, Any

_HEADER = 8


def send(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(data).to_bytes(_HEADER, "little"))
    stream.write(data)
    stream.flush()


_MAX_MESSAGE = 1 << 40
"""A length past this is not one this module wrote: the stream is corrupt."""


def receive(stream: IO[bytes]) -> Any:
    """The next message from a buffered binary stream (whose ``read(n)`` returns n bytes unless the stream
    ends); raises EOFError when the stream ends (between or inside a message), ValueError when its length
    word is not one ``send`` wrote."""
    header = stream.read(_HEADER)
    if len(header) < _HEADER:
        raise EOFError("the stream ended")
    size = int.from_bytes(header, "little")
    if size > _MAX_MESSAGE:
        raise ValueError(f"message length {size} exceeds {_MAX_MESSAGE}: the stream is corrupt")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the stream ended inside a message")
    return pickle.loads(data)


def main(fd: int) -> int:
    import os

    inp, out = sys.stdin.buffer, os.fdopen(fd, "wb")
    try:
        kwargs, prepare = receive(inp)
        from dcp.planner.assemble import EpochPlanner

        for plan in EpochPlanner(**kwargs):
            send(out, ("plan", plan if prepare is None else prepare(plan)))
        send(out, ("end", None))
    except (BrokenPipeError, EOFError):
        return 0  # the parent closed: nothing to report to
    except BaseException as exc:  # the parent re-raises it where the plan would have been returned
        try:
            send(out, ("error", exc))
        except BrokenPipeError:
            return 0
        except Exception:  # an exception that does not pickle: its text
            send(out, ("error", RuntimeError(traceback.format_exc())))
        return 1
    return 0

