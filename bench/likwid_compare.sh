#!/usr/bin/env bash
# tierflow bench against likwid-bench, side by side in one run (BENCHMARKS.md, "tierflow bench
# accuracy"): node_read vs load_avx512 and node_copy vs copy_avx512 over the same working set,
# on the same threads, alternating the two tools round by round so drift hits both alike.
# likwid-bench's buffers are plain malloc memory: 4 KiB pages when THP is in `madvise` mode, so
# tierflow runs with --no-huge-pages for the comparison, and once more with huge pages (its
# default) to show what they are worth on this machine.
# Prints one table: medians (GB/s = 10^9 B/s), their spread, and tierflow / likwid.
# Usage: bench/likwid_compare.sh [TIERFLOW_BINARY] [ROUNDS] [THREADS...]
# Installs likwid (Debian package) when missing; needs root for that.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tierflow=${1:-$here/build/release/bin/tierflow}
rounds=${2:-5}
shift $(( $# > 2 ? 2 : $# ))
threads=("$@")
if [ ${#threads[@]} -eq 0 ]; then
  threads=(1 "$(nproc)")
fi
[ -x "$tierflow" ] || { echo "likwid_compare: no tierflow binary at $tierflow (build the release preset)" >&2; exit 2; }
if ! command -v likwid-bench >/dev/null; then
  source "$here/scripts/setup.sh"
  tierflow_install_packages likwid
fi
# Working set: 1 GB in all, as likwid-bench's -w S0:1GB:N (load: one 1 GB array; copy: two
# arrays of 512 MB); tierflow's --buffer-mib is per array.
likwid_mbps() {  # test threads
  likwid-bench -t "$1" -w "S0:1GB:$2" 2>/dev/null | awk '/^MByte\/s:/ {print $2}'
}
tierflow_gbps() {  # case buffer_mib threads [flags]
  "$tierflow" bench --case "$1" --buffer-mib "$2" --threads "$3" --samples 5 --no-cache --csv \
    "${@:4}" |
    awk -F, -v c="$1" '$1 == c && $2 == "ok" {print $4}'
}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for t in "${threads[@]}"; do
  for r in $(seq "$rounds"); do
    echo "read $t likwid $(likwid_mbps load_avx512 "$t" | awk '{print $1 / 1000}')" >>"$results"
    echo "read $t tierflow $(tierflow_gbps node_read 954 "$t" --no-huge-pages)" >>"$results"
    echo "read $t huge $(tierflow_gbps node_read 954 "$t")" >>"$results"
    echo "copy $t likwid $(likwid_mbps copy_avx512 "$t" | awk '{print $1 / 1000}')" >>"$results"
    echo "copy $t tierflow $(tierflow_gbps node_copy 477 "$t" --no-huge-pages)" >>"$results"
    echo "copy $t huge $(tierflow_gbps node_copy 477 "$t")" >>"$results"
    echo "round $r of $rounds, $t thread(s) done" >&2
  done
done
/usr/bin/env python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    what, threads, tool, value = line.split()
    rows.setdefault((what, int(threads)), {}).setdefault(tool, []).append(float(value))
print("| case | likwid test | threads | likwid GB/s median [min-max] | tierflow GB/s, 4 KiB pages "
      "| tierflow / likwid | tierflow GB/s, huge pages |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for (what, threads), tools in sorted(rows.items()):
    lk, tf, hp = tools["likwid"], tools["tierflow"], tools["huge"]
    ml, mt, mh = statistics.median(lk), statistics.median(tf), statistics.median(hp)
    name = "node_read" if what == "read" else "node_copy"
    test = "load_avx512" if what == "read" else "copy_avx512"
    print(f"| {name} | {test} | {threads} | {ml:.2f} [{min(lk):.2f}-{max(lk):.2f}] "
          f"| {mt:.2f} [{min(tf):.2f}-{max(tf):.2f}] | {mt / ml:.3f} "
          f"| {mh:.2f} [{min(hp):.2f}-{max(hp):.2f}] |")
PY
