#!/usr/bin/env bash
# The demo on a CUDA device: trains a small model with --verify and checks that the offloaded
# run and the resident run give the same bits and that the loss falls. Without a usable GPU it
# says why and exits 77 (CTest's SKIP_RETURN_CODE).
# Usage: demo_cuda.sh PATH/TO/tierflow
set -u
cli=${1:?usage: demo_cuda.sh PATH/TO/tierflow}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$cli" demo --device cuda --layers 4 --width 256 --batch 32 --samples 128 --steps 80 \
  --lr 3e-3 --window 1 --seed 7 --verify --json --out "$out/demo" >"$out/stdout" 2>"$out/stderr"
rc=$?
if [[ $rc -eq 2 ]] && grep -q "no usable CUDA device" "$out/stderr"; then
  echo "SKIPPED: $(head -n1 "$out/stderr")"
  exit 77
fi
if [[ $rc -ne 0 ]]; then
  echo "FAILED: tierflow demo --device cuda exited $rc"
  cat "$out/stderr" "$out/stdout"
  exit 1
fi
python3 - "$out/stdout" <<'PY'
import json, sys
doc = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
problems = []
if doc["backend"] != "cuda":
    problems.append(f"backend {doc['backend']}, expected cuda")
if not doc["verify"]["bit_identical"]:
    problems.append(f"offloaded and resident runs differ (max abs diff {doc['verify']['max_abs_diff']})")
if not doc["loss_last"] < doc["loss_first"] / 5:
    problems.append(f"loss fell only from {doc['loss_first']} to {doc['loss_last']}")
print(f"demo on cuda: loss {doc['loss_first']:.6f} -> {doc['loss_last']:.6f}, "
      f"bit_identical {doc['verify']['bit_identical']}, stall {doc['scheduler']['stall_fraction']:.3f}")
for p in problems:
    print("FAILED:", p)
sys.exit(1 if problems else 0)
PY
