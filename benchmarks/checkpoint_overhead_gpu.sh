#!/usr/bin/env bash
# Issue 25 on a one-GPU machine, in one command (about 20 minutes on an H100: start it in the
# background and collect $OUT with later commands):
#   source .gpu/setup.sh && bash benchmarks/checkpoint_overhead_gpu.sh [--set KEY=VALUE ...]
# 1. benchmarks/checkpoint_overhead.py: h200_train_z1's shape (500 steps, a checkpoint every
#    200, validation every 100) with ddp, fsdp2 and DeepSpeed ZeRO-1, rank 0 killed with SIGKILL
#    at step 300 in each, on a learnable corpus (6,400 utterances, made once under $CORPUS).
# 2. benchmarks/strategy_sweep.py: ddp, fsdp2 (both reshard settings) and ZeRO 1/2/3 at that
#    shape (benchmarks/spaces/gpu_strategies.yaml), throughput and peak memory side by side.
# CKPT_STRATEGIES=ddp,fsdp2 to run fewer; CKPT_SWEEP=0 to skip step 2.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
CORPUS=${CORPUS:-/tmp/learnable_corpus}
R=${CKPT_ROOT:-/tmp/ckpt_overhead}
LM=$CORPUS/prepared/manifest_16k_trim.tsv
list_gpus
if [ ! -f "$LM" ]; then
  python -m data_prep.synth --output-root "$CORPUS/raw" --mode learnable --speakers 40 \
    --chapters 4 --utts 40 2>&1 | tail -2 | tee "$OUT/corpus.log"
  python -m data_prep.librispeech --input-root "$CORPUS/raw" --output-root "$CORPUS/prepared" \
    --trim --log-every 2000 2>&1 | tail -2 | tee -a "$OUT/corpus.log"
fi
df -h /dev/shm | tee "$OUT/shm.txt"
rc=0
rm -rf "$R"
python -m benchmarks.checkpoint_overhead --space h200_train_z1 --manifest "$LM" \
  --output-root "$R/train" --strategies "${CKPT_STRATEGIES:-ddp,fsdp2,deepspeed}" \
  --kill-at-step "${KILL_AT_STEP:-300}" --kill-rank 0 --set train_workers="$GPUS" "$@" \
  2>&1 | quiet | grep -v "^\s*$" | tee "$OUT/checkpoint_overhead.log" || rc=1
cp "$R"/train/checkpoint_overhead.* "$OUT/" 2>/dev/null
for s in "$R"/train/*/; do
  n=$(basename "$s")
  mkdir -p "$OUT/train_$n"
  for f in run_manifest.tsv; do cp "$s/$f" "$OUT/train_$n/" 2>/dev/null; done
  for d in checkpoints validation timing; do
    [ -e "$s/$d.parquet" ] && python -c "import pandas as pd; \
pd.read_parquet('$s/$d.parquet').to_csv('$OUT/train_$n/$d.csv', index=False)"
  done
  cp "$s"/runs/*/curves.png "$OUT/train_$n/" 2>/dev/null
done
if [ "${CKPT_SWEEP:-1}" = 1 ]; then
  python -m benchmarks.strategy_sweep --space benchmarks/spaces/gpu_strategies.yaml \
    --output-root "$R/sweep" --set manifest_path="$LM" --set train_workers="$GPUS" "$@" \
    2>&1 | quiet | tee "$OUT/strategy_sweep.log" || rc=1
  cp "$R"/sweep/strategy_sweep.* "$R"/sweep/run_manifest.tsv "$OUT/" 2>/dev/null
fi
exit $rc
