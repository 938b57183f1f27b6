#!/usr/bin/env bash
# Regenerate every paper figure (PNG + CSV) into ${1:-paper_figures/out}; about 1.5 minutes on 2 cores.
# Same as: dcp figures --out DIR
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
exec "$PY" -m dcp.cli figures --out "${1:-paper_figures/out}"
