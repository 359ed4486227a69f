#!/usr/bin/env bash
# Issue 56's new levers on a 2-GPU host, in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/new_levers_gpu.sh
# 1. The sweep $SPACE (default benchmarks/spaces/h200_new_levers.yaml: each lever alone against
#    today's best, then together; the mainline as the baseline), stopped with SIGINT after
#    SWEEP_LIMIT s (default 420: the ranking is kept); its console, manifest, ranking and
#    summary under $OUT (per_run_metrics.csv: each run's MFU and audio s/s); with PROFILE=N, N
#    profiled steps a run and their top kernels ($OUT/kernels.md). A sweep longer than one
#    device call: run it again with RESUME=1 on the same warm machine (the corpus and the
#    output root stay in /tmp there; --resume runs what is left); BUDGET_LIMIT=0 skips step 2.
# 2. The MFU budget (benchmarks/mfu_budget.py, parts) of an old and a new point, one on each
#    GPU at once (each stopped after BUDGET_LIMIT s, default 300: at 150 s neither had finished
#    on 2x H200; one after the other on one H200, 135 s each): by default the issue's old
#    best (mb 256, compiled) and the new one (mb 512, dropout 0, the convolution levers, the
#    first layer folded, q/k/v fused, compiled), parts compiled alone by default (the budget
#    cannot run CUDA graphs); OLD and NEW replace the options after the shared ones
#    (micro-batch 256, 2 s, 64 tokens, no masks).
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
[ -z "${RESUME:-}" ] && rm -rf /tmp/levers
PROFILE_SET=()
[ -n "${PROFILE:-}" ] && PROFILE_SET=(--set "profile_steps=$PROFILE")
timeout -s INT "${SWEEP_LIMIT:-420}" python -m platform.tune \
  --space "${SPACE:-benchmarks/spaces/h200_new_levers.yaml}" --output-root /tmp/levers \
  --set manifest_path=$M --set train_workers=$GPUS "${PROFILE_SET[@]}" --no-history \
  ${RESUME:+--resume} 2>&1 \
  | quiet | tee "$OUT/levers.log"
for f in run_manifest.tsv ranked_groups.csv per_run_metrics.csv summary.md summary.json; do
  cp /tmp/levers/$f "$OUT/" 2>/dev/null
done
# PROFILE=N: each run's profiled steps (second window, out of the tail), summarised with its
# top kernels and what the GPU waited for when idle (the traces stay on the machine).
if [ -n "${PROFILE:-}" ] && ls /tmp/levers/runs/*/profile-rank0.json > /dev/null 2>&1; then
  python -m benchmarks.step_profile /tmp/levers/runs/*/profile-rank0.json --kernels 25 --gaps 15 \
    > "$OUT/kernels.md" 2>&1
fi
[ "${BUDGET_LIMIT:-300}" = 0 ] && exit 0
P="--micro-batch 256 --audio-s 2.0 --text-tokens 64 --no-masks"
OLD=${OLD:---compile default}
NEW=${NEW:---micro-batch 512 --dropout 0 --pos-conv matmul --extractor-layout matmul \
  --extractor-norm folded --compile default --fuse-linears}
CUDA_VISIBLE_DEVICES=0 timeout ${BUDGET_LIMIT:-300} python -m benchmarks.mfu_budget $P $OLD \
  --json "$OUT/budget_old.json" > "$OUT/budget_old.md" 2> "$OUT/budget_old.log" &
CUDA_VISIBLE_DEVICES=1 timeout ${BUDGET_LIMIT:-300} python -m benchmarks.mfu_budget $P $NEW \
  --json "$OUT/budget_new.json" > "$OUT/budget_new.md" 2> "$OUT/budget_new.log" &
wait
cat "$OUT/budget_old.md" "$OUT/budget_new.md"
