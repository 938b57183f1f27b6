#!/usr/bin/env bash
# Run experiments/slurm/sweep.sbatch under a real Slurm on this machine: a one-node slurmctld + slurmd
# (with munge), a small CPU/gloo sweep (t1d-tiny, one dataset, dcp-intra, 2 ranks), then check what it wrote.
#
#   bash scripts/slurm_check.sh            # installs Debian's slurm-wlm and munge when missing (needs root)
#   DCP_SLURM_NO_INSTALL=1 bash scripts/slurm_check.sh   # use an installed Slurm only
#
# Exit status: 0 the job ran and wrote its results; 77 Slurm is not installed and cannot be (no root, no
# apt-get, or DCP_SLURM_NO_INSTALL); anything else: a failure (the job's output is printed).
# Everything it starts (munged, slurmctld, slurmd) is stopped on exit; its files live in one temp folder
# (kept on failure: its path is printed). PYTHON picks the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3)}
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
SKIP=77

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
               && command -v munged >/dev/null; }
if ! have_slurm; then
    if [ -n "${DCP_SLURM_NO_INSTALL:-}" ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "slurm_check: Slurm is not installed and cannot be installed here (needs root and apt-get; "\
             "DCP_SLURM_NO_INSTALL=${DCP_SLURM_NO_INSTALL:-unset}): skipped" >&2
        exit $SKIP
    fi
    echo "slurm_check: installing slurm-wlm and munge (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
"$PYTHON" -c "import torch, dcp" 2>/dev/null || { echo "slurm_check: $PYTHON cannot import torch and dcp: run scripts/setup.sh or set PYTHON" >&2; exit 1; }

WORK=$(mktemp -d /tmp/dcp-slurm.XXXXXX)
PIDS=()
cleanup() {
    status=$?
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ $status -eq 0 ]; then rm -rf "$WORK"; else echo "slurm_check: files kept in $WORK" >&2; fi
}
trap cleanup EXIT

HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$WORK"/{state,spool,munge,log}

# munge: a key of our own and a daemon on our own socket (the system's, if any, is left alone)
dd if=/dev/urandom of="$WORK/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge/munge.key"
SOCKET="$WORK/munge/munge.socket"
munged --force --key-file="$WORK/munge/munge.key" --socket="$SOCKET" --pid-file="$WORK/munge/munged.pid" \
       --log-file="$WORK/log/munged.log" --seed-file="$WORK/munge/seed"
PIDS+=("$(cat "$WORK/munge/munged.pid")")

cat > "$WORK/slurm.conf" <<EOF
ClusterName=dcpcheck
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCKET
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPort=16817
SlurmdPort=16818
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=check Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$WORK/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
sleep 1
PIDS+=("$(cat "$WORK/slurmctld.pid")" "$(cat "$WORK/slurmd.pid")")
for _ in $(seq 30); do
    sinfo -h -o "%t" 2>/dev/null | grep -qE "^(idle|mix)" && break
    sleep 1
done
sinfo

# The sweep: the template's GPU request is overridden on the command line (this node has no GPUs);
# GPUS_PER_NODE=2 gives one torchrun with 2 gloo ranks (cpu_small.toml: device cpu, backend gloo).
OUT="$WORK/results"
export GPUS_PER_NODE=2 OMP_NUM_THREADS=1 PATH="$(dirname "$PYTHON"):$PATH" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
JOB=$(sbatch --parsable --wait --nodes=1 --gpus-per-node=0 --cpus-per-task="$CPUS" --time=00:20:00 \
        --output="$WORK/log/job-%j.out" experiments/slurm/sweep.sbatch experiments/cpu_small.toml \
        --models t1d-tiny --datasets short --methods dcp-intra --steps 2 --warmup-steps 0 \
        --out "$OUT") || { echo "slurm_check: the job failed:" >&2; cat "$WORK"/log/job-*.out >&2 || true; exit 1; }
echo "slurm_check: job $JOB finished; its output:"
cat "$WORK"/log/job-*.out
sacct -j "$JOB" 2>/dev/null || true

"$PYTHON" - "$OUT" <<'EOF'
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = list(csv.DictReader((out / "runs.csv").open()))
assert runs, f"{out}/runs.csv holds no rows"
assert all(r["world_size"] == "2" and r["method"] == "dcp-intra" for r in runs), runs
json.loads((out / "config.json").read_text())
steps = list(csv.DictReader((out / "steps.csv").open()))
assert steps, f"{out}/steps.csv holds no rows"
print(f"slurm_check: ok: {len(runs)} run(s), {len(steps)} step rows in {out}")
EOF
