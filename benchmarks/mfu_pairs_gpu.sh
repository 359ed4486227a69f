#!/usr/bin/env bash
# An MFU budget A/B on one GPU, in one command through the device tool:
#   source .gpu/setup.sh && OLD="..." NEW="..." bash benchmarks/mfu_pairs_gpu.sh
# 1. benchmarks/mfu_budget.py with its parts and the whole step's top kernels for OLD, then NEW
#    (each after the shared options $P; stopped after BUDGET_LIMIT s, default 200); if a compiled
#    budget fails, the same with --compile default.
# 2. Then the whole step alone (--step-only), NEW and OLD alternately, until DEADLINE s after the
#    start (default 420): the pairs' step times and their ratios in $OUT/pairs.txt (with
#    PAIRS_P, other shared options than $P: e.g. --compile default where reduce-overhead failed).
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
t0=$(date +%s)
P=${P:---micro-batch 256 --audio-s 2.0 --text-tokens 64 --no-masks}
budget() {  # NAME OPTIONS...
  local name=$1; shift
  timeout "${BUDGET_LIMIT:-200}" python -m benchmarks.mfu_budget $P "$@" --kernels 25 \
    --json "$OUT/$name.json" > "$OUT/$name.md" 2> "$OUT/$name.log" \
    || { echo "$name: failed, again with --compile default" | tee -a "$OUT/pairs.txt";
         timeout "${BUDGET_LIMIT:-200}" python -m benchmarks.mfu_budget $P "$@" --compile default \
           --kernels 25 --json "$OUT/$name.json" > "$OUT/$name.md" 2>> "$OUT/$name.log"; }
  cat "$OUT/$name.md"
}
budget old $OLD
budget new $NEW
step_ms() {  # OPTIONS... -> the whole step's median ms (PAIRS_P: other shared options)
  timeout 150 python -m benchmarks.mfu_budget ${PAIRS_P:-$P} "$@" --step-only 2>/dev/null \
    | sed -n 's/^| step | \([0-9.]*\) .*/\1/p'
}
while [ $(( $(date +%s) - t0 )) -lt "${DEADLINE:-420}" ]; do
  new=$(step_ms $NEW); old=$(step_ms $OLD)
  python -c "import sys; n, o = float(sys.argv[1] or 'nan'), float(sys.argv[2] or 'nan'); print(f'pair: new {n:.1f} ms, old {o:.1f} ms, old/new {o / n:.3f}')" "$new" "$old" \
    | tee -a "$OUT/pairs.txt"
done
