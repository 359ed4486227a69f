#!/usr/bin/env bash
# Issue 58's acceptance on a GPU machine, through the device tool, in two calls on one warm host:
#   source .gpu/setup.sh && WARM_RACES=1 bash benchmarks/warm_race_gpu.sh   # race 1, cold
#   source .gpu/setup.sh && WARM_RACES=2 bash benchmarks/warm_race_gpu.sh   # race 2, warm
# The same race twice on this host (default 4090_mainline as a race of WARM_STEPS=350 steps,
# WARM_SPACE=..., more --set KEY=VALUE after the script: the last --set of a key wins): the first cold
# (--no-history: it reads no catalogue, whatever the machine holds, and writes its rows), the
# second warm-started from what the first wrote (--history ${WARM_HISTORY:-confirm}: its groups
# fastest first, known out-of-memory points skipped, each group's catalogue runs standing in for
# its repeats once its first judged windows here confirm them, the ranking pooled). The
# catalogue is the races' own (compile_cache_dir, not part of a configuration's cost key, in
# WARM_ROOT), so no older sweep of the machine joins it; race 1 empties it.
# What comes back under $OUT: both consoles, summaries, schedules and rankings, the command wall
# times and their ratio, both winners, python -m platform.catalogue compare of the two sweeps and
# list. $OUT holds more than the device tool's 8 files: tar it into the tool's $OUT from the
# command. Both races do not fit one 600 s call (race 1 about 500 s at 350 steps, race 2 about
# 220 s): the roots, walls and GPU UUIDs stay in WARM_ROOT (default /tmp) on the machine between
# the calls, and the second prints the ratio, the winners and the compare. Why 350 steps, and
# what 300 gives: results/warm_race_2xh200/README.md, "The policy change".
# python -m benchmarks.race_replay replays the two recorded races of
# results/warm_race_2xh200/ through the race and the ranking as they are now.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
SPACE=${WARM_SPACE:-4090_mainline}
ROOT=${WARM_ROOT:-/tmp}
CAT=$ROOT/warm_catalogue_cache  # the races' machine cache: their catalogue in catalogue/
ARGS=(--space "$SPACE" --set manifest_path=$M --set max_steps=${WARM_STEPS:-350} --set scheduler=race
      --set compile_cache_dir=$CAT "$@")
nvidia-smi --query-gpu=uuid --format=csv,noheader | sed "s/^/race ${WARM_RACES:-1 2}: /" \
  >> "$ROOT/warm_hosts.txt"
for n in ${WARM_RACES:-1 2}; do
  rm -rf $ROOT/race$n $ROOT/race$n.wall_ms
  if [ "$n" = 1 ]; then
    rm -f $ROOT/race2.wall_ms  # no ratio against an older race 2
    rm -rf "$CAT"              # race 2 warm-starts from race 1 alone
    FLAGS=(--no-history)
  else
    FLAGS=(--history "${WARM_HISTORY:-confirm}")
  fi
  t0=$(date +%s%N)
  python -m platform.tune "${ARGS[@]}" "${FLAGS[@]}" --output-root $ROOT/race$n 2>&1 | quiet \
    | tee "$OUT/race$n.log"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) > "$ROOT/race$n.wall_ms"
  for f in summary.md schedule.json ranked_groups.csv; do
    cp $ROOT/race$n/$f "$OUT/race${n}_$f" 2>/dev/null
  done
done
cp "$ROOT/warm_hosts.txt" "$OUT/hosts.txt"
winner() { python -c "import json; print(json.load(open('$1/best_config.json'))['group'])"; }
if [ -f $ROOT/race1.wall_ms ] && [ -f $ROOT/race2.wall_ms ]; then
  cp $ROOT/race1.wall_ms $ROOT/race2.wall_ms "$OUT/"
  { echo "wall ms: cold $(cat $ROOT/race1.wall_ms), warm $(cat $ROOT/race2.wall_ms); ratio" \
      "$(python -c "print(round($(cat $ROOT/race2.wall_ms) / $(cat $ROOT/race1.wall_ms), 3))")"
    echo "winners: cold $(winner $ROOT/race1), warm $(winner $ROOT/race2)"
  } | tee "$OUT/ratio.txt"
  python -m platform.catalogue compare $ROOT/race1 $ROOT/race2 --catalogue "$CAT/catalogue" \
    | tee "$OUT/compare.txt"
fi
python -m platform.catalogue list --catalogue "$CAT/catalogue" | tee "$OUT/list.txt"
