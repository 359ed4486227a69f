#!/usr/bin/env bash
# Time to answer on a one-GPU machine (H100/H200), through the device tool, in one command:
#   source .gpu/setup.sh && bash benchmarks/time_to_answer_gpu.sh [--set KEY=VALUE ...]
# The space (default h200_fastest, TTA_SPACE=...) as the 6-run 150-step eager sweep (repeats=1,
# torch_compile=false: h200_fastest's two compiled cases with default mode become the same case
# as their eager twin and are merged, 7 cases -> 6 runs; the duration-batches case, added since,
# runs eagerly too), once with fresh worker processes per run
# and once with one resident worker group (benchmarks/time_to_answer.py), on every GPU of the
# machine (train_workers = GPUs), with the generated 2-8 s corpus. Optional phases:
#   TTA_RACE=1     the same sweep also as a race (--schedulers fifo,race): race / grid wall
#   TTA_COMPILE=1  one compiled case (h200_fastest's mb256 crop-bucket case) x 2 repeats, so the
#                  second run's time to first window with a warm compile cache shows
#   TTA_MAIN=0     skip the eager phase;  TTA_LIMIT=S  stop each phase after S seconds
# Results under $OUT: time_to_answer.{json,md} (race: time_to_answer_race.*, compile:
# time_to_answer_compile.*), the logs, and each sweep's manifest, groups.json and summary.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
SPACE=${TTA_SPACE:-h200_fastest}
R=/tmp/tta_$SPACE
list_gpus
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 |
  grep -oiE 'h100|h200|a100|l40s|[0-9]{4}' | head -1 | tr 'A-Z' 'a-z')
LABEL=${GPUS}x${GPU:-gpu}
make_corpus
COMMON=(--set manifest_path=$M --set train_workers=$GPUS --set max_steps=150 --label "$LABEL")
# h200_fastest's compiled mb256 crop-bucket case alone: every key its cases vary, fixed.
ONE_CASE=(--set micro_batch=256 --set crop_buckets_s=1.0,1.5,2.0,2.5,3.0 --set compile_mode=default
  --set optimizer=adamw_torch --set bucket_mb=25 --set ddp_gradient_as_bucket_view=false
  --set batching=count --set batch_audio_s=0 --set batch_max_pad=0.1)
rc=0

# phase NAME ARGS...: one benchmark into $R/NAME, results as time_to_answer[_NAME].* in $OUT.
phase() {
  local name=$1 suffix=""
  shift
  [ "$name" = main ] || suffix=_$name
  rm -rf "$R/$name"
  timeout "${TTA_LIMIT:-0}" python -m benchmarks.time_to_answer --space "$SPACE" \
    --output-root "$R/$name" "${COMMON[@]}" "$@" \
    --json "$OUT/time_to_answer$suffix.json" --markdown "$OUT/time_to_answer$suffix.md" \
    2>&1 | quiet | tee "$OUT/time_to_answer$suffix.log" || rc=1
  local v to
  for v in "$R/$name"/*/; do
    [ -d "$v" ] || continue
    to=$OUT/sweeps$suffix/$(basename "$v")
    mkdir -p "$to"
    for f in run_manifest.tsv groups.json summary.json summary.md; do
      [ -f "$v/$f" ] && cp "$v/$f" "$to/"
    done
    [ -e "$v/timing.parquet" ] && python -c "import pandas as pd; \
pd.read_parquet('$v/timing.parquet').to_csv('$to/timing.csv', index=False)"
  done
}

[ "${TTA_MAIN:-1}" = 1 ] && phase main --set repeats=1 --set torch_compile=false "$@"
[ "${TTA_RACE:-0}" = 1 ] && phase race --schedulers fifo,race --set repeats=1 \
  --set torch_compile=false "$@"
[ "${TTA_COMPILE:-0}" = 1 ] && phase compile --set repeats=2 --set torch_compile=true \
  "${ONE_CASE[@]}" "$@"
exit $rc
