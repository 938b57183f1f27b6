#!/usr/bin/env bash
# Print the setup stamp of this checkout: what scripts/setup.sh installs depends on pyproject.toml alone
# (the package is installed editable, so source edits need no reinstall). Used by setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v sha256sum >/dev/null 2>&1; then
  sha256sum pyproject.toml | cut -d' ' -f1
else
  shasum -a 256 pyproject.toml | cut -d' ' -f1   # macOS
fi
