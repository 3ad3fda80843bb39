#!/usr/bin/env bash
# Fuzzes every target for a bounded time (default 20 s each), starting from its corpus.
# A crash, leak or hang fails the run; the input that caused it is left in build/fuzz/findings/
# and belongs in tests/fuzz/corpus/TARGET/ (as a regression test) once the bug is fixed.
# Usage: run_fuzzers.sh BUILD_DIR [SECONDS]
set -uo pipefail
build=$1 seconds=${2:-20}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
findings="$build/findings"
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
mkdir -p "$findings"
status=0
for target in fuzz_id_list fuzz_settings fuzz_specs fuzz_sysfs fuzz_hwloc_xml fuzz_checkpoint \
    fuzz_measured_cache fuzz_tune_plan; do
  work=$(mktemp -d)
  cp "$here/corpus/$target/"* "$work/"
  echo "== $target (${seconds}s)"
  if ! "$build/tests/fuzz/$target" "$work" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="$findings/$target-" -print_final_stats=1 \
      >"$findings/$target.log" 2>&1; then
    echo "FAILED: $target; its log ends:"
    tail -n 40 "$findings/$target.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$findings/$target.log" | tr '\n' ' '
    echo
  fi
  rm -rf "$work"
done
exit $status
