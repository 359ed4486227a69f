#!/usr/bin/env bash
# Issue 56 item 1 on a GPU host, in one command through the device tool (a 2-GPU kind):
#   source .gpu/setup.sh && bash benchmarks/mfu_budget_gpu.sh
# The MFU budget of the best point's shapes (micro-batch 256 per GPU, 2 s audio: the mean of the
# 1-3 s crop buckets, 64 tokens, bf16) on one GPU, eager and compiled (benchmarks/mfu_budget.py),
# then the bare DDP step on every GPU (benchmarks/strategy_reference.py under torchrun, eager and
# regional compile) with a profiler window, summarised by benchmarks/step_profile.py: the
# communication the step waited for and the GPU's idle time, which the one-GPU budget cannot
# show. MB_POINT="--micro-batch N --audio-s S --text-tokens T" changes the point.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
POINT=${MB_POINT:---micro-batch 256 --audio-s 2.0 --text-tokens 64}
for mode in none default; do
  echo "== budget, compile $mode" | tee -a "$OUT/mfu_budget.md"
  timeout 200 python -m benchmarks.mfu_budget $POINT --compile $mode \
    --json "$OUT/budget_$mode.json" 2> "$OUT/budget_$mode.log" | tee -a "$OUT/mfu_budget.md"
done
for compile in eager default; do
  flag=(); [ "$compile" = eager ] || flag=(--compile "$compile")
  echo "== bare DDP on $GPUS GPUs, $compile" | tee -a "$OUT/mfu_budget.md"
  timeout 150 python -m torch.distributed.run --standalone --nproc_per_node="$GPUS" \
    -m benchmarks.strategy_reference --strategy ddp $POINT --warmup-steps 10 --steps 40 \
    --window 10 --tail 3 "${flag[@]}" --profile "$OUT/ddp_$compile.trace.json" --profile-steps 5 \
    --json "$OUT/ddp_$compile.json" > "$OUT/ddp_$compile.log" 2>&1
  tail -3 "$OUT/ddp_$compile.log" | tee -a "$OUT/mfu_budget.md"
  python -m benchmarks.step_profile "$OUT/ddp_$compile.trace.json" | tee -a "$OUT/mfu_budget.md"
done
gzip -f "$OUT"/*.trace.json 2>/dev/null
