#!/usr/bin/env bash
# The main job: build tierflow (release) and show this machine's memory tiers.
# Usage: bash scripts/main.sh [tierflow topo options, e.g. --json]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
tierflow_install_packages

cmake --preset release >/dev/null
cmake --build --preset release
./build/release/bench/tierflow topo "$@"
