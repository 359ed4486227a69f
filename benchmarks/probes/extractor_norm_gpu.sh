#!/usr/bin/env bash
# Issue 56 on one GPU, in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/probes/extractor_norm_gpu.sh
# 1. benchmarks.kernel_probes $PROBES --trace 8 (default groupnorm; empty skips it): the first
#    GroupNorm + GELU alone, torch ops (eager, compiled) against norm_gelu's Triton kernels
#    (eager, compiled), each form's result against eager's, and the top kernels of the compiled
#    and Triton forms ($OUT/gn_probe.md); `tiles` times the kernels' tiles.
# 2. The platform's compiled best with the GEMM feature encoder, extractor_norm torch then
#    triton (benchmarks/spaces/h200_extractor_norm.yaml, REPEATS alternating pairs, default 1), 3
#    profiled steps a run, stopped with SIGINT after SWEEP_LIMIT s (default 300); the ranking, manifest and per_run_metrics.csv
#    (MFU, audio s/s) under $OUT/norm_*, and the profiled steps' kernels and idle gaps
#    (benchmarks.step_profile --kernels 25 --gaps 15, $OUT/norm_kernels.md).
# 3. benchmarks.mfu_budget of the new point (BUDGET_LIMIT s, default 150; 0 skips it): the parts
#    and the whole step, default compile, joined with the triton run's idle time ($OUT/budget.md).
set -u -o pipefail
source "$(dirname "$0")/../gpu_common.sh"
list_gpus
PROBES=${PROBES-groupnorm}
[ -n "$PROBES" ] && timeout 240 python -m benchmarks.kernel_probes $PROBES --trace 8 2>&1 \
  | tee "$OUT/gn_probe.md"
make_corpus
rm -rf /tmp/norm
timeout -s INT "${SWEEP_LIMIT:-300}" python -m platform.tune \
  --space benchmarks/spaces/h200_extractor_norm.yaml --output-root /tmp/norm \
  --set manifest_path=$M --set train_workers=$GPUS --set profile_steps=3 \
  --set repeats="${REPEATS:-1}" --no-history 2>&1 \
  | quiet | tee "$OUT/norm.log"
for f in run_manifest.tsv ranked_groups.csv per_run_metrics.csv summary.md; do
  cp "/tmp/norm/$f" "$OUT/norm_$f" 2>/dev/null
done
if ls /tmp/norm/runs/*/profile-rank0.json > /dev/null 2>&1; then
  python -m benchmarks.step_profile /tmp/norm/runs/*/profile-rank0.json --kernels 25 --gaps 15 \
    > "$OUT/norm_kernels.md" 2>&1
fi
[ "${BUDGET_LIMIT:-150}" = 0 ] && exit 0
# The parts' kernels are the same with or without CUDA graphs: the budget compiles them by
# default (its reduce-overhead form still fails: results/extractor_norm_1xh200/
# mfu_budget_reduce_overhead_error.txt) and takes the idle time from the triton run's profile.
TRACE=$(ls /tmp/norm/runs/*triton*_r1/profile-rank0.json 2>/dev/null | head -1)
timeout "${BUDGET_LIMIT:-150}" python -m benchmarks.mfu_budget --micro-batch 256 --audio-s 2.0 \
  --text-tokens 64 --no-masks --dropout 0 --pos-conv matmul --extractor-layout matmul \
  --extractor-norm triton --compile default ${TRACE:+--profile "$TRACE"} \
  --json "$OUT/budget.json" > "$OUT/budget.md" 2> "$OUT/budget.log"
cat "$OUT/budget.md"; tail -3 "$OUT/budget.log"
