#!/usr/bin/env bash
# The GPU checks on a machine with one GPU, its own torch and no network:
#   bash scripts/gpu_checks.sh bench          # python -m dcp.cli bench gpu --no-tests --json
#   bash scripts/gpu_checks.sh gpu-tests      # pytest tests/gpu
#   bash scripts/gpu_checks.sh suite K N      # the K-th (0-based) of N slices of the test files, with the
#                                             # 15 slowest tests listed: each slice fits one device call
#   bash scripts/gpu_checks.sh suite-xdist N  # the whole suite: tests/unit and tests/dist on N pytest-xdist
#                                             # workers (the GPU image has it), tests/gpu beside them in one
#                                             # process, in turn (no CUDA test times kernels beside another's)
#   bash scripts/gpu_checks.sh short          # bench gpu --only short: busy share, eager vs compiled blocks
#   bash scripts/gpu_checks.sh clock          # bench gpu --only clock: profiling clocks on uncalibrated shapes
#   bash scripts/gpu_checks.sh knobs          # bench gpu --only knobs: prefetch, cache_weight_casts on vs off
#   bash scripts/gpu_checks.sh cp             # bench gpu --only cp: context-parallel attention kernels vs one call
#   bash scripts/gpu_checks.sh engines        # bench gpu --only engines: each engine's peak memory vs the memory model
#   bash scripts/gpu_checks.sh sweeps         # bench gpu --only sweeps: each engine's sweep through the manager alone
# DeepSpeed and its needs come from .whl/ (pure-Python wheels, built as GPU.md says) when it is there.
# With OUT set (the device tool's output folder), each check's output is also written to $OUT/<check>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: [PYTHON=python-with-torch] bash scripts/gpu_checks.sh bench | gpu-tests | suite K N | suite-xdist N | short | clock | knobs | cp | engines | sweeps"
case "${1:-}" in
  bench|gpu-tests|short|clock|knobs|cp|engines|sweeps) ;;
  suite-xdist) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "suite-xdist needs a worker count N >= 1, e.g. suite-xdist 6; $usage" >&2; exit 2; } ;;
  suite) [[ "${2:-}" =~ ^[0-9]+$ && "${3:-}" =~ ^[1-9][0-9]*$ && "${2}" -lt "${3}" ]] \
           || { echo "suite needs a slice K and a count N with 0 <= K < N, e.g. suite 0 4; $usage" >&2; exit 2; } ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
# the project's venv when there is one (CPU machines), else the machine's own python3 (a GPU machine without network)
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
"$PY" -c "import torch" 2> /dev/null || { echo "$PY cannot import torch: set PYTHON to a Python with torch" >&2; exit 2; }
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import deepspeed" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
log=/dev/null
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && log="$OUT/$1${2:+-$2}${3:+of$3}.log"
case "${1:-}" in
  bench) "$PY" -m dcp.cli bench gpu --no-tests --json 2>&1 | tee "$log" ;;
  short|clock|knobs|cp|engines|sweeps) "$PY" -m dcp.cli bench gpu --only "$1" --json 2>&1 | tee "$log" ;;
  suite-xdist)
    # pytest-xdist's --dist loadgroup stops grouping from pytest 9.2 (pytest-dev/pytest-xdist#1386; seen here),
    # so the CUDA tests run in a process of their own; their log is written as they run ($OUT/...-gpu.log).
    # worksteal: an idle worker takes queued tests from a busy one, so the slow multi-process files
    # (tests/dist/test_rank_failures.py, ~2 min) do not queue behind each other on one worker
    gpu_log=$([ "$log" = /dev/null ] && mktemp || echo "${log%.log}-gpu.log"); rc=0
    "$PY" -m pytest -v -rfE -p no:cacheprovider --durations=15 tests/gpu > "$gpu_log" 2>&1 & gpu=$!
    # one intra-op thread per worker: torch's default is one per core, N workers x 16 threads on 16 cores
    # (the third H200 run's suite-xdist 12 ran past 515 s with it, and the CUDA tests beside it took 498 s)
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PY" -m pytest -v -rfE -p no:cacheprovider -n "$2" --dist worksteal --durations=15 tests/unit tests/dist 2>&1 | tee "$log" || rc=$?
    wait "$gpu" || rc=$?
    echo "== tests/gpu, in one process beside them:"
    cat "$gpu_log"
    [ "$log" = /dev/null ] && rm -f "$gpu_log"
    exit "$rc" ;;
  gpu-tests) "$PY" -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$log" ;;
  suite)
    k=$2; n=$3
    mapfile -t files < <(find tests -name 'test_*.py' | sort | awk -v k="$k" -v n="$n" '(NR - 1) % n == k')
    "$PY" -m pytest -q -p no:cacheprovider --durations=15 "${files[@]}" 2>&1 | tee "$log" ;;
esac
