#!/usr/bin/env bash
# Final training on 2 GPUs with a rank killed mid-run (issue 12's GPU acceptance), beside a sweep
# run of the same configuration. On the GPU machine, from the repo root:
#   source .gpu/setup.sh && bash benchmarks/train_recovery_gpu.sh
# A learnable corpus (6,400 utterances, 40 speakers) is generated and prepared once under
# $CORPUS; results go to $OUT (train_recovery.json, the logs, the output roots without
# checkpoints).
set -euo pipefail
OUT="${OUT:-/tmp/train_recovery_out}"
CORPUS="${CORPUS:-/tmp/learnable_corpus}"
RES="${RES:-/tmp/train_recovery_res}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ ! -f "$CORPUS/prepared/manifest_16k_trim.tsv" ]; then
  t0=$(date +%s)
  python -m data_prep.synth --output-root "$CORPUS/raw" --mode learnable --speakers 40 \
      --chapters 4 --utts 40 2>&1 | tee "$OUT/corpus.log"
  t1=$(date +%s)
  python -m data_prep.librispeech --input-root "$CORPUS/raw" --output-root "$CORPUS/prepared" \
      --trim --log-every 1000 2>&1 | tail -5 | tee -a "$OUT/corpus.log"
  echo "synth $((t1 - t0)) s, data_prep $(( $(date +%s) - t1 )) s" | tee -a "$OUT/corpus.log"
fi
rm -rf "$RES"
python -m benchmarks.train_recovery --space h200_train_z1 \
    --manifest "$CORPUS/prepared/manifest_16k_trim.tsv" --output-root "$RES" \
    --kill-at-step "${KILL_AT_STEP:-300}" --sweep-steps "${SWEEP_STEPS:-200}" \
    --kill-rank "${KILL_RANK:-1}" "$@" \
    2>&1 | grep -v "^\s*$" | tee "$OUT/train_recovery.log"
cp "$RES/train_recovery.json" "$OUT/"
cp "$RES"/train/runs/*/curves.png "$OUT/" 2>/dev/null || true
tar czf "$OUT/output_roots.tgz" --exclude='checkpoint_step*' --exclude='export' \
    --exclude='data' -C "$RES" .
