#!/usr/bin/env bash
# Issue 6 on a 2-GPU machine (NCCL), through the device tool:
#   source .gpu/setup.sh && bash benchmarks/faults_gpu.sh [all|hang|kill]
# 1. hang: rank 1 sleeps 10 minutes inside step 25 with stall_timeout_s=30: the run must end
#    `stalled` with both ranks' stacks, NCCL's collective timing out instead of waiting 30 min;
# 2. a real CUDA out-of-memory (micro_batch 4096) and a `kill -9` of rank 1 of the next run:
#    both `failed` with their reasons, exit codes and log tails; the sweep goes on;
# 3. --resume of that sweep: reruns both (the OOM again, the killed run to the end).
# Logs go to $OUT; manifests, fail tails and stack dumps to $OUT/faults_files.tgz.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
COMMON=(--space fast_smoke --set dataset=synthetic --set audio_s=2.0 --set text_tokens=64
  --set max_steps=150 --set log_every=10 --set tail_timing_points=3)
QUIET=(-e PlacementGroupCleaner -e "Failed to query Ray Train Controller")
STAGE=${1:-all}
FILES=/tmp/faults_files
rm -rf "$FILES"
keep() { # copy a sweep's manifest and per-run text files to $FILES/$2
  mkdir -p "$FILES/$2"
  cp "$1/run_manifest.tsv" "$FILES/$2/" 2>/dev/null
  for f in "$1"/runs/*/fail_tail.txt "$1"/runs/*/stacks-rank*.txt; do
    [ -f "$f" ] && cp "$f" "$FILES/$2/$(basename "$(dirname "$f")")__$(basename "$f")"
  done
  tar czf "$OUT/faults_files.tgz" -C "$FILES" .
  return 0
}

if [ "$STAGE" = all ] || [ "$STAGE" = hang ]; then
echo "=== 1. hang under NCCL $(date +%T)"
start=$(date +%s)
python -m platform.tune "${COMMON[@]}" --output-root /tmp/hang --set stall_timeout_s=30 \
  --set inject_sleep_at_step=25 --set inject_sleep_rank=1 --set inject_sleep_s=600 2>&1 \
  | grep -v "${QUIET[@]}" | tee "$OUT/hang.log"
echo "hang sweep exit ${PIPESTATUS[0]} after $(($(date +%s) - start)) s" | tee -a "$OUT/hang.log"
keep /tmp/hang hang
fi
[ "$STAGE" = hang ] && exit 0

echo "=== 2. OOM, then kill -9 of rank 1 $(date +%T)"
RUN2=sweep_z0_mb160_nw8_pf4_r1
python -m platform.tune "${COMMON[@]}" --output-root /tmp/kill --set 'micro_batch=[4096, 160]' \
  > "$OUT/kill.log" 2>&1 &
DRIVER=$!
for _ in $(seq 1 1200); do grep -q "$RUN2: step 30/" "$OUT/kill.log" && break; sleep 0.5; done
PID=$(python -c "import json; print(json.load(open('/tmp/kill/runs/$RUN2/workers/rank1.json'))['pid'])")
echo "kill -9 $PID (rank 1 of $RUN2) at $(date +%T)" | tee "$OUT/kill_action.txt"
kill -9 "$PID"
wait "$DRIVER"
echo "kill sweep exit $?" | tee -a "$OUT/kill_action.txt"
grep -v "${QUIET[@]}" "$OUT/kill.log" | tail -80
keep /tmp/kill kill

echo "=== 3. --resume $(date +%T)"
python -m platform.tune "${COMMON[@]}" --output-root /tmp/kill --set 'micro_batch=[4096, 160]' \
  --resume 2>&1 | grep -v "${QUIET[@]}" | tee "$OUT/resume.log"
echo "resume exit ${PIPESTATUS[0]}" | tee -a "$OUT/resume.log"
keep /tmp/kill resume
python - <<'EOF' | tee "$OUT/resume_check.txt"
import pandas as pd
t = pd.read_parquet("/tmp/kill/timing.parquet")
print("timing rows per run:", t.groupby("run").size().to_dict())
print("duplicates:", int(t.duplicated(["run", "rank", "window"]).sum()))
EOF
