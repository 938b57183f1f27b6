"""``dcp bench gpu --only engines``: each engine's measured peak memory against the planner's memory model.

Per engine (ddp, fsdp2, fsdp2-zero3; deepspeed when installed) one process at W = 1 (NCCL on CUDA, gloo on
the hidden CPU path) does what a job does: it profiles the model as ``set_manager`` would (``profile_table``
on the whole model with its optimizer: the row of the case's micro-batch, whose M_C holds the state this
engine keeps, ``dcp.planner.table.engine_state_bytes``), then runs ``STEPS`` steps of ``GA`` such micro-batches
through the manager with AdamW.

- measured: the allocator's peak over the steps (``torch.cuda.max_memory_allocated``, reset after profiling)
  above its level before the model was built;
- predicted: Eq. 6 at r = 0 from that row (``micro_batch_mem_bytes``), the planner's memory check. Beside it,
  the same plus fsdp2's transient reduce-scatter staging (``dcp.memory.staging_bytes``), which the config check
  counts and the planner's M_C leaves out: FSDP2 allocates it in the last backward, after the activations it
  could have met are freed (measured on an H200: the peak did not hold it).

On CPU the allocator has no peak counter; the hidden ``--device cpu`` path reports the prediction only.
"""

from __future__ import annotations

from typing import Any

ENGINES = ("ddp", "fsdp2", "fsdp2-zero3")
STEPS, GA = 3, 2
CASE = ("t1d-5b", 4, 2048)
"""(model, layers, tokens of the one-sample micro-batch): a state of ~1.3 B parameters (about 20 GiB under
AdamW) beside a micro-batch's activations."""
TINY_CASE = ("t1d-tiny", 2, 64)


def _worker(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    import logging

    import torch

    from dcp.api import set_manager
    from dcp.bench.runtime import fixed_step_plan
    from dcp.config import AdvancedConfig, DCPConfig, PlanningConfig, ProfilingConfig, RuntimeConfig
    from dcp.memory import staging_bytes
    from dcp.models import build_model
    from dcp.planner.cost import micro_batch_mem_bytes
    from dcp.planner.table import with_engine_state
    from dcp.profiler.dual_layer import profile_table
    from dcp.runtime.data import SyntheticTokenDataset

    logging.getLogger("dcp").setLevel(logging.WARNING)
    name, layers, seq_len = spec["case"]
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
    model = build_model(name, num_layers=layers).to(device)
    shape = model.config.shape()
    config = DCPConfig(model=shape,
                       profiling=ProfilingConfig(seq_group_edges=(seq_len,), max_micro_batch_size=1,
                                                 cache_dir=spec["cache_dir"]),
                       planning=PlanningConfig(sp_sizes=(1,), mem_capacity_gib=spec["capacity_gib"]),
                       runtime=RuntimeConfig(engine=spec["engine"], log_every=STEPS),
                       advanced=AdvancedConfig(warmup_iters=1, measure_iters=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda or None)
    # as set_manager takes it: M_C with this engine's state, m_act with the weight copies it makes
    table = with_engine_state(profile_table(model, config, world_size=world, optimizer=opt, progress=False),
                              shape, spec["engine"], world)
    row = next(r for r in table.rows if r.feasible and r.sp_size == 1 and r.micro_batch_size == 1)
    predicted = micro_batch_mem_bytes(row, 0)
    data = SyntheticTokenDataset([seq_len] * (2 * STEPS * GA), vocab_size=shape.vocab_size)
    model.zero_grad(set_to_none=True)
    mgr = set_manager(model, data, config, optimizer=opt, table=table,
                      plans=lambda e: [fixed_step_plan(e, s, (1,), GA, seq_len, world) for s in range(STEPS)])
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    run = mgr.engine
    for batch in mgr.get_data_iter():
        mgr.optimize_dynamics(batch, run)
        loss = run(batch)
        run.backward(loss)
        run.step()
    measured = None
    if cuda:
        torch.cuda.synchronize(device)
        measured = float(torch.cuda.max_memory_allocated(device) - base)
    return {"engine": spec["engine"], "params": shape.num_params, "seq_len": seq_len,
            "state_bytes": float(table.meta.extra.get("state_bytes", 0.0)), "predicted_bytes": float(predicted),
            "with_staging_bytes": float(predicted + staging_bytes(shape, spec["engine"])), "measured_bytes": measured}


def installed_engines() -> list[str]:
    """The engines ``dcp bench gpu``'s manager sweeps run: ddp and fsdp2, and deepspeed where it imports."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return ["ddp", "fsdp2"]
    return ["ddp", "fsdp2", "deepspeed"]


def installed(engines: tuple[str, ...] = ENGINES) -> list[str]:
    """``engines``, and those of the manager sweeps besides them (deepspeed where it imports)."""
    return [*engines, *(e for e in installed_engines() if e not in engines)]


def run_engines(device: Any, tiny: bool, cache_dir: str) -> list[dict]:
    """One row per installed engine (see the module docstring); an engine that fails gives its error line."""
    from dcp.distributed.launch import run_distributed

    cuda = getattr(device, "type", str(device)) == "cuda"
    rows = []
    for engine in installed():
        spec = {"engine": engine, "case": TINY_CASE if tiny else CASE, "device": "cuda" if cuda else "cpu",
                "capacity_gib": 120.0 if cuda else 4.0, "cache_dir": cache_dir}
        try:
            out = run_distributed(_worker, 1, spec, timeout_s=600.0, backend="nccl" if cuda else "gloo")[0]
        except Exception as exc:  # noqa: BLE001 - a failed engine is a result of the check, reported with its cause
            rows.append({"engine": engine, "error": str(exc).strip().splitlines()[-1][:300]})
            continue
        m, p = out["measured_bytes"], out["predicted_bytes"]
        out["err_pct"] = None if m is None else abs(p - m) / m * 100.0
        out["with_staging_err_pct"] = None if m is None else abs(out["with_staging_bytes"] - m) / m * 100.0
        rows.append(out)
    return rows


def print_engines(rows: list[dict]) -> None:
    print(f"{'engine':<12} {'state MiB':>10} {'predicted MiB':>14} {'measured MiB':>13} {'err %':>6} "
          f"{'+ staging MiB':>14} {'err %':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['engine']:<12} failed: {r['error']}")
            continue
        meas = "-" if r["measured_bytes"] is None else f"{r['measured_bytes'] / 2**20:.1f}"
        err, err_s = ("-" if r[k] is None else f"{r[k]:.2f}" for k in ("err_pct", "with_staging_err_pct"))
        print(f"{r['engine']:<12} {r['state_bytes'] / 2**20:>10.1f} {r['predicted_bytes'] / 2**20:>14.1f} "
              f"{meas:>13} {err:>6} {r['with_staging_bytes'] / 2**20:>14.1f} {err_s:>6}")
