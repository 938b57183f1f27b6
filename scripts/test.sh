#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: unit, multi-process (gloo on CPU); gpu tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
