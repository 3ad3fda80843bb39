#!/usr/bin/env bash
# The tree is clang-formatted (.clang-format). Skips (exit 77) where clang-format is absent.
set -euo pipefail
cd "$1"
if ! command -v clang-format >/dev/null 2>&1; then
  echo "SKIPPED: clang-format is not installed"
  exit 77
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' 2>/dev/null || find include lib bench tests examples -name '*.[ch]pp' 2>/dev/null)
clang-format --dry-run --Werror "${files[@]}"
echo "${#files[@]} files formatted"
