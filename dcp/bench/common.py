"""What several ``dcp bench`` modules share: their common flags, the check of count flags, one timed
forward + backward step, round-robin timing and the stand-alone ``main``.

Not a benchmark itself (``dcp bench`` registers none from here). No torch at import: ``dcp bench loaders``
must import without it.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

JSON_SUMMARY_HELP = "print a JSON summary as the last line"
CLOCKS = {"cpu": "process CPU time (robust on a shared machine)", "wall": "perf_counter"}


def add_json(parser: argparse.ArgumentParser, help: str = JSON_SUMMARY_HELP) -> None:
    """``--json``: a JSON object as the last line of the output."""
    parser.add_argument("--json", action="store_true", help=help)


def add_seed(parser: argparse.ArgumentParser, of: str) -> None:
    """``--seed`` (default 0), its help naming what it seeds: ``of="the documents"``."""
    parser.add_argument("--seed", type=int, default=0, help=f"seed of {of}")


def add_model_size(parser: argparse.ArgumentParser, of: str = "") -> None:
    """``--hidden-size`` (128) and ``--num-layers`` (4) of a tiny reference model widened so that layer work
    dominates Python overhead; ``of`` ends both help lines (e.g. " of the benchmarked models")."""
    parser.add_argument("--hidden-size", type=int, default=128, help=f"model width{of}")
    parser.add_argument("--num-layers", type=int, default=4, help=f"layers L{of}")


def add_clock(parser: argparse.ArgumentParser, default: str) -> None:
    """``--clock cpu|wall``, the default listed first."""
    order = sorted(CLOCKS, key=lambda c: c != default)
    parser.add_argument("--clock", default=default, choices=tuple(order),
                        help="; ".join(f"{c}: {CLOCKS[c]}" for c in order))


def add_cpu_model(parser: argparse.ArgumentParser) -> None:
    """The one-process CPU benches' model and timer: ``--hidden-size``, ``--num-layers``, ``--threads`` and
    ``--clock`` (cpu by default: other processes on the cores do not inflate it)."""
    add_model_size(parser)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    add_clock(parser, "cpu")


def add_profile_grid(parser: argparse.ArgumentParser, *, edges: str, batch_sizes: str, sizes_note: str = "") -> None:
    """``--edges`` (seq_group bounds) and ``--batch-sizes`` of the profile table a bench measures."""
    parser.add_argument("--edges", default=edges, help="seq_group bounds (tokens), increasing")
    parser.add_argument("--batch-sizes", default=batch_sizes, help=f"micro-batch sizes profiled{sizes_note}")


def add_rounds(parser: argparse.ArgumentParser) -> None:
    """``--reps`` (5): round-robin rounds of :func:`round_robin`."""
    parser.add_argument("--reps", type=int, default=5, help="round-robin rounds (medians are compared)")


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """ValueError naming the first flag among ``names`` (attribute names) whose value is < 1."""
    for name in names:
        value = getattr(args, name)
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} ({value}) must be >= 1")


def step_s(model: Any, batch: Any, ctx: Any, clock: str) -> float:
    """Seconds of one forward + backward of ``model`` on ``batch`` (``clock`` "cpu": process CPU time, else
    perf_counter); the gradients are dropped after it."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    start = now()
    loss, _ = model(batch, ctx)
    loss.backward()
    elapsed = now() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def round_robin(keys: Sequence[Hashable], measure: Callable[[Any], Any], reps: int, rng: random.Random,
                bar: Any = None) -> dict[Any, list]:
    """Each key's ``reps`` measurements: one warm-up call per key (allocator, kernels, first touch), then
    ``reps`` rounds over all keys in a shuffled order each, so a slow phase of a shared machine hits every key
    alike (compare medians). ``bar``: a progress bar updated once a measurement."""
    for k in keys:
        measure(k)
    got: dict[Any, list] = {k: [] for k in keys}
    for _ in range(reps):
        for k in rng.sample(list(keys), len(keys)):
            got[k].append(measure(k))
            if bar is not None:
                bar.update()
    return got


def standalone_main(prog: str, doc: str, add_arguments: Callable, run: Callable, argv: list[str] | None) -> int:
    """``python -m dcp.bench.<name>``: the bench's flags (described by the first paragraph of its docstring)
    parsed from ``argv``, then run."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
