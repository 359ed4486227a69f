#!/usr/bin/env bash
# The old runbook's entry point, kept so its commands run unchanged:
#
#   MODE=sweep INCLUDE=localhost:0,1 REPEATS=1 MAX_STEPS=600 SWEEP_ZERO_STAGES=0,1 \
#   SWEEP_MICRO_BATCHES=128,160,192 SWEEP_NUM_WORKERS_LIST=4,6,8 SWEEP_PREFETCH_LIST=2,4 \
#   DATASET_MANIFEST_PATH=/data/ls16k/manifest_16k_trim.tsv ./scripts/run_stage1_ab_bench.sh
#
# The variables (platform/spaces/runbook.py lists them all) become a sweep of python -m platform.tune;
# it prints the same sweep as a space file to move to. DRY_RUN=1 prints the runs and checks the inputs, starting nothing. Any
# arguments are passed on to platform.tune (e.g. --space NAME as the base, --logger tensorboard).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m platform.tune --from-env "$@"
