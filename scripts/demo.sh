#!/usr/bin/env bash
# Set up (if needed) and run the main job: a small DCP-vs-baseline comparison on CPU processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/dcp demo "$@"
