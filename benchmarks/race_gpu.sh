#!/usr/bin/env bash
# Issue 15 on a GPU machine, through the device tool, in one command:
#   source .gpu/setup.sh && bash benchmarks/race_gpu.sh [--set KEY=VALUE ...]
# The space (default race_a8_gpu, RACE_SPACE=...) as a full grid and as a race, one after the
# other (benchmarks/race.py), on every GPU of the machine (train_workers = GPUs), with the
# generated 2-8 s corpus (RACE_DATA=synthetic: made-up batches, no corpus to make). Results:
# race_vs_grid.md/json and both summaries under $OUT.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
SPACE=${RACE_SPACE:-race_a8_gpu}
R=/tmp/race_$SPACE
list_gpus
if [ "${RACE_DATA:-manifest}" = synthetic ]; then
  DATA=(--set dataset=synthetic)
else
  make_corpus
  DATA=(--set manifest_path=$M)
fi
rm -rf $R
timeout "${RACE_LIMIT:-0}" python -m benchmarks.race --space "$SPACE" --output-root $R \
  "${DATA[@]}" --set train_workers=$GPUS "$@" \
  --json "$OUT/race_vs_grid.json" --markdown "$OUT/race_vs_grid.md" 2>&1 | quiet | tee "$OUT/race.log"
for s in grid race; do
  [ -f $R/$s/summary.md ] && cp $R/$s/summary.md "$OUT/${s}_summary.md"
done
