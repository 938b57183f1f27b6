"""Scale: the registry creates only this rank's groups, and ``dcp bench scale`` measures one rank of a large job
under PyTorch's fake process group (each case in a subprocess: a fake world is process-wide state)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from dcp.bench import scale
from dcp.runtime.registry import local_sync_safe, sp_blocks

SIZES = (1, 2, 4, 8, 16)

FAKE_REGISTRY = """
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from dcp.bench.census import Census
from dcp.runtime.registry import SPGroupRegistry
w, rank = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3:  # a world bound to a device (NCCL's eager mode): every rank must join every split
    import dcp.runtime.registry as registry
    registry.splits_world_communicator = lambda: True
    del dist.split_group  # a torch without split_group (its own path: tests/unit/test_registry_split.py)
dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=w)
with Census(dist, agreeing_world=True) as census:
    reg = SPGroupRegistry(w, 8, [1, 2, 4, 8, 16])
own = {p: dist.get_process_group_ranks(reg.get(rank // p * p, p)) for p in (1, 2, 4, 8, 16)}
other = reg.get(0 if rank >= 16 else 16, 16) is dist.GroupMember.NON_GROUP_MEMBER
print(json.dumps({"new_groups": census.new_groups, "members": census.member_groups, "local": reg.local,
                  "own": {str(p): [r[0], len(r)] for p, r in own.items()}, "other": other}))
"""


def test_local_sync_safe_follows_the_layout():
    assert local_sync_safe(sp_blocks(6, 4, [1, 2, 4, 8]))
    assert local_sync_safe(sp_blocks(4096, 8, SIZES))
    # size 3 on 4 ranks per node leaves rank 3 without a size-3 block: the size-4 block's members would hold
    # different numbers of earlier groups, so torch's hashed group names would differ
    assert not local_sync_safe(sp_blocks(8, 4, [1, 3, 4]))


@pytest.mark.parametrize("rank", [0, 2048, 4095])
def test_registry_creates_one_group_per_sp_size_at_4096_ranks(rank):
    out = subprocess.run([sys.executable, "-c", FAKE_REGISTRY, "4096", str(rank)], capture_output=True, text=True,
                         check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # before: one new_group per block of the world (7,680 calls at W = 4096, 8 ranks per node)
    assert got["local"] and got["new_groups"] == len(SIZES) == got["members"]
    assert got["own"] == {str(p): [rank // p * p, p] for p in SIZES}
    assert got["other"]


def test_registry_creates_every_block_where_groups_split_from_the_world():
    out = subprocess.run([sys.executable, "-c", FAKE_REGISTRY, "64", "9", "eager"], capture_output=True, text=True,
                         check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["local"] and got["new_groups"] == len(sp_blocks(64, 8, SIZES)) and got["members"] == len(SIZES)
    assert got["own"] == {str(p): [9 // p * p, p] for p in SIZES}


def _args(**kw) -> argparse.Namespace:
    base = dict(world_sizes="16", ranks="0,15", steps=3, mb_ms=0.0, dataset="t1d-balanced", samples_per_rank=40,
                log_every=0, prefetch="on", json=True, device_standin="sleep", store="hash")
    base.update(kw)
    return argparse.Namespace(**base)


def test_bench_scale_rows_at_16_ranks(capsys):
    assert scale.run(_args(steps=4, log_every=2)) == 0
    out = capsys.readouterr().out
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert out.startswith("# advanced.prefetch = on: the next micro-batch is collated on a background thread")
    assert [(r["world_size"], r["rank"]) for r in rows] == [(16, 0), (16, 15)]
    for r in rows:
        assert list(r)[: len(scale.ROW_KEYS)] == list(scale.ROW_KEYS)
        assert 0 < r["startup_s"] and r["host_ms_per_step"] > 0 and r["plan_exposed_ms"] >= 0
        assert r["process_groups"] <= 2 * len(SIZES) + 2  # one per SP size + the manager's own
        # step 0's plan, and step 1's when step 0's last micro-batch is handed out (its first micro-batch is
        # collated ahead): no second planning pass over the epoch
        assert 1 <= r["planned_before_step0"] <= 2 and r["steps_timed"] >= 2 and r["log_every"] == 2
        # prefetching, as a GPU job does: the timed steps' micro-batches were collated on the prefetch thread
        # (summed over the timed steps: each step's micro-batches are collated in one burst, which may be filed
        # under the step before, so the median of three steps can be 0)
        assert r["prefetch"] == "on" and r["collate_offthread_ms_total"] > 0
        assert r["store"] == "hash"  # the fake world's store takes the runtime's phase writes
        # unlogged steps issue no world-wide control collective; a logged one gathers the agreement row
        assert r["world_collectives_unlogged_step"] == 0 and r["world_collectives_logged_step"] >= 1
        # the census holds the step's gradient sync: one all-reduce over all 16 ranks of the model's gradients
        # and the non-finite guard's 8-byte flag (dcp.runtime.guard), over the same ranks
        sync = [c for c in r["collectives"] if c["tag"] == "grad-sync" and c["kind"] == "all_reduce"]
        sizes = sorted(c["bytes"] for c in sync)
        assert sync and all(c["group_size"] == 16 for c in sync)
        assert sizes == [8, 4 * (1000 * 16 + 16 * 1000 + 1000)], sizes


def test_bench_scale_spin_standin_runs_and_is_reported(capsys):
    # --device-standin spin: the device time is spent on the training thread's core (a busy wait), and the row
    # says which stand-in it ran under
    assert scale.run(_args(ranks="15", steps=2, mb_ms=2.0, device_standin="spin")) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [r["device_standin"] for r in rows] == ["spin"] and rows[0]["host_ms_per_step"] > 0


def test_bench_scale_runs_on_torchs_fake_store_too(capsys):
    # --store fake: torch's FakeStore, whose writes raise (the runtime's phase board catches it); the row says so
    assert scale.run(_args(ranks="15", steps=2, store="fake")) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [r["store"] for r in rows] == ["fake"] and rows[0]["host_ms_per_step"] > 0


@pytest.mark.parametrize(("kw", "match"), [
    (dict(world_sizes="16,x"), r"--world-sizes \('16,x'\) must be comma-separated integers >= 2"),
    (dict(world_sizes="1"), r"--world-sizes \('1'\)"),
    (dict(ranks="16"), r"--ranks \(16\) holds \[16\], outside \[0, 16\)"),
    (dict(steps=1), r"--steps \(1\) must be >= 2"),
    (dict(mb_ms=-1.0), r"--mb-ms \(-1.0\) must be >= 0"),
    (dict(log_every=-1), r"--log-every \(-1\) must be >= 0"),
    (dict(dataset="t1d-shrt"), r"^--dataset: distribution \('t1d-shrt'\) is not known in .*: use one of \["),
])
def test_bench_scale_refuses_bad_flags(kw, match):
    with pytest.raises(ValueError, match=match):
        scale.run(_args(**kw))


def test_the_managers_step_done_inside_engine_step_is_filed_as_host_time():
    # engine.step is timed as model; the manager's step_done it calls (the position's record) is host time
    from dcp.bench.scale import _Probe

    probe = _Probe()
    inner = probe.manager_part(lambda n: sum(range(n)))
    outer = probe.timed(lambda: inner(200_000))
    outer()
    assert probe.manager_cpu_s[-1] > 0 and probe.manager_s[-1] > 0
    assert probe.model_cpu_s[-1] >= probe.manager_cpu_s[-1]  # inside the model-timed call, counted back in _row


def test_bench_scale_world_size_too_small_for_the_dataset_is_one_line():
    # t1d-balanced's longest paper-scale samples need more than 3 ranks: the worker's PlanningError comes back
    # as one ValueError line (the dcp command prints it and exits 2), not a worker traceback
    with pytest.raises(ValueError, match=r"^--world-sizes: W 3 \(rank 0\): seq_group \d+ .* has no setting that "
                       r"fits .*; here: pass larger --world-sizes .*e\.g\. 64$") as exc:
        scale.run(_args(world_sizes="3", ranks="0", steps=6, json=False))
    assert "\n" not in str(exc.value)


def test_a_worker_exiting_2_without_stderr_is_the_worker_failure_not_an_index_error(monkeypatch):
    # a worker's exit status 2 with nothing on stderr (a silent sys.exit(2)) has no 'error: ' line to pass on: it
    # is reported as any failed worker is (it raised IndexError on stderr's last line)
    def silent(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 2, stdout="", stderr="")

    monkeypatch.setattr(scale.subprocess, "run", silent)
    with pytest.raises(RuntimeError, match=r"^dcp bench scale worker W 16 rank 0 failed \(exit 2\)"):
        scale.run_worker({"world_size": 16, "rank": 0})


def test_the_benchs_own_probe_calls_are_reported_and_taken_out_of_host_time():
    # two timed steps of 10 micro-batches, each 100 ms of training-thread CPU outside the model; the calibrated
    # probe cost (1 ms per micro-batch + 2 ms per step) is reported apart and taken out; the raw figure stays
    from dcp.bench.census import Census
    from dcp.bench.scale import _Probe, _row, _TokenDataset

    probe = _Probe()
    probe.step_start = {0: (0.0, 0.0, 0.0), 1: (1.0, 1.0, 0.5), 2: (2.0, 2.0, 1.0), 3: (3.0, 3.0, 1.5)}
    probe.switches = {1: (5, 1), 2: (9, 4), 3: (11, 4)}
    for t in (1, 2):
        probe.micro_batches[t], probe.model_cpu_s[t], probe.model_s[t] = 10, 0.4, 0.8
    spec = {"world_size": 16, "rank": 0, "steps": 3, "samples_per_rank": 40, "mb_ms": 0.0}
    row = _row(spec, Census(object()), probe, _TokenDataset([10]), (4.0, 4.0, 2.0), set(), manager_s=0.1,
               groups_s=0.0, first_s=0.1, before0=1, config_log_every=1, harness=(1e-3, 2e-3))
    assert row["host_ms_raw_per_step"] == pytest.approx(100.0)
    assert row["harness_ms_per_step"] == pytest.approx(12.0)
    assert row["host_ms_per_step"] == pytest.approx(88.0) and row["host_ms_max"] == pytest.approx(88.0)
    assert row["harness_us_per_micro_batch"] == pytest.approx(1000.0)
    assert row["train_voluntary_switches_per_step"] == 3 and row["train_involuntary_switches_per_step"] == 1.5


def test_harness_calibration_runs_the_probes_calls_on_the_managers_clock():
    # the calibration runs the probe's calls around no-ops, reading the step from the run's manager as the
    # loop's probe does: a positive cost per micro-batch and per step
    from dcp.bench import scale_probe

    class Mgr:
        reads = 0

        @property
        def global_step(self) -> int:
            Mgr.reads += 1
            return 7

    per_mb, per_step = scale_probe.harness_cost(Mgr(), None)
    assert per_mb > 0 and per_step > 0
    # per round and micro-batch: mark (1), the count (1), the forward's bracket (1), two timed calls (3 each)
    assert Mgr.reads >= scale_probe.CALIBRATION_ROUNDS * scale_probe.CALIBRATION_CALLS * 9


def _scale_ab(*args: str) -> subprocess.CompletedProcess:
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, str(root / "scripts" / "scale_ab.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=root)


def test_scale_ab_runs_two_trees_interleaved_and_summarises():
    """scripts/scale_ab.py (how the 4096-rank host figures are compared): A then B per pair, one line per run, and
    each key's medians with the pairs in which B was lower."""
    out = _scale_ab(".", ".", "--pairs", "1", "--keys", "host_ms_per_step,micro_batches_per_step", "--",
                    "--world-sizes", "8", "--ranks", "0", "--steps", "3", "--mb-ms", "0", "--samples-per-rank", "4")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[:3] for line in lines[:2]] == [["pair", "1", "A"], ["pair", "1", "B"]]
    assert lines[2].startswith("host_ms_per_step: A median ") and lines[2].endswith("pairs")
    assert lines[3].startswith("micro_batches_per_step: A median ")


@pytest.mark.parametrize("args, needle", [
    (("/nonexistent", "."), "/nonexistent holds no dcp/cli.py"),
    ((".", ".", "--pairs", "0"), "--pairs (0) must be >= 1"),
    ((".", ".", "--pairs", "1", "--keys", "no_such_key", "--", "--world-sizes", "8", "--ranks", "0", "--steps", "2",
      "--mb-ms", "0", "--samples-per-rank", "2"), "bench rows have no ['no_such_key']"),
    ((".", ".", "--pairs", "1", "--", "--world-sizes", "eight"), "dcp bench scale failed in . (exit 2)"),
])
def test_scale_ab_refuses_bad_input_with_one_line(args, needle):
    out = _scale_ab(*args)
    assert out.returncode != 0 and needle in out.stderr


def test_a_rank_idle_in_every_step_gets_a_row_without_per_step_figures(capsys):
    # W = 512 on the default data: rank 256 runs no micro-batch in the first steps (its plans leave it idle)
    assert scale.run(_args(world_sizes="512", ranks="256", steps=3)) == 0
    out = capsys.readouterr().out
    row = json.loads(out.strip().splitlines()[-1])["rows"][0]
    assert list(row)[: len(scale.ROW_KEYS)] == list(scale.ROW_KEYS)
    assert row["idle_every_step"] and row["host_ms_per_step"] is None and row["process_groups"] > 0
    assert "W 512 rank 256 ran no micro-batch in these steps" in out
