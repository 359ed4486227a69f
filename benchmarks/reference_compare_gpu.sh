#!/usr/bin/env bash
# Issues 42 and 53 on a GPU host, in one command through the device tool (a 2-GPU kind):
#   source .gpu/setup.sh && RC_PAIRS=1 RC_STRATEGIES=ddp,fsdp2,zero1,zero2 \
#     bash benchmarks/reference_compare_gpu.sh [--variant NAME=BASE:KEY=VALUE ...]
# benchmarks.reference_compare on every GPU: RC_PAIRS turns of each strategy's reference
# (torchrun DDP and FSDP2 the torchtitan way, DeepSpeed's launcher for ZeRO-1/2, regional
# compile for ddp_compiled, fsdp2_compiled, ddp_cudagraphs, fsdp2_cudagraphs) then the platform
# at the same point (synthetic 2 s audio, 48 tokens, mb 128 per GPU, bf16); RC_PROFILE=5 adds a
# profiler window of 5 steps on each side of the first turn. An eager turn of the four
# strategies takes about 250 s on 2x H200, a compiled one more: split --pairs 3 over calls and
# put the turns together with `python -m benchmarks.reference_compare --combine A B C`.
# Writes $OUT/reference_compare.{md,json,log}; RC_TIMEOUT (default 540 s) bounds the command so
# the finished turns come back.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
rm -rf /tmp/rc
timeout "${RC_TIMEOUT:-540}" python -m benchmarks.reference_compare --nproc "$GPUS" \
  --pairs "${RC_PAIRS:-1}" --strategies "${RC_STRATEGIES:-ddp,fsdp2,zero1,zero2}" \
  --profile-steps "${RC_PROFILE:-0}" --output-root /tmp/rc "$@" 2>&1 | quiet \
  | grep -v "INFO\] \[launch" > "$OUT/reference_compare.log"
cp /tmp/rc/reference_compare.md /tmp/rc/reference_compare.json "$OUT/" 2>/dev/null
cat "$OUT/reference_compare.md"
