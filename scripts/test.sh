#!/usr/bin/env bash
# Builds tierflow with its tests (dev preset) and runs the whole suite with CTest.
# Usage: bash scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
tierflow_install_packages

cmake --preset dev
cmake --build --preset dev
ctest --preset dev "$@"
