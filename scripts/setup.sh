#!/usr/bin/env bash
# Create .venv (Python 3.11+) with the CPU build of torch and dcp installed editable with its dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # the CPU wheel; a looser requirement would pull several GB of CUDA packages
  .venv/bin/pip install -q "torch==2.13.0"
fi
.venv/bin/pip install -q -e ".[dev]"
