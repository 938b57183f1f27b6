"""Peak memory of the engines on 2 gloo ranks against the memory model (``dcp.memory.shape_state_bytes``).

Each engine runs in its own pair of processes: a Transformer-1D whose state dwarfs its activations (short
samples), AdamW, a few DCP steps of two SP-1 groups through ``set_manager``'s loop. A rank's measured figure is
its peak resident set (``VmHWM``, reset after the imports, the process group and the data) minus its resident
set at that point; the prediction is the model's per-rank state (parameters, gradients, optimizer state, and
what each engine holds unsharded through a step) at ``dp_size = 2``. glibc is told to map every allocation over
128 KiB on its own (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set.

    python scripts/state_memory.py [--engines ddp,fsdp2,fsdp2-zero3] [--layers 8] [--hidden 768] [--precision bf16]
                                   [--eq6]

``--eq6`` predicts the whole peak instead: Eq. 6 at r = 0 from a table profiled as ``set_manager`` profiles
(``with_engine_state``: the engine's state in M_C, its weight copies in m_act); the peak restarts after profiling.

Prints one row per engine (measured and predicted MiB per rank, their ratio) and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

ENGINES = ("ddp", "fsdp2", "fsdp2-zero3")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}: this script needs Linux")


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch

    from dcp.api import set_manager
    from dcp.bench.runtime import fixed_step_plan
    from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig, RuntimeConfig
    from dcp.memory import shape_state_bytes
    from dcp.models import T1DConfig, Transformer1D
    from dcp.planner.cost import micro_batch_mem_bytes
    from dcp.planner.table import with_engine_state
    from dcp.profiler.dual_layer import profile_table
    from dcp.runtime.data import SyntheticTokenDataset

    engine, steps, ga, seq_len = spec["engine"], spec["steps"], 2, spec["seq_len"]
    cfg = T1DConfig(name="t1d-state", num_layers=spec["layers"], hidden_size=spec["hidden"], num_heads=8,
                    vocab_size=spec["vocab"])
    data = SyntheticTokenDataset([seq_len] * (2 * steps * ga), vocab_size=cfg.vocab_size)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set to the current one
        f.write("5")
    base_kib = _status_kib("VmRSS")
    model = Transformer1D(cfg)
    config = DCPConfig(model=cfg.shape(), runtime=RuntimeConfig(engine=engine, log_every=steps,
                                                                precision=spec.get("precision", "auto")),
                       profiling=ProfilingConfig(seq_group_edges=(seq_len,), max_micro_batch_size=1,
                                                 cache_dir=spec["cache_dir"]),
                       planning=PlanningConfig(sp_sizes=(1,)), advanced=AdvancedConfig(warmup_iters=1, measure_iters=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=spec["fused"] or None)
    table = None
    if spec.get("eq6"):  # profiled as set_manager profiles; the peak resident set restarts after it
        table = with_engine_state(profile_table(model, config, world_size=world, optimizer=opt, progress=False),
                                  cfg.shape(), engine, world)
        model.zero_grad(set_to_none=True)
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    mgr = set_manager(model, data, config, optimizer=opt, table=table,
                      plans=lambda e: [fixed_step_plan(e, s, (1, 1), ga, seq_len, world) for s in range(steps)])
    run = mgr.engine
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, run)
        loss = run(batch)
        run.backward(loss)
        run.step()
    peak_kib = _status_kib("VmHWM")
    if table is not None:
        predicted = micro_batch_mem_bytes(next(r for r in table.rows if r.feasible and r.micro_batch_size == 1), 0)
    else:
        predicted = shape_state_bytes(cfg.shape(), engine, world, 2 if mgr.precision == "bf16" else None)
    return {"measured_bytes": (peak_kib - base_kib) * 1024, "predicted_bytes": predicted,
            "params": cfg.shape().num_params}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                    help="runtime.precision (bf16: autocast for ddp, fsdp2's bf16 MixedPrecisionPolicy)")
    ap.add_argument("--eq6", action="store_true",
                    help="predict the whole peak (Eq. 6 at r = 0 from a table profiled as set_manager profiles, "
                         "with the engine's state and weight copies) instead of the state alone")
    ap.add_argument("--fused", action="store_true", help="AdamW(fused=True): no foreach temporaries in its step")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        ap.error(f"--engines ({args.engines!r}) names {bad or 'none'}: pick from {', '.join(ENGINES)}")
    for flag in ("layers", "hidden", "vocab", "seq_len", "steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} ({getattr(args, flag)}) must be >= 1")
    if args.hidden % 8:
        ap.error(f"--hidden ({args.hidden}) must be a multiple of the 8 heads")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # inherited by the spawned ranks

    from dcp.distributed.launch import run_distributed

    rows = []
    print(f"{'engine':<12} {'measured MiB':>13} {'predicted MiB':>14} {'ratio':>6}   (per rank, max of 2 ranks)")
    with tempfile.TemporaryDirectory(prefix="dcp-state-memory-") as cache:  # the profiles of --eq6
        for engine in engines:
            spec = {"engine": engine, "layers": args.layers, "hidden": args.hidden, "vocab": args.vocab,
                    "seq_len": args.seq_len, "steps": args.steps, "fused": args.fused, "precision": args.precision,
                    "eq6": args.eq6, "cache_dir": cache}
            out = run_distributed(_worker, 2, spec, timeout_s=900)
            measured = max(o["measured_bytes"] for o in out)
            predicted = out[0]["predicted_bytes"]
            rows.append({"engine": engine, "measured_bytes": measured, "predicted_bytes": predicted,
                         "ratio": measured / predicted, "params": out[0]["params"]})
            print(f"{engine:<12} {measured / 2**20:>13.1f} {predicted / 2**20:>14.1f} {measured / predicted:>6.3f}")
    print(json.dumps({"rows": rows, "layers": args.layers, "hidden": args.hidden, "vocab": args.vocab,
                      "seq_len": args.seq_len, "steps": args.steps, "fused": args.fused, "precision": args.precision,
                      "eq6": args.eq6}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
