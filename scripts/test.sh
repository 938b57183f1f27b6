#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: unit, multi-process (gloo on CPU); gpu tests skip without CUDA.
# With no arguments: the single-process tests on two pytest-xdist workers, then the multi-process tests one at a
# time (each starts 2-6 gloo processes of its own: two at once on a 2-core machine would only trade time for
# timeouts). With arguments: one pytest run with them (e.g. -m "not dist", a file, -k ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
    .venv/bin/python -m pytest -q -n 2 -m "not dist"
    exec .venv/bin/python -m pytest -q -m dist
fi
exec .venv/bin/python -m pytest -q "$@"
