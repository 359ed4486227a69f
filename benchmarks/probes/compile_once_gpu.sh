#!/usr/bin/env bash
# Issue 40's "compile once per machine" on a GPU host, in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/probes/compile_once_gpu.sh
# The runbooks' mainline space at one compiled point (crop buckets 1-3 s, regional compile,
# reduce-overhead: CUDA graphs, mb 128, every GPU), three times on one machine cache folder:
# a sweep into a new root (cold), the same sweep into another new root, and platform.train with
# the second sweep's winner. Each one's compile_s and compile_cache (graphs found / compiled)
# into $OUT/compile_once.tsv; the logs beside it. COMPILE_STEPS (60) steps per run (the training
# run too, at most 50); COMPILE_MODE (reduce-overhead) the compile mode (`default`: no CUDA
# graphs); COMPILE_TRAIN=0 leaves out platform.train (a shorter call); COMPILE_TRAIN_REPEATS
# (1) platform.train that many times, each into a new root (their logs one after another in
# train.log); COMPILE_TRAIN_ENVS: variants the
# trainings take in turn, each one environment assignment or `-` (the platform's default), e.g.
# "- TORCH_WARM_POOL=1": then each variant's median compile_s and its ratio to the first's.
set -u -o pipefail
source "$(dirname "$0")/../gpu_common.sh"
list_gpus
make_corpus
export STAGE1_CACHE_DIR=/tmp/stage1-machine-cache
rm -rf "$OUT/train.log" "$STAGE1_CACHE_DIR" /tmp/compile_a /tmp/compile_b /tmp/compile_train
SETS=(--set manifest_path=$M --set train_workers="$GPUS" --set micro_batch=128 --set num_workers=6
  --set crop_buckets_s=1.0,1.5,2.0,2.5,3.0 --set torch_compile=true --set compile_scope=layers
  --set compile_mode=${COMPILE_MODE:-reduce-overhead} --set max_steps=${COMPILE_STEPS:-60} --set log_every=10 --set repeats=1)
printf 'step\tvariant\tstatus\tstartup_s\tcompile_s\tcompile_parts\tcompile_cache\ttail_samples_per_s\twall_s\n' > "$OUT/compile_once.tsv"
row() {  # row STEP VARIANT ROOT WALL
  python - "$@" >> "$OUT/compile_once.tsv" <<'PY'
import sys, pandas as pd
step, variant, root, wall = sys.argv[1:]
m = pd.read_csv(f"{root}/run_manifest.tsv", sep="\t", keep_default_na=False).iloc[0]
print(f"{step}\t{variant}\t{m['status']}\t{m['startup_s']}\t{m['compile_s']}\t{m['compile_parts']}\t"
      f"{m['compile_cache']}\t"
      f"{m['tail_samples_per_sec_mean']}\t{wall}")
PY
}
for step in a b; do
  SECONDS=0
  python -m platform.tune --space 4090_mainline --output-root /tmp/compile_$step "${SETS[@]}" \
    2>&1 | quiet > "$OUT/sweep_$step.log"
  row "sweep_$step" - /tmp/compile_$step $SECONDS
done
[ "${COMPILE_TRAIN:-1}" = 0 ] && exit 0  # COMPILE_TRAIN=0: the two sweeps only
read -r -a VARIANTS <<< "${COMPILE_TRAIN_ENVS:--}"
for i in $(seq "${COMPILE_TRAIN_REPEATS:-1}"); do  # each into a new root of its own
  variant=${VARIANTS[$(( (i - 1) % ${#VARIANTS[@]} ))]}
  ENV=(); [ "$variant" != - ] && ENV=("$variant")
  SECONDS=0
  rm -rf /tmp/compile_train
  env "${ENV[@]}" python -m platform.train --config /tmp/compile_b/best_config.json --output-root /tmp/compile_train \
    --set max_steps=$(( ${COMPILE_STEPS:-60} < 50 ? ${COMPILE_STEPS:-60} : 50 )) --set checkpoint_every=0 --set export_model=none 2>&1 | quiet \
    > /tmp/train_last.log
  { echo "== training $i ($variant), ended $(date +%s)"; cat /tmp/train_last.log; } >> "$OUT/train.log"
  row train "$variant" /tmp/compile_train $SECONDS
done
cat "$OUT/compile_once.tsv"
python - "$OUT/compile_once.tsv" <<'PY' | tee "$OUT/compile_variants.txt"
import sys, pandas as pd
runs = pd.read_csv(sys.argv[1], sep="\t", keep_default_na=False)
runs = runs[runs.step == "train"]
median = runs.groupby("variant", sort=False).compile_s.median()
first = median.iloc[0]
for variant, seconds in median.items():
    n = (runs.variant == variant).sum()
    print(f"{variant}: compile_s median {seconds:.2f} of {n}; ratio to {median.index[0]} {seconds / first:.2f}")
PY
du -sh "$STAGE1_CACHE_DIR"/* | tee -a "$OUT/compile_once.tsv"
