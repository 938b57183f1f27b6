"""The ``dcp`` command.

Each subcommand lives in the module that owns the work; a module provides
``add_arguments(parser)`` (cheap: no torch import) and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from dcp.argtypes import HelpFormatter

# (command words, owning module, one-line help)
COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("demo",), "dcp.demo", "main job: DCP vs bucket parallel on 2 CPU processes, interleaved repetitions; table + plot"),
    (("plan",), "dcp.planner.cli", "plan an epoch for a length file and print the steps"),
    (("profile",), "dcp.profiler.cli", "run the dual-layer profiler and cache the table"),
    (("simulate",), "dcp.sim.cli", "simulate a cluster on your own sequence lengths"),
    (("figures",), "dcp.figures", "regenerate every paper figure (PNG + CSV)"),
    (("sweep",), "dcp.experiments", "run an experiment sweep (real runs on CPU processes or GPUs; simulated clusters: dcp simulate)"),
    (("parity",), "dcp.integrations.parity", "train a small HF Llama with bucket and DCP-intra: loss vs tokens"),
    (("bench", "planner"), "dcp.bench.planner", "planning time per step for several world sizes"),
    (("bench", "runtime"), "dcp.bench.runtime", "manager overhead per step and SP switch cost"),
    (("bench", "profiler"), "dcp.bench.profiler", "dual-layer prediction error vs measured steps"),
    (("bench", "simulator"), "dcp.bench.sim", "simulator step time vs measured CPU runs"),
    (("bench", "calibration"), "dcp.sim.calibration", "analytic GPU model vs a measured calibration file"),
    (("bench", "loaders"), "dcp.bench.loaders", "padding waste and token balance of the data loaders"),
    (("bench", "gpu"), "dcp.bench.gpu", "one-GPU checks: GPU tests, profile vs steps, padding, syncs, sweeps"),
    (("bench", "padded"), "dcp.bench.padded", "predicted vs measured time of unequal-length micro-batches"),
    (("bench", "tokens"), "dcp.bench.tokens", "micro-batches sized in tokens vs in samples: measured vs predicted"),
    (("bench", "layouts"), "dcp.bench.layouts", "Ulysses vs context layout of SP 2: time and bytes against the cost model"),
    (("bench", "models"), "dcp.bench.models", "forward+backward time of a reference model per sequence length and SP size"),
    (("bench", "peers"), "dcp.bench.peers", "DCP vs Megatron-style dynamic CP and FlexSP on the simulator, dataset x method"),
    (("bench", "scale"), "dcp.bench.scale", "one rank of a 64-4096 rank job under a fake process group: start-up, groups, collectives, host ms"),
)

GROUP_WHAT = {"bench": "benchmark"}
"""What a group's subcommand is called in the one-line error of the group given none (``dcp bench``)."""
GROUP_HELP = {"bench": "benchmarks: each prints one row per measurement and, with --json, a JSON last line "
                       "(dcp bench NAME --help; figures in docs/benchmarks.md)"}


def _env(args: argparse.Namespace) -> int:
    import platform

    from dcp import __version__

    lines = [f"dcp {__version__}", f"python {platform.python_version()} ({sys.executable})"]
    try:
        import torch

        lines.append(f"torch {torch.__version__}")
        cuda = torch.version.cuda or "none"
        lines.append(f"cuda {cuda} (available: {torch.cuda.is_available()})")
        if torch.cuda.is_available():
            lines.append(f"gpu {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}")
            nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "none"
            lines.append(f"nccl {nccl}")
        else:
            lines.append("nccl none (no CUDA)")
        lines.append(f"gloo {torch.distributed.is_gloo_available()}")
    except ImportError:
        lines.append("torch not installed")
    import logging

    for mod in ("deepspeed", "flash_attn", "transformers", "numpy", "pandas", "matplotlib"):
        try:
            # DeepSpeed logs "Setting accelerator to CPU ..." at import on a machine without CUDA: the cuda line
            # above already says so, so warnings raised while importing are silenced here
            logging.disable(logging.WARNING)
            try:
                m = importlib.import_module(mod)
            finally:
                logging.disable(logging.NOTSET)
            lines.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as exc:  # noqa: BLE001 - report any import failure, do not crash `dcp env`
            lines.append(f"{mod} not available ({type(exc).__name__})")
    print("\n".join(lines))
    return 0


def _name_one(prog: str, what: str, choices: argparse._SubParsersAction) -> Callable[[argparse.Namespace], int]:
    """The run of ``prog`` given no subcommand: one line on stderr listing them, exit 2 (argparse's own error,
    'the following arguments are required: sub', named none). The choices are read when it runs, so
    subcommands added after it count."""
    def fail(args: argparse.Namespace) -> int:
        names = ", ".join(choices.choices)
        print(f"{prog}: error: name a {what}: {names} ({prog} NAME --help says what each does)", file=sys.stderr)
        return 2

    return fail


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dcp", description="Data-Centric Parallel training tools",
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command")
    parser.set_defaults(_run=_name_one("dcp", "command", sub))
    env = sub.add_parser("env", help="versions of torch, CUDA, NCCL, DeepSpeed, flash-attn", formatter_class=HelpFormatter)
    env.set_defaults(_run=_env)
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module_name, help_text in COMMANDS:
        if len(words) == 1:
            p = sub.add_parser(words[0], help=help_text, description=help_text, formatter_class=HelpFormatter)
        else:
            if words[0] not in groups:
                text = GROUP_HELP.get(words[0], f"{words[0]} subcommands")
                g = sub.add_parser(words[0], help=text, description=text, formatter_class=HelpFormatter)
                groups[words[0]] = g.add_subparsers(dest="sub")
                g.set_defaults(_run=_name_one(f"dcp {words[0]}", GROUP_WHAT.get(words[0], "subcommand"),
                                              groups[words[0]]))
            p = groups[words[0]].add_parser(words[1], help=help_text, description=help_text,
                                            formatter_class=HelpFormatter)
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ValueError, OSError) as exc:
        # dcp's user errors are ValueErrors (ConfigError, TableError, ...) whose message names the field or
        # file, the rule and the fix: one line and exit 2, like argparse's own errors. DCP_TRACEBACK=1 keeps
        # the traceback (for a bug report).
        if os.environ.get("DCP_TRACEBACK"):
            raise
        words = " ".join(w for w in (args.command, getattr(args, "sub", None)) if w)
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"dcp {words}: error: {message} (set DCP_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
