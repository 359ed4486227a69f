#!/usr/bin/env bash
# Issue 56 on one GPU, in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/probes/fuse_linears_gpu.sh
# 1. PROBES (default "gemm posconv"; empty skips them): benchmarks.gemm_ceiling (the model's
#    GEMM shapes, q/k/v fused among them; $OUT/gemm.md), benchmarks.kernel_probes posconv at
#    mb 256 and 512 (block lengths 8, 16, 32; $OUT/posconv.md) and firstlayer (the feature
#    encoder's first layer unfolded and folded, at mb 256 with its kernels and folded_layer's
#    tiles, then at mb 512 unless FIRSTLAYER_512=0; $OUT/firstlayer.md) and extractor (the
#    feature encoder's strided convolutions as strided_conv's ops and as torch ops, at mb 256
#    and 512, with their kernels; $OUT/extractor.md).
# 2. The sweep of SPACE (default benchmarks/spaces/h200_fuse_linears.yaml), REPEATS alternated
#    rounds (default 2), 3 profiled steps a run, stopped with SIGINT after SWEEP_LIMIT s (default
#    420, and at most CALL_LIMIT - 40 s from the script's start where CALL_LIMIT is set: the
#    device call's limit); RESUME=1 goes on with the sweep a cut call left in /tmp (the same
#    warm machine).
#    Ranking, manifest and per_run_metrics.csv (MFU, audio s/s) under $OUT/sweep_*, the
#    profiled steps' kernels and idle gaps (first round) in $OUT/sweep_kernels.md.
# 3. benchmarks.mfu_budget of the point with q/k/v fused (mb 256, 2 s, default compile; BUDGET_LIMIT
#    s, default 150; 0 skips it), joined with the fused run's profile ($OUT/budget.md).
set -u -o pipefail
source "$(dirname "$0")/../gpu_common.sh"
list_gpus
for probe in ${PROBES-gemm posconv}; do
  case $probe in
    gemm) timeout 120 python -m benchmarks.gemm_ceiling 2>&1 | tee "$OUT/gemm.md" ;;
    posconv) for mb in 256 512; do
        timeout 150 python -m benchmarks.kernel_probes posconv --micro-batch $mb --iters 10 2>&1
      done | tee "$OUT/posconv.md" ;;
    firstlayer) { timeout 200 python -m benchmarks.kernel_probes firstlayer --trace 8 --tiles 2>&1
        [ "${FIRSTLAYER_512:-1}" = 1 ] && timeout 100 python -m benchmarks.kernel_probes \
          firstlayer --micro-batch 512 2>&1
      } | tee "$OUT/firstlayer.md" ;;
    extractor) timeout 150 python -m benchmarks.kernel_probes extractor --micro-batch 512 --trace 10 \
        2>&1 | tee "$OUT/extractor.md" ;;
  esac
done
make_corpus
ROOT=/tmp/sweep
RUN=(--set repeats="${REPEATS:-2}")  # a resume names the sweep as it started
if [ "${RESUME:-0}" = 1 ]; then RUN+=(--resume); else rm -rf $ROOT; fi
LIMIT=${SWEEP_LIMIT:-420}
if [ -n "${CALL_LIMIT:-}" ] && [ $((CALL_LIMIT - 40 - SECONDS)) -lt "$LIMIT" ]; then
  LIMIT=$((CALL_LIMIT - 40 - SECONDS))
fi
timeout -s INT "$LIMIT" python -m platform.tune \
  --space "${SPACE:-benchmarks/spaces/h200_fuse_linears.yaml}" --output-root $ROOT \
  --set manifest_path=$M --set train_workers=$GPUS --set profile_steps=3 "${RUN[@]}" \
  --no-history 2>&1 | quiet | tee "$OUT/sweep.log"
for f in run_manifest.tsv ranked_groups.csv per_run_metrics.csv summary.md; do
  cp "$ROOT/$f" "$OUT/sweep_$f" 2>/dev/null
done
if ls $ROOT/runs/*_r1/profile-rank0.json > /dev/null 2>&1; then
  python -m benchmarks.step_profile $ROOT/runs/*_r1/profile-rank0.json --kernels 25 --gaps 12 \
    > "$OUT/sweep_kernels.md" 2>&1
fi
[ "${BUDGET_LIMIT:-150}" = 0 ] && exit 0
TRACE=$(ls $ROOT/runs/*mb256*fuselinearson_r1/profile-rank0.json 2>/dev/null | head -1)
timeout "${BUDGET_LIMIT:-150}" python -m benchmarks.mfu_budget --micro-batch 256 --audio-s 2.0 \
  --text-tokens 64 --no-masks --dropout 0 --pos-conv matmul --extractor-layout matmul \
  --extractor-norm triton --compile default --fuse-linears ${TRACE:+--profile "$TRACE"} \
  --json "$OUT/budget.json" > "$OUT/budget.md" 2> "$OUT/budget.log"
cat "$OUT/budget.md"; tail -3 "$OUT/budget.log"
