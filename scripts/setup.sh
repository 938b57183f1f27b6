#!/usr/bin/env bash
# Create .venv (Python 3.11+) with the CPU build of torch and dcp installed editable with its dev extras.
# A ready venv is left alone: the install runs only when pyproject.toml changed since the last one
# (its sha256 is stored in .venv/.dcp-setup-stamp) or when `import dcp` fails. FORCE_SETUP=1 reinstalls.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.dcp-setup-stamp
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # the CPU wheel; a looser requirement would pull several GB of CUDA packages
  .venv/bin/pip install -q "torch==2.13.0"
fi
WANT=$(bash scripts/setup_stamp.sh)
if [ "${FORCE_SETUP:-0}" = "1" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] \
    || ! .venv/bin/python -c "import dcp" 2>/dev/null; then
  .venv/bin/pip install -q -e ".[dev]"
  echo "$WANT" > "$STAMP"
fi
# DeepSpeed builds its CPU shared-memory all-reduce op (deepspeed_shm_comm, C++) on first use; inside the test
# suite that first use fell in test_exact_gradients_deepspeed_zero1 and its build (~2 min on a loaded 2-core
# machine) ran past pytest's per-test limit. Build it here, once (torch's extension cache keeps it; a built op
# only loads: a few seconds).
# (find_spec, not an import: importing deepspeed logs "Setting accelerator to CPU ..." on stdout, which the demo
# and CI logs then opened with)
if .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then
  DS_ACCELERATOR=cpu .venv/bin/python - <<'PY'
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and builder.is_compatible():
    builder.load(verbose=False)
PY
fi
