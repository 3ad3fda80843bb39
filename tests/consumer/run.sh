#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds tests/consumer against it twice:
# with find_package(tierflow CONFIG) and with pkg-config. Both must classify a fixture.
# Usage: run.sh BUILD_DIR SOURCE_DIR CXX_COMPILER [CXX_FLAGS]
set -euo pipefail
build=$1 source=$2 cxx=$3 cxxflags=${4:-}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
fixture="$source/tests/data/sysfs/two_socket_cxl"
expected="dram0 remote_dram0 cxl0 cxl1"

cmake --install "$build" --prefix "$prefix/usr" >/dev/null

cmake -S "$source/tests/consumer" -B "$prefix/cmake-build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$cxxflags" -DCMAKE_EXE_LINKER_FLAGS="$cxxflags" >/dev/null
cmake --build "$prefix/cmake-build" >/dev/null
got=$("$prefix/cmake-build/consumer" "$fixture" | xargs)
echo "find_package consumer: $got"
[ "$got" = "$expected" ] || { echo "expected: $expected"; exit 1; }

export PKG_CONFIG_PATH="$prefix/usr/lib/pkgconfig:$prefix/usr/lib64/pkgconfig:$prefix/usr/lib/x86_64-linux-gnu/pkgconfig"
# shellcheck disable=SC2046
# shellcheck disable=SC2086
"$cxx" $cxxflags -o "$prefix/pc-consumer" "$source/tests/consumer/main.cpp" \
  $(pkg-config --cflags tierflow) $(pkg-config --libs --static tierflow)
got=$("$prefix/pc-consumer" "$fixture" | xargs)
echo "pkg-config consumer: $got"
[ "$got" = "$expected" ] || { echo "expected: $expected"; exit 1; }
