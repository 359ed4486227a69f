#!/usr/bin/env bash
# Issue 58 on a GPU machine, through the device tool, in one command:
#   source .gpu/setup.sh && bash benchmarks/warm_race_gpu.sh [--set KEY=VALUE ...]
# The same race twice on this host (default 4090_mainline at 600 steps, WARM_SPACE=...): the
# first cold (a fresh machine's catalogue), the second warm-started from what the first wrote
# (its groups fastest first, known out-of-memory points skipped); the wall times, their ratio,
# and python -m platform.catalogue compare of the two sweeps, under $OUT. A later
# --set max_steps=N overrides the 600 (the last --set of a key wins).
# Split over two calls on one warm host (both races do not fit one 600 s call at 300 steps):
# WARM_RACES=1 in the first, WARM_RACES=2 in the second; the roots, walls and GPU UUIDs stay in
# WARM_ROOT (default /tmp) on the machine, and the second call prints the ratio and the compare.
# $OUT holds more than the device tool's 8 files: tar it into the tool's $OUT from the command.
# The default corpus (1,600 utterances) makes an epoch of 4-5 steps, so every 50-step window of
# 4090_mainline crosses epoch boundaries: the race counts them as the steady state (it judged no
# window before that rule, results/warm_race_2xh200/). python -m benchmarks.race_replay replays
# the two races' windows through the race as it is now.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
SPACE=${WARM_SPACE:-4090_mainline}
ROOT=${WARM_ROOT:-/tmp}
ARGS=(--space "$SPACE" --set manifest_path=$M --set max_steps=600 --set scheduler=race "$@")
nvidia-smi --query-gpu=uuid --format=csv,noheader | sed "s/^/race ${WARM_RACES:-1 2}: /" \
  >> "$ROOT/warm_hosts.txt"
for n in ${WARM_RACES:-1 2}; do
  rm -rf $ROOT/race$n $ROOT/race$n.wall_ms
  [ "$n" = 1 ] && rm -f $ROOT/race2.wall_ms  # no ratio against an older race 2
  t0=$(date +%s%N)
  python -m platform.tune "${ARGS[@]}" --output-root $ROOT/race$n 2>&1 | quiet | tee "$OUT/race$n.log"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) > "$ROOT/race$n.wall_ms"
  cp $ROOT/race$n/summary.md "$OUT/race${n}_summary.md" 2>/dev/null
done
cp "$ROOT/warm_hosts.txt" "$OUT/hosts.txt"
if [ -f $ROOT/race1.wall_ms ] && [ -f $ROOT/race2.wall_ms ]; then
  cp $ROOT/race1.wall_ms $ROOT/race2.wall_ms "$OUT/"
  echo "wall ms: cold $(cat $ROOT/race1.wall_ms), warm $(cat $ROOT/race2.wall_ms); ratio" \
    "$(python -c "print(round($(cat $ROOT/race2.wall_ms) / $(cat $ROOT/race1.wall_ms), 3))")" | tee "$OUT/ratio.txt"
  python -m platform.catalogue compare $ROOT/race1 $ROOT/race2 | tee "$OUT/compare.txt"
fi
python -m platform.catalogue list | tee "$OUT/list.txt"
