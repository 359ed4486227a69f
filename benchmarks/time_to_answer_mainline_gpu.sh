#!/usr/bin/env bash
# Issue 40's time to answer on a GPU host, in one command through the device tool:
#   source .gpu/setup.sh && BASE_DIR=.base bash benchmarks/time_to_answer_mainline_gpu.sh
# 1. The first run's start-up at a baseline revision and at this checkout, alternating, on the
#    runbooks' mainline point (4090_mainline, mb 160, 6 loader workers, every GPU, 20 steps):
#    each one sweep of one run, its manifest's startup_s and startup_breakdown, and the time
#    from the command's launch to the first window (BASE_DIR: the baseline's files, e.g.
#    `git archive REV | tar -x -C .base`; left out when unset).
# 2. 4090_mainline at max_steps=200, repeats=1 through benchmarks/time_to_answer (resident):
#    groups started, per-run start-up and time to first window, busy share, compile seconds.
# Results under $OUT: first_runs.tsv, time_to_answer.{json,md,log}, the sweep's manifest and
# groups.json. TTA_SKIP_FIRST=1 leaves step 1 out; TTA_FIRST_ORDER (default "base new") its order.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
here=$(pwd)
first_run() {  # first_run LABEL DIR
  local root=/tmp/first_$1 t0
  rm -rf "$root"
  t0=$(date +%s.%N)
  (cd "$2" && python -m platform.tune --space 4090_mainline --output-root "$root" \
    --set manifest_path=$M --set train_workers="$GPUS" --set max_steps=20 --set log_every=10 \
    --set repeats=1 --set micro_batch=160 --set num_workers=6 2>&1 | quiet > "$OUT/first_$1.log")
  python - "$1" "$root" "$t0" >> "$OUT/first_runs.tsv" <<'PY'
import sys, pandas as pd
label, root, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
m = pd.read_csv(f"{root}/run_manifest.tsv", sep="\t").iloc[0]
t = pd.read_parquet(f"{root}/timing.parquet")
t = t[t["rank"] == 0].sort_values("window_end_ts").iloc[0]
first = t["window_end_ts"] - t["steps_in_window"] * t["iter_ms_mean"] / 1000
print(f"{label}\t{m['status']}\t{m['startup_s']:.1f}\t{first - t0:.1f}\t{m['startup_breakdown']}")
PY
}
if [ "${TTA_SKIP_FIRST:-0}" != 1 ]; then
  printf 'label\tstatus\tstartup_s\tlaunch_to_first_window_s\tstartup_breakdown\n' > "$OUT/first_runs.tsv"
  for label in ${TTA_FIRST_ORDER:-base new}; do
    if [ "$label" = base ]; then [ -n "${BASE_DIR:-}" ] || continue; first_run base "$BASE_DIR"
    else first_run new "$here"; fi
  done
  cat "$OUT/first_runs.tsv"
fi
R=/tmp/tta_mainline
rm -rf $R
python -m benchmarks.time_to_answer --space 4090_mainline --executors resident --no-canary \
  --output-root $R --set manifest_path=$M --set train_workers="$GPUS" --set max_steps=200 \
  --set repeats=1 --label "${GPUS}xgpu" --json "$OUT/time_to_answer.json" \
  --markdown "$OUT/time_to_answer.md" 2>&1 | quiet | tee "$OUT/time_to_answer.log"
for f in run_manifest.tsv groups.json; do cp "$R/fifo_resident/$f" "$OUT/" 2>/dev/null; done
