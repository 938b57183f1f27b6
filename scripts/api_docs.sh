#!/usr/bin/env bash
# The API reference, generated from the docstrings with pdoc (pip install -e ".[dev]"): HTML in runs/api/
# (git-ignored), one page per module of the dcp package; open runs/api/index.html.
# Usage: bash scripts/api_docs.sh [OUT_DIR] [MODULE ...]   (defaults: runs/api, dcp and its public packages)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${1:-runs/api}"
shift || true
[ "$#" -gt 0 ] || set -- dcp dcp.config dcp.api dcp.planner dcp.profiler dcp.runtime dcp.models dcp.loaders dcp.sim dcp.integrations dcp.data dcp.distributed dcp.experiments
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -m pdoc --docformat markdown --no-show-source -o "$OUT" "$@"
echo "API reference: $OUT/index.html"
