#!/usr/bin/env bash
# Runs pytest with the arguments given under the torch venv's interpreter (the newest torch from
# PyPI, beside Debian's python3-torch 1.13; scripts/setup.sh makes the venv). Exits 77, which
# CTest reports as skipped, with the reason when there is no such venv.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/setup.sh"
venv=$(tierflow_torch_venv_dir)
if ! "$venv/bin/python" -c "import torch, pytest" 2>/dev/null; then
  echo "skipped: no venv with torch and pytest at $venv (bash scripts/test.sh makes it;" \
    "TIERFLOW_TORCH_VENV moves it)"
  exit 77
fi
"$venv/bin/python" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")'
exec "$venv/bin/python" -m pytest "$@"
