#!/usr/bin/env bash
# Installs the Debian packages tierflow builds and tests with (QEMU, busybox and cpio for the
# multi-node VM test; clang 14 and its runtime for the fuzzers; torch and pytest for the Python
# package's tests; chromium to render the HTML reports in tests), when any is missing. Sourced by
# scripts/main.sh and scripts/test.sh; needs root (or sudo) only when something is missing.
set -euo pipefail

tierflow_packages=(
  build-essential cmake ninja-build pkg-config
  libhwloc-dev libnuma-dev
  catch2 libcli11-dev nlohmann-json3-dev
  qemu-system-x86 busybox-static cpio python3 python3-torch python3-pytest
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
