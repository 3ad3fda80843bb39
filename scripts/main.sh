#!/usr/bin/env bash
# The main job: build tierflow (release), show this machine's memory tiers, and train the demo
# model with its weights streamed from a host tier and its Adam state offloaded, checked bit
# for bit against the same training with everything resident in HBM.
# Usage: bash scripts/main.sh [tierflow demo options, e.g. --steps 100 --json]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
tierflow_install_packages

cmake --preset release >/dev/null
cmake --build --preset release --target tierflow_tool tierflow_python
./build/release/bin/tierflow topo
echo
./build/release/bin/tierflow demo --verify "$@"
echo
# The same job in PyTorch: a transformer's weights streamed from a host tier, its Adam state
# offloaded, checked bit for bit against the same training without offload.
PYTHONPATH=build/release/python TIERFLOW_LOG=warning /usr/bin/python3 examples/torch_train_offload.py --verify
