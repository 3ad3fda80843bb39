#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds tests/consumer against it twice:
# with find_package(tierflow CONFIG) and with pkg-config. Both must classify a fixture. Then the
# C consumer against the shared library (both ways), and the shared library's exports: the C
# ABI only.
# Usage: run.sh BUILD_DIR SOURCE_DIR CXX_COMPILER [CXX_FLAGS [C_COMPILER [C_LINK_FLAGS]]] (the
# build's compilers and flags: the asan preset's clang flags and sanitizer runtimes are not gcc's;
# C_LINK_FLAGS, what a C program linking the library needs on top of them there)
set -euo pipefail
build=$1 source=$2 cxx=$3 cxxflags=${4:-} cc=${5:-cc} clinkflags=${6:-}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
fixture="$source/tests/data/sysfs/two_socket_cxl"
expected="dram0 remote_dram0 cxl0 cxl1"

cmake --install "$build" --prefix "$prefix/usr" >/dev/null

cmake -S "$source/tests/consumer" -B "$prefix/cmake-build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_CXX_FLAGS="$cxxflags" -DCMAKE_EXE_LINKER_FLAGS="$cxxflags $clinkflags" >/dev/null
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

version=$(sed -n 's/^project(tierflow VERSION \([0-9.]*\).*/\1/p' "$source/CMakeLists.txt")
got=$("$prefix/cmake-build/c_consumer")
echo "find_package C consumer: $got"
[ "$got" = "tierflow-c $version" ] || { echo "expected: tierflow-c $version"; exit 1; }
# shellcheck disable=SC2046
"$cc" $cxxflags -o "$prefix/pc-c-consumer" "$source/tests/consumer/c_consumer.c" \
  $(pkg-config --cflags --libs tierflow-c) -Wl,-rpath,"$(pkg-config --variable=libdir tierflow-c)" \
  $clinkflags
got=$("$prefix/pc-c-consumer")
echo "pkg-config C consumer: $got"
[ "$got" = "tierflow-c $version" ] || { echo "expected: tierflow-c $version"; exit 1; }
so=$(find "$prefix/usr" -name 'libtierflow.so.*.*' | head -n 1)
soname=$(objdump -p "$so" | awk '$1 == "SONAME" {print $2}')
echo "shared library: $so, SONAME $soname"
[ "$soname" = "libtierflow.so.${version%%.*}" ] || { echo "expected SONAME libtierflow.so.${version%%.*}"; exit 1; }
others=$(nm -D --defined-only "$so" | awk '$2 ~ /[TDBRVW]/ && $3 !~ /^tf_/ {print $3}' | head -n 5)
[ -z "$others" ] || { echo "libtierflow.so exports more than tf_*: $others"; exit 1; }
