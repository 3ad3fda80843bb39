#!/usr/bin/env bash
# Makes the peers benchmark's own virtual environment (torch for the CPU, numpy, DeepSpeed,
# ninja, py-cpuinfo), apart from the torch venv the test suite uses: DeepSpeed never goes there.
# Idempotent: does nothing when the venv already imports what the benchmark needs.
#
#   bench/peers/make_venv.sh            # ${XDG_CACHE_HOME:-~/.cache}/tierflow/peers-venv
#   TIERFLOW_PEERS_VENV=/some/dir bench/peers/make_venv.sh
#
# torch comes from PyTorch's CPU index (a smaller wheel); when that index cannot be reached,
# from PyPI's default. DeepSpeed is installed with DS_BUILD_OPS=0: its cpu_adam op is
# JIT-compiled (ninja, g++) on first use, into ~/.cache/torch_extensions.
set -euo pipefail

venv="${TIERFLOW_PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tierflow/peers-venv}"
check='import torch, numpy, cpuinfo, ninja, deepspeed'

if [ -x "$venv/bin/python" ] && DS_ACCELERATOR=cpu "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "peers venv: $venv (present)"
  exit 0
fi

echo "peers venv: making $venv with $(command -v python3) ($(python3 --version 2>&1))"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip setuptools wheel
if ! "${pip[@]}" --retries 1 --timeout 20 torch \
    --index-url https://download.pytorch.org/whl/cpu; then
  echo "peers venv: PyTorch's CPU index unreachable; torch from PyPI's default index"
  "${pip[@]}" torch
fi
"${pip[@]}" numpy ninja py-cpuinfo
DS_BUILD_OPS=0 "${pip[@]}" deepspeed
DS_ACCELERATOR=cpu "$venv/bin/python" -c 'import torch, deepspeed
print("peers venv: torch", torch.__version__, "deepspeed", deepspeed.__version__)'
