#!/usr/bin/env bash
# Installs the Debian packages tierflow builds and tests with (QEMU, busybox and cpio for the
# multi-node VM test; clang 14 and its runtime for the fuzzers; torch and pytest for the Python
# package's tests; chromium to render the HTML reports in tests), when any is missing, and makes
# the torch venv the Python tests run in a second time. Sourced by scripts/main.sh and
# scripts/test.sh; needs root (or sudo) only when a Debian package is missing.
set -euo pipefail

tierflow_packages=(
  build-essential cmake ninja-build pkg-config
  libhwloc-dev libnuma-dev
  catch2 libcli11-dev nlohmann-json3-dev
  qemu-system-x86 busybox-static cpio python3 python3-torch python3-pytest python3-venv
  clang-14 libclang-rt-14-dev clang-format chromium
)

tierflow_install_packages() {
  local missing=()
  local pkg
  for pkg in "${tierflow_packages[@]}" "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "tierflow: installing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# The virtual environment with the newest torch, numpy and pytest from PyPI, beside Debian's
# python3-torch 1.13: outside the clone, made once per machine and kept between runs.
# TIERFLOW_TORCH_VENV moves it.
tierflow_torch_venv_dir() {
  echo "${TIERFLOW_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tierflow/torch-venv}"
}

# Makes the torch venv when it is missing or lacks a package, with the first python3 on PATH
# (pyenv's where there is one, else Debian's); fails when PyPI cannot be reached.
tierflow_make_torch_venv() {
  local venv
  venv=$(tierflow_torch_venv_dir)
  if "$venv/bin/python" -c "import torch, numpy, pytest" 2>/dev/null; then
    return 0
  fi
  echo "tierflow: making the torch venv $venv (torch, numpy, pytest from PyPI; once per machine)"
  # Chained, not left to set -e: a caller may test this function's status (set -e is off then).
  python3 -m venv "$venv" &&
    "$venv/bin/python" -m pip install -q --disable-pip-version-check torch numpy pytest &&
    "$venv/bin/python" -c 'import torch; print("tierflow: torch venv with torch", torch.__version__)'
}
