#!/usr/bin/env bash
# Issue 24 on a one-GPU machine: the eager sweep fresh vs resident (time_to_answer_gpu.sh), the
# race vs the grid (race_gpu.sh, now resident), a compiled case twice (warm compile cache), one
# after the other on one host, in the background (each device command is capped at 10 minutes):
#   source .gpu/setup.sh && setsid nohup bash benchmarks/time_to_answer_all_gpu.sh &
# Progress in /tmp/tta_out/progress.txt, results under /tmp/tta_out.
set -u
export OUT=/tmp/tta_out
mkdir -p $OUT
source benchmarks/gpu_common.sh
TTA_MAIN=1 bash benchmarks/time_to_answer_gpu.sh > $OUT/main_phase.log 2>&1
echo "main done rc=$?" >> $OUT/progress.txt
RACE_DATA=synthetic RACE_LIMIT=560 bash benchmarks/race_gpu.sh --set num_workers=2 --set max_steps=60 \
  --set log_every=5 --set tail_timing_points=4 --set audio_s=2.0 > $OUT/race_phase.log 2>&1
echo "race done rc=$?" >> $OUT/progress.txt
TTA_MAIN=0 TTA_COMPILE=1 bash benchmarks/time_to_answer_gpu.sh --executors resident > $OUT/compile_phase.log 2>&1
echo "compile done rc=$?" >> $OUT/progress.txt
