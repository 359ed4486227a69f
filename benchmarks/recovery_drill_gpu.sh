#!/usr/bin/env bash
# Issue 41's recovery drill on a GPU host, in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/recovery_drill_gpu.sh
# platform.train at the runbooks' mainline with crop buckets (mb 128, every GPU), DRILL_STEPS
# steps (default 400, checkpoints every fifth of the run), two speakers held out, rank 1 killed
# with SIGKILL after step KILL_AT (default 250). Injected faults act in the run's first attempt
# only, so the restarted worker group resumes from the newest complete checkpoint and the run
# ends ok with one restart. $OUT/drill.log, $OUT/drill_manifest.tsv (status, restarts, resumed
# step, checkpoints), the console lines Tune printed about slow callbacks (none expected), the
# restart's one console line and the ended attempt's log tails (restart_tail-attempt1.txt).
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
R=/tmp/drill
rm -rf $R
SECONDS=0
python -m platform.train --space 4090_mainline --output-root $R --set manifest_path=$M \
  --set train_workers="$GPUS" --set micro_batch=128 --set num_workers=6 --set zero_stage=0 \
  --set prefetch_factor=4 \
  --set crop_buckets_s=1.0,1.5,2.0,2.5,3.0 --set max_steps="${DRILL_STEPS:-400}" \
  --set log_every=20 --set val_speakers=2 --set inject_kill_at_step="${KILL_AT:-250}" \
  --set inject_error_rank=1 2>&1 | quiet > "$OUT/drill.log"
code=${PIPESTATUS[0]}
echo "exit $code wall ${SECONDS} s" | tee -a "$OUT/drill.log"
[ -f $R/run_manifest.tsv ] || exit "$code"
python - $R <<'PY' | tee "$OUT/drill_manifest.tsv"
import sys, pandas as pd
m = pd.read_csv(f"{sys.argv[1]}/run_manifest.tsv", sep="\t", keep_default_na=False)
cols = ["run", "status", "exit_code", "last_step", "restarts", "resumed_from_step", "checkpoints",
        "val_mean_r1_last", "startup_s", "duration_sec", "failure_reason"]
print(m[cols].to_csv(sep="\t", index=False))
PY
echo "slow-callback lines: $(grep -c 'performance bottleneck' "$OUT/drill.log")"
# The restart on the console: one line (why, the step resumed from, where the tails are), and
# no worker or Ray traceback lines; the ended attempt's log tails beside the log.
grep "restarted (attempt" "$OUT/drill.log"
echo "traceback lines on the console: $(grep -c -e Traceback -e 'pid=' "$OUT/drill.log")"
cp $R/runs/*/restart_tail-attempt*.txt "$OUT/" 2>/dev/null || true
exit "$code"
