#!/usr/bin/env bash
# Issue 24 on a one-GPU machine, one phase after the other on one host, in the background (each
# device command is capped at 10 minutes, a machine at 30 minutes held):
#   source .gpu/setup.sh && TTA_PHASES="probe main" setsid nohup \
#     bash benchmarks/time_to_answer_all_gpu.sh &
# Phases (TTA_PHASES, default "main race compile"):
#   probe    benchmarks/resident_memory_probe.py: what a resident worker keeps on the GPU
#   speed    benchmarks/resident_speed_probe.py: one configuration fresh vs several times in one
#            process (after release, a light release, a pause), with NVML, no Ray
#   main     the eager sweep fresh vs resident (time_to_answer_gpu.sh; TTA_MAIN_ARGS are passed
#            on, e.g. "--set repeats=2 --executors resident,fresh")
#   race     the race vs the grid in resident groups (race_gpu.sh): race_a8_gpu's 4 groups of
#            num_workers=2, synthetic 2 s batches, TTA_RACE_STEPS steps a run (default 120, the
#            space's own; the 2026-11-24 morning run used 60)
#   compile  a compiled case twice (warm compile cache)
# Progress in /tmp/tta_out/progress.txt, results under /tmp/tta_out.
set -u
export OUT=/tmp/tta_out
mkdir -p $OUT
source benchmarks/gpu_common.sh
for phase in ${TTA_PHASES:-main race compile}; do
  case $phase in
    probe) python -m benchmarks.resident_memory_probe > $OUT/memory_probe.log 2>&1 ;;
    speed) make_corpus && python -m benchmarks.resident_speed_probe --manifest $M \
      --json $OUT/speed_probe.json > $OUT/speed_probe.log 2>&1 ;;
    # shellcheck disable=SC2086 # TTA_MAIN_ARGS is a list of arguments
    main) TTA_MAIN=1 bash benchmarks/time_to_answer_gpu.sh ${TTA_MAIN_ARGS:-} \
      > $OUT/main_phase.log 2>&1 ;;
    race) RACE_DATA=synthetic RACE_LIMIT=1200 bash benchmarks/race_gpu.sh --set num_workers=2 \
      --set max_steps=${TTA_RACE_STEPS:-120} --set log_every=5 --set tail_timing_points=4 \
      --set audio_s=2.0 > $OUT/race_phase.log 2>&1 ;;
    compile) TTA_MAIN=0 TTA_COMPILE=1 bash benchmarks/time_to_answer_gpu.sh \
      --executors resident > $OUT/compile_phase.log 2>&1 ;;
    *) echo "unknown phase $phase (probe, speed, main, race, compile)" >&2; exit 2 ;;
  esac
  echo "$phase done rc=$? $(date +%T)" >> $OUT/progress.txt
done
