"""``dcp bench scale``: the host-side cost of one rank of a W-rank DCP job, measured under a fake process group.

For each world size W and each chosen rank (default 0, W/2, W-1), one subprocess initialises PyTorch's
fake process group (backend ``fake``, as torchtitan's dry runs do: collectives return at once and move no
data) as rank ``rank`` of W, and runs the real training loop of that rank:
``set_manager`` -> ``get_data_iter`` -> ``optimize_dynamics`` -> forward / backward / ``engine.step()``.
The planner gets the simulator's analytic table for the paper's Transformer-1D 5B on H200 (``dcp.sim``)
and paper-scale lengths (``--dataset``) at a stated global batch of 4 x W samples (``planning.samples_per_step``,
the batch of the committed figures), so it plans what a real W-GPU job would; the model is tiny (an embedding
and a linear head over the first 16 tokens of each micro-batch) and each micro-batch also sleeps
``--mb-ms`` (a stand-in for the device's compute, during which the plan-ahead thread works), so what is
timed is the runtime around the model. A census (``dcp.bench.census``) counts every collective and
``new_group`` call; an all-gather returns the caller's own row from every rank (a job whose ranks agree).

Reported per (W, rank): start-up seconds (set_manager, with the registry's new_group time, and the time to
the first micro-batch, with the first plans), process groups the rank asked torch for, collectives per
step by kind / group size / bytes (the gradient sync apart from the control plane), the manager's host ms
per step (CPU time of the training thread in a step minus its CPU time in the model's forward, backward
and optimizer step and the census's own work; the manager's step_done, which engine.step calls, counts as host; waiting for the GIL, a plan or other processes on a shared
host is not counted; ``host_wall_ms_per_step`` is the wall-clock version, which counts them), planning CPU per step (CPU of threads other than the
training thread) and its exposed part (time the training thread waited for a plan), and the steps planned
before step 0 ran. Steps 1.. are used (step 0 starts inside start-up); a step ends where the manager's step loop
counts it done (``StepLoop.step_done``, also for a step in which the rank is idle), and the loop's exit after the
last step (the epoch's last agreement check, stopping the prefetch and plan threads) is ``teardown_ms``. The run prefetches
(``advanced.prefetch = "on"``, ``--prefetch``): the next micro-batch is collated on a background thread while
the current one trains, as on a GPU job (where ``auto`` turns it on); its collation CPU is reported apart
(``collate_offthread_ms_per_step``, median; ``collate_offthread_ms_total`` over the timed steps), neither host
nor planning time. ``--json``: the last line is
``{"rows": [...]}``, each row with its ``prefetch`` mode.

The device stand-in (``--device-standin``). ``sleep`` (the default, and every figure before it existed):
the training thread sleeps ``--mb-ms`` at the end of each forward, so it is descheduled 20 times a second and
wakes on a core whose caches, TLB and branch predictors other threads and processes have used; whatever runs
first after the sleep pays for that (on this 2-core shared host ~10-40 us for each of the first few torch
calls, ~0.2-0.3 ms per micro-batch in all), and that is the runtime's ``after_forward``, timed as host. A
CUDA host thread does not sleep per micro-batch: kernel launches are asynchronous, and when it runs ahead of
the device it blocks inside a launch, where CUDA's default schedule spins while the process's contexts do not
outnumber the cores. ``spin`` stands in for that: the thread stays runnable, reading the clock and releasing
the GIL between reads (the plan-ahead thread takes it meanwhile, as it would during a launch). On a host
with fewer idle cores than runnable threads (this one) a spinning thread is still preempted, so neither mode
is a cluster node; ``--mb-ms 0`` gives the warm cost of the runtime's own code (the planner then lags
and its waits are reported as exposed planning, not host time). Report them side by side.

The bench's own clocks (``dcp.bench.scale_probe``). The probe's calls on the training thread (the loop's
``mark`` and micro-batch count, the forward's bracket, ``timed`` around backward and step, the plan wrapper,
the step-end marks, ``manager_part``) are partly outside the brackets that file model time, so they land in
host time although no user's loop makes them. After the loop the worker runs the same calls with no-ops in
place of the runtime's and the model's functions, 7 x 2000 times, accounted exactly as a step is
(``harness_cost``), and reports the median as ``harness_us_per_micro_batch`` / ``harness_us_per_step_extra``;
``harness_ms_per_step`` (per step: that cost x the step's micro-batches + the per-step part) is taken out of
every host figure (``host_ms_per_step``, ``_max``, ``_logged``, ``_unlogged``, ``host_ms_per_micro_batch``);
``host_ms_raw_per_step`` is the figure before it. Nothing the runtime runs is in it: only the probe's own
Python and clock reads. It is calibrated hot, so it is about the least those calls cost (in the loop caches
are colder), and a step's first ``mark`` (clocks, ``getrusage``) and the census's counting of a control
collective are left in host time: the bench's cost is under-subtracted, never over. The wall-clock column is
not corrected. ``train_voluntary_switches_per_step`` / ``train_involuntary_switches_per_step``: the training
thread's context switches per step (``getrusage(RUSAGE_THREAD)``): voluntary ones are mostly waits for the
GIL (the plan-ahead and prefetch threads) or a plan, involuntary ones preemptions by other runnable threads.

The store (``--store``). The runtime writes this rank's phase to the job's rendezvous store at each step's first
micro-batch and at each collective (``dcp.runtime.phases``), and its heartbeat counts up a key there. ``hash``
(the default) gives the fake world an in-process ``HashStore``, which takes those writes as the job's TCPStore
does (a real store's write is also a round trip to its server, ~one syscall pair of CPU, not counted here).
``fake`` is torch's ``FakeStore``, whose every write raises ("Not implemented", a c10 error with its backtrace,
~15 us hot and ~80-110 us as a step's first call): that exception, which no real store raises, was in every
figure before the flag existed (the runtime catches it: the board never fails a step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from dcp.bench.scale_probe import Plans as _Plans
from dcp.bench.scale_probe import Probe as _Probe
from dcp.bench.scale_probe import harness_cost as _harness_cost

SUBPROCESS_TIMEOUT_S = 1800
"""Wall-clock limit of one (W, rank) worker."""
ROW_KEYS = ("world_size", "rank", "startup_s", "process_groups", "world_collectives_unlogged_step",
            "host_ms_per_step", "plan_exposed_ms", "planned_before_step0")
"""The keys every JSON row starts with (more follow: the breakdowns)."""
BATCH_PER_RANK = 4
"""Samples per rank in the bench's stated global batch (``planning.samples_per_step`` = this x W)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-sizes", default="64,512,4096", help="comma-separated W values")
    parser.add_argument("--ranks", default="", help="comma-separated ranks (default: 0, W/2 and W-1 of each W)")
    parser.add_argument("--steps", type=int, default=6, help="steps run per (W, rank); steps 1.. are timed")
    parser.add_argument("--mb-ms", type=float, default=50.0,
                        help="sleep per micro-batch standing in for the device's compute (model time, not host time)")
    parser.add_argument("--device-standin", choices=("sleep", "spin"), default="sleep",
                        help="how the training thread spends --mb-ms: sleep (default; descheduled, as the figures so "
                             "far) or spin (stays on its core, releasing the GIL between clock reads, as a CUDA host "
                             "thread blocked in a kernel launch does); see the module docstring")
    parser.add_argument("--dataset", default="t1d-balanced", help="paper-scale length distribution (datasets/)")
    parser.add_argument("--samples-per-rank", type=int, default=40,
                        help=f"samples per rank and step to draw (the epoch's size; a step plans {BATCH_PER_RANK} per rank)")
    parser.add_argument("--log-every", type=int, default=0,
                        help="runtime.log_every of the run (0: the config's default)")
    parser.add_argument("--prefetch", choices=("on", "off", "auto"), default="on",
                        help="advanced.prefetch of the run: on (default) collates the next micro-batch on a background "
                             "thread, as a GPU job does (auto is on only on CUDA)")
    parser.add_argument("--store", choices=("hash", "fake"), default="hash",
                        help="the fake world's store: hash (default; takes the runtime's phase writes, as the job's "
                             "TCPStore does) or fake (torch's FakeStore: every write raises; the figures before this "
                             "flag); see the module docstring")
    parser.add_argument("--json", action="store_true", help='print a last line {"rows": [...]}')


def _ranks(text: str, world_size: int) -> list[int]:
    if not text:
        return sorted({0, world_size // 2, world_size - 1})
    ranks = [int(r) for r in text.split(",") if r.strip()]
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"--ranks ({text}) holds {bad}, outside [0, {world_size}) for W {world_size}: "
                         "pass ranks below every world size, or leave --ranks out")
    return ranks


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(w < 2 for w in sizes):
        raise ValueError(f"--world-sizes ({text!r}) must be comma-separated integers >= 2: e.g. 64,512,4096")
    return sizes


def run(args: argparse.Namespace) -> int:
    sizes = _world_sizes(args.world_sizes)
    for flag in ("steps", "samples_per_rank"):
        if getattr(args, flag) < 2:
            raise ValueError(f"--{flag.replace('_', '-')} ({getattr(args, flag)}) must be >= 2: one step is start-up")
    if args.log_every < 0:
        raise ValueError(f"--log-every ({args.log_every}) must be >= 0: 0 keeps the config's runtime.log_every")
    if not args.mb_ms >= 0:
        raise ValueError(f"--mb-ms ({args.mb_ms}) must be >= 0: 0 runs the model without a device stand-in")
    from dcp.data_dists import get_spec

    try:
        get_spec(args.dataset)  # before any worker starts
    except ValueError as exc:
        raise ValueError(f"--dataset: {exc}") from None
    jobs = [(w, r) for w in sizes for r in _ranks(args.ranks, w)]
    print(f"# advanced.prefetch = {args.prefetch}" + (": the next micro-batch is collated on a background thread, as "
          "on a GPU job (advanced.prefetch auto), so collation is off the training thread (collate_ms: its time)"
          if args.prefetch == "on" else ": collation runs on the training thread unless prefetching is on"),
          flush=True)
    if args.mb_ms:
        print(f"# device stand-in: {args.device_standin} {args.mb_ms:g} ms per micro-batch", flush=True)
    rows = []
    for w, r in jobs:
        spec = {"world_size": w, "rank": r, "steps": args.steps, "mb_ms": args.mb_ms, "dataset": args.dataset,
                "samples_per_rank": args.samples_per_rank, "log_every": args.log_every,
                "prefetch": args.prefetch, "device_standin": args.device_standin, "store": args.store}
        rows.append(run_worker(spec))
        print(_line(rows[-1]), flush=True) if len(rows) == 1 else print(_line(rows[-1], header=False), flush=True)
    for row in rows:
        if row.get("idle_every_step"):
            print(f"# W {row['world_size']} rank {row['rank']} ran no micro-batch in these steps (its plans leave it "
                  "idle; it joins each step's gradient sync inside get_data_iter): no per-step figures")
            continue
        print(f"# W {row['world_size']} rank {row['rank']} per step: " + "; ".join(
            f"{c['tag'] or 'control'} {c['kind']} x{c['per_step']:g} over {c['group_size']} ranks, {c['bytes']} B"
            for c in row["collectives"]))
    print("# measured on this host's CPU under the fake process group (no data moves); host_ms: training-thread "
          "CPU outside the model, less the bench's own probe calls (harness_ms, calibrated; raw_ms before); wall_ms: wall time outside the model, the device stand-in and the exposed "
          "planning wait (plan_exp_ms), so it also counts waiting for the GIL and for other processes")
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


_COLS = [("W", "world_size", 6), ("rank", "rank", 6), ("startup_s", "startup_s", 10), ("groups", "process_groups", 7),
            ("world_ctl/unlogged", "world_collectives_unlogged_step", 19), ("world_ctl/logged", "world_collectives_logged_step", 17),
            ("host_ms", "host_ms_per_step", 8), ("raw_ms", "host_ms_raw_per_step", 8),
            ("harness_ms", "harness_ms_per_step", 11), ("wall_ms", "host_wall_ms_per_step", 8), ("mbs", "micro_batches_per_step", 5), ("collate_ms", "collate_ms_per_step", 11),
            ("plan_cpu_ms", "plan_cpu_ms_per_step", 12), ("plan_exp_ms", "plan_exposed_ms", 12),
            ("planned<0", "planned_before_step0", 10)]
_LINE_KEYS = [k for _, k, _ in _COLS]
"""The row keys the printed table shows (the first four are the rank's identity and start-up)."""


def _line(row: dict[str, Any], header: bool = True) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    body = " ".join(f"{fmt(row[k]):>{w}}" for _, k, w in _COLS)
    return (" ".join(f"{h:>{w}}" for h, _, w in _COLS) + "\n" + body) if header else body


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one (W, rank) in a fresh Python process (one fake world per process); returns its row."""
    cmd = [sys.executable, "-m", "dcp.bench.scale", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode == 2 and last.startswith("error: "):
        raise ValueError(f"--world-sizes: W {spec['world_size']} (rank {spec['rank']}): " + last.removeprefix("error: "))
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"dcp bench scale worker W {spec['world_size']} rank {spec['rank']} failed "
                           f"(exit {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class _TokenDataset:
    """Token sequences of the given lengths, each a view of one buffer: the runtime's collation is what costs,
    not drawing random tokens."""

    def __init__(self, lengths: Any) -> None:
        import torch

        self._lengths = [int(n) for n in lengths]
        self._buf = torch.arange(max(self._lengths), dtype=torch.long) % 1000
        self.collate_s: Counter = Counter()
        self.offthread_cpu_s: Counter = Counter()
        """CPU of collations run off the training thread (a prefetch thread), per tick: not planning."""
        self.clock = lambda: 0

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> list[int]:
        return list(self._lengths)

    def target_counts(self) -> list[int]:
        return [n - 1 for n in self._lengths]

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self._buf[: self._lengths[index]]

    def collate(self, samples: Any) -> Any:
        import threading

        from dcp.data import collate_tokens

        tick, t0, c0 = self.clock(), time.perf_counter(), time.thread_time()
        batch = collate_tokens([s for _, s in samples], [i for i, _ in samples])
        self.collate_s[tick] += time.perf_counter() - t0
        if threading.current_thread() is not threading.main_thread():
            self.offthread_cpu_s[tick] += time.thread_time() - c0
        return batch


def _without_count(row: Any) -> Any:
    """Another rank's agreement row in the fake world: this rank's, but with no label count (-1, as from a model
    that reports none), since the real counts of the other ranks are unknown here; the manager then skips the
    per-step count check, which needs them all, and checks plans, positions and data as always."""
    other = row.clone()
    if other.dim() == 1 and other.numel() == 14:  # dcp.runtime.exchange.ROW_WORDS; word 5 is the count
        other[5] = -1
    return other


def _tiny_model() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Embedding(1000, 16), torch.nn.Linear(16, 1000))


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One (W, rank) in this process: build the fake world, run the loop, return the row."""
    import logging

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dcp import set_manager
    from dcp.bench.census import Census
    from dcp.data_dists import load_lengths
    from dcp.sim.scenario import paper_config, paper_table, scenario

    torch.set_num_threads(1)
    logging.getLogger("dcp").setLevel(logging.WARNING)
    w, rank, steps, mb_s = spec["world_size"], spec["rank"], spec["steps"], spec["mb_ms"] / 1e3
    spin = spec.get("device_standin", "sleep") == "spin"
    store = FakeStore() if spec.get("store", "hash") == "fake" else dist.HashStore()  # importing fake_pg registers "fake"
    dist.init_process_group("fake", store=store, rank=rank, world_size=w)
    sc = scenario("t1d-5b", "h200")
    config, table = paper_config(sc, "dcp-intra"), paper_table(sc, w)
    config = config.replace(planning=dataclasses.replace(config.planning, samples_per_step=BATCH_PER_RANK * w))
    if spec.get("log_every"):
        config = config.replace(runtime=dataclasses.replace(config.runtime, log_every=spec["log_every"]))
    config = config.replace(advanced=dataclasses.replace(config.advanced, prefetch=spec.get("prefetch", "on")))
    lengths = load_lengths(spec["dataset"], scale="paper", num_samples=spec["samples_per_rank"] * w * (steps + 2))
    data, model, probe = _TokenDataset(lengths.tokens), _tiny_model(), _Probe()
    data.clock = probe.tick

    def forward(model: Any, batch: Any, ctx: Any) -> Any:
        tick, t0, c0 = probe.tick(), time.perf_counter(), time.thread_time()  # harness_cost (scale_probe) runs these lines
        logits = model(batch.inputs[:, :16])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets[:, :16].flatten(),
                                                 ignore_index=-100, reduction="sum")
        # the model sees 16 tokens of each sample; the count is the batch's labelled tokens, as planned (the
        # model's own work: timed with it)
        count = (batch.targets != -100).sum()
        if mb_s:  # the device's compute: the plan-ahead thread runs meanwhile
            if spin:
                end = time.perf_counter() + mb_s
                while time.perf_counter() < end:
                    time.sleep(0)  # releases the GIL (the plan-ahead thread may take it) without a timed wait
            else:
                time.sleep(mb_s)
        probe.model_done(tick, t0, c0)
        return loss, count

    census = Census(dist, clock=probe.tick, agreeing_world=True, others_row=_without_count)
    with census:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        t0 = time.perf_counter()
        mgr = set_manager(model, data, config, optimizer=opt, table=table, forward_fn=forward)
        manager_s, groups_s = time.perf_counter() - t0, census.new_group_s
        eng = mgr.engine
        mgr.step_done = probe.manager_part(mgr.step_done)  # the engine's step calls it: manager time, not model
        loop_done = mgr._loop.step_done

        def step_done(sync: Any) -> None:  # every step ends here (an idle one too, outside the engine's calls)
            loop_done(sync)
            probe.mark()

        mgr._loop.step_done = step_done
        eng.backward = probe.timed(eng.backward, census, "grad-sync")
        eng.step = probe.timed(eng.step, census, "grad-sync")
        eng.idle_step = probe.timed(eng.idle_step, census, "grad-sync")
        plans = mgr.epoch_plans
        mgr.epoch_plans = lambda epoch, ids=None, **kw: _Plans(plans(epoch, ids, **kw), probe)
        t1 = time.perf_counter()
        before0 = first_s = None
        for batch in mgr.get_data_iter(max_steps=steps):
            if first_s is None:
                first_s, before0 = time.perf_counter() - t1, probe.plans_taken
                probe.mgr = mgr
                probe.mark()
            probe.mark()
            probe.micro_batches[probe.tick()] += 1
            mgr.optimize_dynamics(batch, eng)
            with mgr.profile(batch, eng):
                loss = eng(batch)
                eng.backward(loss)
                eng.step()
        probe.mark()
        end = (time.perf_counter(), time.process_time(), time.thread_time())
        use = resource.getrusage(resource.RUSAGE_THREAD)
        probe.switches[None] = (use.ru_nvcsw, use.ru_nivcsw)
        harness = _harness_cost(mgr, census)  # after the loop: nothing else of the run is timed now
    logged = {s.global_step for s in mgr.step_stats}
    return _row(spec, census, probe, data, end, logged, manager_s=manager_s, groups_s=groups_s,
                first_s=first_s, before0=before0, config_log_every=config.runtime.log_every, harness=harness)


def _row(spec: dict[str, Any], census: Any, probe: _Probe, data: _TokenDataset, end: tuple, logged: set[int], *,
         manager_s: float, groups_s: float, first_s: float | None, before0: int | None,
         config_log_every: int, harness: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    w = spec["world_size"]
    marks = sorted(probe.step_start)
    ticks = [t for t in marks if t >= 1 and t + 1 in probe.step_start] or [t for t in marks if t >= 0]
    if not ticks:  # no micro-batch here in any step: an idle rank joins each step inside get_data_iter, unmarked
        row = {**dict.fromkeys(ROW_KEYS), **dict.fromkeys(_LINE_KEYS)}
        row.update(world_size=w, rank=spec["rank"], startup_s=round(manager_s, 3), process_groups=census.new_groups,
                   member_groups=census.member_groups, set_manager_s=round(manager_s, 3),
                   new_group_s=round(groups_s, 3), steps_timed=0, idle_every_step=True, collectives=[])
        return row
    nxt = {t: probe.step_start.get(t + 1, end) for t in ticks}
    by_tick = census.by_tick()
    host, wall, plan_cpu, world_unlogged, world_logged, host_logged, host_unlogged = [], [], [], [], [], [], []
    raw, own_probe, switches = [], [], []
    for t in ticks:
        (w0, p0, th0), (w1, p1, th1) = probe.step_start[t], nxt[t]
        own = census.own_s.get(t, 0.0)
        # the training thread's CPU outside the model: waiting (for the GIL, a plan, other processes on the
        # host) is not work, so this is what the runtime costs the host per step whatever else runs
        raw.append(1e3 * ((th1 - th0) - probe.model_cpu_s[t] + probe.manager_cpu_s[t] - own))
        # less the bench's own probe calls in the step, at their calibrated (hot, least) cost: _harness_cost
        own_probe.append(1e3 * (harness[0] * probe.micro_batches[t] + harness[1]))
        host.append(raw[-1] - own_probe[-1])
        after = probe.switches.get(t + 1, probe.switches.get(None))
        if t in probe.switches and after is not None:
            switches.append((after[0] - probe.switches[t][0], after[1] - probe.switches[t][1]))
        wall.append(1e3 * (w1 - w0 - probe.model_s[t] + probe.manager_s[t] - probe.plan_wait_s[t] - own))
        # CPU of the other threads: the plan-ahead thread (a prefetch thread's collation taken out)
        plan_cpu.append(1e3 * ((p1 - p0) - (th1 - th0) - data.offthread_cpu_s[t]))
        n_world = sum(n for (tag, _, size, _), n in by_tick.get(t, Counter()).items() if size == w and tag == "")
        (world_logged if t in logged else world_unlogged).append(n_world)
        (host_logged if t in logged else host_unlogged).append(host[-1])
    per_step: Counter = Counter()
    for t in ticks:
        per_step.update(by_tick.get(t, Counter()))
    collectives = [{"tag": tag, "kind": kind, "group_size": size, "bytes": nbytes, "per_step": n / len(ticks)}
                   for (tag, kind, size, nbytes), n in sorted(per_step.items())]
    startup = [c for c in census.calls if c.tick < 0]
    return {
        "world_size": w, "rank": spec["rank"],
        "startup_s": round(manager_s + (first_s or 0.0), 3),
        "process_groups": census.new_groups,
        "world_collectives_unlogged_step": max(world_unlogged) if world_unlogged else None,
        "host_ms_per_step": round(statistics.median(host), 3),
        "plan_exposed_ms": round(statistics.median(1e3 * probe.plan_wait_s[t] for t in ticks), 3),
        "planned_before_step0": before0,
        "world_collectives_logged_step": max(world_logged) if world_logged else None,
        "member_groups": census.member_groups,
        "set_manager_s": round(manager_s, 3), "new_group_s": round(groups_s, 3),
        "first_batch_s": round(first_s or 0.0, 3),
        "startup_collectives": len(startup),
        "collate_ms_per_step": round(statistics.median(1e3 * data.collate_s[t] for t in ticks), 3),
        "collate_offthread_ms_per_step": round(statistics.median(1e3 * data.offthread_cpu_s[t] for t in ticks), 3),
        # the sum over the timed steps: a step's micro-batches are collated in a burst when the step before hands out
        # its last one, filed under whichever step is running when the thread gets to them, so the median of a
        # few steps can be 0 while every micro-batch was collated off the training thread
        "collate_offthread_ms_total": round(sum(1e3 * data.offthread_cpu_s[t] for t in ticks), 3),
        "plan_cpu_ms_per_step": round(statistics.median(plan_cpu), 3),
        "host_ms_max": round(max(host), 3),
        "host_ms_logged": round(statistics.median(host_logged), 3) if host_logged else None,
        "host_ms_unlogged": round(statistics.median(host_unlogged), 3) if host_unlogged else None,
        "host_wall_ms_per_step": round(statistics.median(wall), 3),
        "host_ms_raw_per_step": round(statistics.median(raw), 3),
        "harness_ms_per_step": round(statistics.median(own_probe), 3),
        "harness_us_per_micro_batch": round(1e6 * harness[0], 3), "harness_us_per_step_extra": round(1e6 * harness[1], 3),
        "train_voluntary_switches_per_step": statistics.median(v for v, _ in switches) if switches else None,
        "train_involuntary_switches_per_step": statistics.median(i for _, i in switches) if switches else None,
        "micro_batches_per_step": statistics.median(probe.micro_batches[t] for t in ticks),
        "host_ms_per_micro_batch": round(sum(host) / max(1, sum(probe.micro_batches[t] for t in ticks)), 3),
        "teardown_ms": round(1e3 * (end[2] - probe.step_start[marks[-1]][2] - probe.model_cpu_s[marks[-1]]), 3),
        "steps_timed": len(ticks), "logged_steps_timed": len(world_logged),
        "collectives": collectives,
        "samples": spec["samples_per_rank"] * w * (spec["steps"] + 2), "mb_ms": spec["mb_ms"],
        "device_standin": spec.get("device_standin", "sleep"),
        "log_every": config_log_every, "prefetch": spec.get("prefetch", "on"),
        "store": spec.get("store", "hash"),
    }


if __name__ == "__main__":
    from dcp.planner.stream import PlanningError

    try:
        print(json.dumps(measure(json.loads(sys.argv[1]))))
    except PlanningError as exc:  # a user's choice (this W cannot hold the dataset): one line for run_worker
        print("error: " + " ".join(str(exc).split()) + "; here: pass larger --world-sizes (the paper's 5B model "
              "on H200 at paper-scale lengths), e.g. 64", file=sys.stderr)
        raise SystemExit(2) from None
