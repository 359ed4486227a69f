#!/usr/bin/env bash
# Issue 58 on a GPU machine, through the device tool, in one command:
#   source .gpu/setup.sh && bash benchmarks/warm_race_gpu.sh [--set KEY=VALUE ...]
# The same race twice on this host (default 4090_mainline at 600 steps, WARM_SPACE=...): the
# first cold (a fresh machine's catalogue), the second warm-started from what the first wrote
# (its groups fastest first, known out-of-memory points skipped); the wall times, their ratio,
# and python -m platform.catalogue compare of the two sweeps, under $OUT.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
SPACE=${WARM_SPACE:-4090_mainline}
ARGS=(--space "$SPACE" --set manifest_path=$M --set max_steps=600 --set scheduler=race "$@")
for n in 1 2; do
  rm -rf /tmp/race$n
  t0=$(date +%s%N)
  python -m platform.tune "${ARGS[@]}" --output-root /tmp/race$n 2>&1 | quiet | tee "$OUT/race$n.log"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) > "$OUT/race$n.wall_ms"
  cp /tmp/race$n/summary.md "$OUT/race${n}_summary.md" 2>/dev/null
done
echo "wall ms: cold $(cat $OUT/race1.wall_ms), warm $(cat $OUT/race2.wall_ms); ratio" \
  "$(python -c "print(round($(cat $OUT/race2.wall_ms) / $(cat $OUT/race1.wall_ms), 3))")" | tee "$OUT/ratio.txt"
python -m platform.catalogue compare /tmp/race1 /tmp/race2 | tee "$OUT/compare.txt"
python -m platform.catalogue list | tee "$OUT/list.txt"
