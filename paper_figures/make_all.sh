#!/usr/bin/env bash
# Refresh the committed paper figures (PNG + CSV) in paper_figures/out, or write them to OUT_DIR if given;
# about 1.5 minutes on 2 cores. Same as: dcp figures --update-committed  (or: dcp figures --out OUT_DIR)
# The figures are deterministic: a refresh of unchanged code leaves `git status` clean.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ $# -ge 1 ]; then
  exec "$PY" -m dcp.cli figures --out "$1"
fi
exec "$PY" -m dcp.cli figures --update-committed
