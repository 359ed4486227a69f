#!/usr/bin/env bash
# Issue 14 on a GPU machine, through the device tool, in one command:
#   source .gpu/setup.sh && bash benchmarks/fastest_gpu.sh [--set KEY=VALUE ...]
# The space (default h200_fastest, FASTEST_SPACE=...) runs on every GPU of the machine
# (train_workers = GPUs) with the winner under torchrun (FASTEST_TORCHRUN=0: not), and with 2 or
# more GPUs the winner on 1, 2, ... GPUs below that (scaling). Corpus: 1,600 utterances of 2-8 s (1,600 / global batch = a few steps per
# epoch, so a run crosses many epoch boundaries), made once per machine under /tmp.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
SPACE=${FASTEST_SPACE:-h200_fastest}
R=/tmp/fastest_$SPACE
list_gpus
make_corpus
SCALING=""
TORCHRUN=--torchrun
[ "${FASTEST_TORCHRUN:-1}" = 0 ] && TORCHRUN=""
[ "$GPUS" -ge 2 ] && SCALING=--scaling
rm -rf $R ${R}_*gpu
mkdir -p "$OUT/$SPACE"
# FASTEST_LIMIT=S: stop the benchmark after S seconds (what it recorded so far is kept).
timeout "${FASTEST_LIMIT:-0}" python -m benchmarks.fastest --space "$SPACE" --output-root $R \
  --set manifest_path=$M --set train_workers=$GPUS "$@" $TORCHRUN $SCALING \
  --json "$OUT/$SPACE/fastest.json" 2>&1 | quiet | tee "$OUT/$SPACE/fastest.log"
for f in run_manifest.tsv ranked_groups.csv summary.md ray_vs_torchrun.json; do
  [ -f $R/$f ] && cp $R/$f "$OUT/$SPACE/"
done
python -c "import pandas as pd; pd.read_parquet('$R/timing.parquet').to_csv('$OUT/$SPACE/timing.csv', index=False)"
