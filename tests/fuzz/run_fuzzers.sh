#!/usr/bin/env bash
# Fuzzes every target for a bounded time (default 20 s each), starting from its corpus.
# A crash, leak or hang fails the run; the input that caused it is left in BUILD_DIR/findings/
# and belongs in tests/fuzz/corpus/TARGET/ (as a regression test) once the bug is fixed.
# Every target has a corpus folder (tests/fuzz/corpus/TARGET); a target with a dictionary
# (tests/fuzz/TARGET.dict) is fuzzed with it.
# Usage: run_fuzzers.sh BUILD_DIR [SECONDS] [TARGET...] (default: every target)
set -uo pipefail
build=$1 seconds=${2:-20}
shift $(($# < 2 ? $# : 2))
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for dir in "$here"/corpus/*/; do
    targets+=("$(basename "$dir")")
  done
fi
findings="$build/findings"
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
mkdir -p "$findings"
status=0
for target in "${targets[@]}"; do
  work=$(mktemp -d)
  dict=()
  if [ -f "$here/$target.dict" ]; then
    dict=(-dict="$here/$target.dict")
  fi
  cp "$here/corpus/$target/"* "$work/"
  echo "== $target (${seconds}s)"
  if ! "$build/tests/fuzz/$target" "$work" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
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
