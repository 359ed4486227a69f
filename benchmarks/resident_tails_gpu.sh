#!/usr/bin/env bash
# Issue 24's tails item on a one-GPU machine: is a resident worker's step slower than a fresh
# one's, and why? h200_fastest's mb160 crop-bucket case (the most affected) with gc_every 0
# (Python's automatic collector) and 50 (benchmarks/spaces/h100_mb160_buckets.yaml), in blocks
# that alternate so a drift of the host shows:
#   probe      benchmarks/resident_speed_probe.py, no Ray, telemetry off: fresh processes against
#              runs in one process after serve.release, with and without gc.freeze
#   resident   3 runs of each case in one resident group (the first one is a new process)
#   fresh      2 runs of each case in fresh processes
#   resident2  resident again
#   nofreeze   resident with STAGE1_RESIDENT_GC_FREEZE=0 (the group does not freeze its heap)
# Run in the background (each device command is capped at 10 minutes):
#   source .gpu/setup.sh && setsid nohup bash benchmarks/resident_tails_gpu.sh &
# Progress in /tmp/tails_out/progress.txt, results under /tmp/tails_out/<block>/.
set -u
export OUT_ROOT=/tmp/tails_out
mkdir -p $OUT_ROOT
source benchmarks/gpu_common.sh
S=benchmarks/spaces/h100_mb160_buckets.yaml
block() {  # block NAME EXECUTOR REPEATS [ENV=VALUE ...]
  local name=$1 executor=$2 repeats=$3
  shift 3
  mkdir -p $OUT_ROOT/$name
  env "$@" OUT=$OUT_ROOT/$name TTA_SPACE=$S TTA_LIMIT=500 bash benchmarks/time_to_answer_gpu.sh \
    --executors "$executor" --set repeats="$repeats" > $OUT_ROOT/$name/block.log 2>&1
}
for b in ${TAILS_BLOCKS:-resident fresh resident2}; do
  case $b in
    probe) make_corpus && python -m benchmarks.resident_speed_probe --manifest $M \
      --micro-batch 160 --sequence fresh,first,release,freeze,release,freeze,fresh \
      --json $OUT_ROOT/speed_probe.json > $OUT_ROOT/speed_probe.log 2>&1 ;;
    resident | resident2) block $b resident 3 ;;
    fresh | fresh2) block $b fresh 2 ;;
    nofreeze) block nofreeze resident 3 STAGE1_RESIDENT_GC_FREEZE=0 ;;
    *) echo "unknown block $b" >&2; exit 2 ;;
  esac
  echo "$b done rc=$? $(date +%T)" >> $OUT_ROOT/progress.txt
done
