#!/usr/bin/env bash
# Issue 42 on a GPU host, in one command through the device tool (a 2-GPU kind):
#   source .gpu/setup.sh && bash benchmarks/reference_compare_gpu.sh
# 1. benchmarks.reference_compare on every GPU: each strategy's reference (torchrun DDP and
#    FSDP2 the torchtitan way, DeepSpeed's launcher for ZeRO-1/2) and the platform at the same
#    point (synthetic 2 s audio, 48 tokens, mb 128 per GPU, bf16, eager), a profiler window of
#    5 steps on each side: $OUT/reference_compare.{md,json,log}, the traces' summary in the .md.
# 2. FSDP2 with regional compile against compiled DDP, without and with CUDA graphs
#    (benchmarks/spaces/compiled_ddp_fsdp2.yaml through benchmarks.strategy_sweep):
#    $OUT/compiled.{md,json,log}. RC_COMPILED=0 leaves it out.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
rm -rf /tmp/rc /tmp/rc_compiled
python -m benchmarks.reference_compare --nproc "$GPUS" --profile-steps 5 --output-root /tmp/rc \
  "$@" 2>&1 | quiet | tee "$OUT/reference_compare.log"
cp /tmp/rc/reference_compare.md /tmp/rc/reference_compare.json "$OUT/" 2>/dev/null
[ "${RC_COMPILED:-1}" = 0 ] && exit 0
python -m benchmarks.strategy_sweep --space benchmarks/spaces/compiled_ddp_fsdp2.yaml \
  --output-root /tmp/rc_compiled --set train_workers="$GPUS" 2>&1 | quiet | tee "$OUT/compiled.log"
cp /tmp/rc_compiled/strategy_sweep.md "$OUT/compiled.md" 2>/dev/null
cp /tmp/rc_compiled/strategy_sweep.json "$OUT/compiled.json" 2>/dev/null
