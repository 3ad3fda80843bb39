#!/usr/bin/env bash
# Builds tierflow with its tests (dev preset) and runs the whole suite with CTest (the Python
# suite twice: Debian's torch 1.13 and the newest torch from PyPI, in a venv made once).
# Usage: bash scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
tierflow_install_packages
# The Python suite runs a second time in this venv (CTest python_torch_venv); without it, that
# run is reported skipped.
tierflow_make_torch_venv ||
  echo "tierflow: no torch venv (PyPI unreachable?); python_torch_venv will be skipped"

cmake --preset dev
cmake --build --preset dev
ctest --preset dev "$@"
