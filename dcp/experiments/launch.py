"""Launchers: the same sweep on spawned CPU processes (local) or on torchrun ranks (GPU nodes).

- local: runs are grouped by (world size, model); each group runs on W freshly spawned gloo processes
  (``dcp.distributed.launch.run_distributed``), so the profile of a (model, W) is measured once and every method
  and dataset of the group reuses it. Results are written after every group.
- torchrun, inside torchrun (RANK is set): this process is one rank; the runs whose world size equals
  the job's run here, rank 0 writes the results. Multi-node jobs start this way (experiments/slurm).
- torchrun, outside torchrun: for every world size that fits on this node, start
  ``torchrun --standalone --nproc-per-node W -m dcp.cli sweep ... --launcher torchrun``; larger world
  sizes need one torchrun per node, and the command to use is printed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from itertools import groupby
from typing import Any

from dcp.experiments.results import RUNS_CSV, git_sha, is_results_folder, launch_stamp, read_runs
from dcp.experiments.runner import GroupInfo, run_group
from dcp.experiments.sweep import RunSpec, SweepSpec
from dcp.files import claim_dir, read_marker, write_marker


def launch(spec: SweepSpec, *, spec_path: str, nproc_per_node: int = 0, cli_overrides: dict | None = None) -> int:
    if spec.launcher == "local":
        launch_local(spec)
        return 0
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return torchrun_worker(spec)
    return start_torchrun(spec, spec_path, nproc_per_node, cli_overrides or {})


def run_groups(spec: SweepSpec, runs: list[RunSpec] | None = None) -> list[list[RunSpec]]:
    """Runs (default: ``spec.expand()``) grouped by (world size, model), in sweep order; one process group
    serves each."""
    runs = spec.expand() if runs is None else runs
    return [list(g) for _, g in groupby(runs, key=lambda r: (r.world_size, r.model))]


def claim_output(spec: SweepSpec) -> dict[str, Any]:
    """Claim the sweep's results folder before any work (dcp.files.claim_dir: new, empty, dcp's, or a results
    folder of an older dcp; writable); returns its marker (with the last launch's state, if any)."""
    return claim_dir(spec.output_dir, flag="--out (sweep.out_dir)", command="dcp sweep", adopt=is_results_folder)


def _launch(spec: SweepSpec, marker: dict[str, Any], runs: list[RunSpec], quiet: bool) -> tuple[str, set[int]]:
    """(run-id stamp, indices of finished runs): an unfinished earlier launch of the same runs resumes after
    its finished runs (their rows are in runs.csv); anything else starts a new launch."""
    hashes = [r.config_hash() for r in runs]
    last = marker.get("launch") or {}
    stamp, done = launch_stamp(), set()
    if isinstance(last, dict) and last.get("complete") is False and last.get("hashes") == hashes:
        stamp = str(last.get("stamp"))
        if (spec.output_dir / RUNS_CSV).exists():
            ids = [r["run_id"] for r in read_runs(spec.output_dir)]
            done = {int(i.rpartition("-")[2]) for i in ids if i.startswith(stamp + "-")}
        if not quiet:
            print(f"resuming the unfinished sweep launch {stamp}: {len(done)} of {len(runs)} runs are already in "
                  f"{spec.output_dir} (pass a new --out to start over)", flush=True)
    elif (spec.output_dir / RUNS_CSV).exists():
        # run ids are "<stamp>-<index>" and the results keep one row per id: a launch started within the
        # second of an earlier one takes a stamp of its own
        used = {str(r["run_id"]).rpartition("-")[0] for r in read_runs(spec.output_dir)}
        base, k = stamp, 1
        while stamp in used:
            k += 1
            stamp = f"{base}.{k}"
        if not quiet:
            print(f"{spec.output_dir / RUNS_CSV} holds {len(read_runs(spec.output_dir))} rows of earlier launches: this one "
                  f"appends its {len(runs)} runs, and the table and plot show each run's newest row (pass a new --out "
                  "to keep them apart)", flush=True)
    write_marker(spec.output_dir, {**marker, "launch": {"stamp": stamp, "hashes": hashes, "complete": False}})
    return stamp, done


def launch_local(spec: SweepSpec, *, timeout_s: float = 3600.0, quiet: bool = False) -> list[dict[str, Any]]:
    """Run the whole sweep on spawned local processes; returns the outcomes (rows) of the runs it ran.

    Rank 0 appends each run's rows to the results folder as soon as the run ends; a sweep that was stopped
    (a killed rank, Ctrl-C) resumes after its last finished run when the same sweep is started again."""
    from dcp.distributed.launch import run_distributed

    runs = spec.expand()
    marker = claim_output(spec)
    stamp, finished = _launch(spec, marker, runs, quiet)
    info_base = dict(git_sha=git_sha(), stamp=stamp, total=len(runs), out_dir=str(spec.output_dir))
    cores = os.cpu_count() or 1
    done = len(finished)
    all_outcomes: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    index = {id(r): i for i, r in enumerate(runs)}
    for group in run_groups(spec, runs):
        group = [r for r in group if index[id(r)] not in finished]
        if not group:
            continue
        w = group[0].world_size
        if w * spec.threads_per_rank > cores and not quiet:
            print(f"note: W={w} x {spec.threads_per_rank} thread(s) > {cores} cores: ranks share cores, so measured "
                  "times include waiting for a core and idle ratios are blurred", flush=True)
        if not quiet:
            print(f"== {group[0].model}, W={w}: {len(group)} runs (profiling first if not cached)", flush=True)
        info = GroupInfo(first_index=done, indices=tuple(index[id(r)] for r in group), **info_base)
        results = run_distributed(
            run_group, w, group, info, timeout_s=timeout_s, pg_timeout_s=spec.config.runtime.collective_timeout_s,
            backend=spec.backend,
            env={"DCP_TEST_THREADS": str(spec.threads_per_rank), "OMP_NUM_THREADS": str(spec.threads_per_rank)},
        )
        all_outcomes.extend(results[0])  # rank 0 has written them, run by run
        done += len(group)
    write_marker(spec.output_dir, {**read_marker(spec.output_dir), "launch": {
        "stamp": stamp, "hashes": [r.config_hash() for r in runs], "complete": True}})
    if not quiet:
        print(f"{done} runs in {time.perf_counter() - t_start:.0f}s; results in {spec.output_dir}", flush=True)
    return all_outcomes


def torchrun_worker(spec: SweepSpec) -> int:
    """This process is one torchrun rank: run the sweep's runs whose world size is the job's."""
    import torch.distributed as dist

    if spec.device == "cuda":
        import torch

        # bind this rank's GPU before NCCL initialises, so its communicator lives on the right device
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        from datetime import timedelta

        dist.init_process_group(spec.backend, timeout=timedelta(seconds=spec.config.runtime.collective_timeout_s))
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = [r for r in spec.expand() if r.world_size == world]
    if not mine:
        if rank == 0:
            print(f"no run of the sweep has world size {world} (sweep.world_sizes = {list(spec.world_sizes)}): "
                  "start torchrun with one of those world sizes", flush=True)
        dist.destroy_process_group()
        return 2
    # run ids and the git sha matter on rank 0 only: it alone writes the result files, run by run
    if rank == 0:
        claim_output(spec)
    info_base = dict(git_sha=git_sha() if rank == 0 else "", stamp=launch_stamp(), total=len(mine),
                     out_dir=str(spec.output_dir) if rank == 0 else "")
    done = 0
    for _, group in groupby(mine, key=lambda r: r.model):
        group = list(group)
        run_group(rank, world, group, GroupInfo(first_index=done, **info_base))
        done += len(group)
    if rank == 0:
        print(f"{done} runs; results in {spec.output_dir}", flush=True)
    dist.destroy_process_group()
    return 0


def _flag_args(overrides: dict) -> list[str]:
    names = {"out_dir": "--out", "steps": "--steps", "warmup_steps": "--warmup-steps", "models": "--models",
             "datasets": "--datasets", "methods": "--methods"}
    out = ["--refresh-profile"] if overrides.get("refresh_profile") else []
    for key, flag in names.items():
        if key in overrides:
            v = overrides[key]
            out += [flag, ",".join(map(str, v)) if isinstance(v, list | tuple) else str(v)]
    return out


def torchrun_command(spec_path: str, world_size: int, nproc_per_node: int, overrides: dict, *,
                     multi_node: bool) -> list[str]:
    """The torchrun command line of one world size (single node: --standalone; multi-node: c10d rendezvous)."""
    cmd = ["torchrun"]
    if multi_node:
        nnodes = -(-world_size // nproc_per_node)
        cmd += [f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
                "--rdzv-endpoint=$HEAD_NODE:29500", "--rdzv-id=$JOB_ID"]
    else:
        cmd += ["--standalone", f"--nproc-per-node={world_size}"]
    cmd += ["-m", "dcp.cli", "sweep", spec_path, "--launcher", "torchrun", "--world-sizes", str(world_size)]
    return cmd + _flag_args(overrides)


def start_torchrun(spec: SweepSpec, spec_path: str, nproc_per_node: int, overrides: dict) -> int:
    """Outside torchrun: start one single-node torchrun per world size that fits; print the rest."""
    if not nproc_per_node:
        try:
            import torch

            nproc_per_node = torch.cuda.device_count() if spec.device == "cuda" else (os.cpu_count() or 1)
        except ImportError:
            nproc_per_node = 1
    rc = 0
    for w in spec.world_sizes:
        if w <= nproc_per_node:
            cmd = torchrun_command(spec_path, w, nproc_per_node, overrides, multi_node=False)
            print("+ " + shlex.join(cmd), flush=True)
            # torchrun of this interpreter (the same environment as this dcp), not whatever is on PATH
            cmd = [sys.executable, "-m", "torch.distributed.run", *cmd[1:]]
            rc = max(rc, subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode)
        else:
            cmd = torchrun_command(spec_path, w, nproc_per_node, overrides, multi_node=True)
            print(f"W={w} needs {-(-w // nproc_per_node)} nodes of {nproc_per_node} ranks: run on every node\n  "
                  + " ".join(cmd) + "\nor submit experiments/slurm/sweep.sbatch (see experiments/README.md)",
                  file=sys.stderr, flush=True)
            rc = max(rc, 3)
    return rc
