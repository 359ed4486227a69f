#!/usr/bin/env bash
# Issue 57 on a GPU machine, through the device tool (steps chained over calls on one warm host):
#   source .gpu/setup.sh && bash benchmarks/budget_gpu.sh STEP [STEP ...]
# STEP: budget   4090_mainline --set max_steps=600 with --budget ${BUDGET:-4m}, timed
#       compiled the same space with a compiled point (torch_compile [false,true], loader
#                workers 6) with the same budget
#       compiled_grid  that space's full grid, stopped and resumed as grid is
#       grid     the full grid (2 repeats, 600 steps), stopped with SIGINT after GRID_LIMIT s
#                (default 540) and finished by the next call's grid step with --resume (its
#                root gpu_out/grid travels: carry [".gpu", "gpu_out"])
# STEPS=N: max_steps of every step (default 600; the same for a budget sweep and its grid).
# Then: python -m benchmarks.budget_check gpu_out/budget gpu_out/grid (the comparison).
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
nvidia-smi --query-gpu=uuid --format=csv,noheader >> "$OUT/hosts.txt"
make_corpus
G=gpu_out
mkdir -p $G
SETS=(--set manifest_path=$M --set max_steps=${STEPS:-600})
timed() {  # NAME, then the command: its wall seconds into $OUT/NAME.wall
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  "$@" 2>&1 | quiet | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo $(( ($(date +%s%N) - t0) / 1000000 )) | sed 's/...$/.&/' > "$OUT/$name.wall"
  echo "$name: exit $rc, wall $(cat "$OUT/$name.wall") s" | tee -a "$OUT/steps.txt"
}
for step in "$@"; do
  case $step in
    budget)
      rm -rf $G/budget
      timed budget python -m platform.tune --space 4090_mainline "${SETS[@]}" \
        --budget "${BUDGET:-4m}" --output-root $G/budget ;;
    compiled)
      rm -rf $G/compiled
      timed compiled python -m platform.tune --space 4090_mainline "${SETS[@]}" \
        --set num_workers=6 --set "torch_compile=[false,true]" \
        --budget "${BUDGET:-4m}" --output-root $G/compiled ;;
    compiled_grid)
      if [ -f $G/cgrid/run_manifest.tsv ]; then RESUME=(--resume); else RESUME=(); fi
      timed "cgrid$(ls $OUT/cgrid*.log 2>/dev/null | wc -l)" timeout -s INT "${GRID_LIMIT:-540}" \
        python -m platform.tune --space 4090_mainline "${SETS[@]}" --set num_workers=6 \
        --set "torch_compile=[false,true]" --output-root $G/cgrid "${RESUME[@]}" ;;
    grid)
      if [ -f $G/grid/run_manifest.tsv ]; then RESUME=(--resume); else RESUME=(); fi
      timed "grid$(ls $OUT/grid*.log 2>/dev/null | wc -l)" timeout -s INT "${GRID_LIMIT:-540}" \
        python -m platform.tune --space 4090_mainline "${SETS[@]}" --output-root $G/grid \
        "${RESUME[@]}" ;;
  esac
done
tar czf "$OUT/gpu_out.tgz" --exclude=report.html $G  # the tool brings back 8 files, 2 folders deep
# The machine's catalogue (the budget's memory of this host: one small Parquet file per sweep).
CACHE="${STAGE1_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/stage1}"
if [ -d "$CACHE/catalogue" ]; then tar czf "$OUT/catalogue.tgz" -C "$CACHE" catalogue; fi
