#!/usr/bin/env bash
# Issue 24's tails item on a one-GPU machine: each group's tail samples/s in resident groups
# against fresh processes, in blocks that alternate (resident, fresh, resident) so that a host
# drifting during the command shows instead of reading as a difference between executors:
#   source .gpu/setup.sh && bash benchmarks/resident_tails_gpu.sh [--set KEY=VALUE ...]
# The space: TAILS_SPACE (default benchmarks/spaces/h100_mb160_buckets.yaml, h200_fastest's mb160
# crop-bucket case, the most affected), 3 runs per block (--set repeats=N to change), 150 steps.
# Results under $OUT: time_to_answer.{json,md} pooled over the blocks (benchmarks/time_to_answer.py)
# and each block's sweep. About 10 minutes on an H100 with the default space: longer than one
# device command, so start it in the background and collect it with a later command:
#   (setsid nohup bash benchmarks/resident_tails_gpu.sh > /tmp/tails.log 2>&1 < /dev/null &)
# TAILS_PROBE=1 first runs benchmarks/probes/resident_speed_probe.py (no Ray, telemetry off):
# fresh processes against runs in one process after serve.release, with and without gc.freeze.
set -u
source "$(dirname "$0")/gpu_common.sh"
if [ "${TAILS_PROBE:-0}" = 1 ]; then
  make_corpus && python -m benchmarks.probes.resident_speed_probe --manifest "$M" \
    --micro-batch 160 --sequence fresh,first,release,freeze,release,freeze,fresh \
    --json "$OUT/speed_probe.json" > "$OUT/speed_probe.log" 2>&1
fi
TTA_SPACE=${TAILS_SPACE:-benchmarks/spaces/h100_mb160_buckets.yaml} TTA_LIMIT=${TAILS_LIMIT:-1500} \
  bash "$(dirname "$0")/time_to_answer_gpu.sh" --executors resident,fresh,resident \
  --set repeats=3 "$@"
