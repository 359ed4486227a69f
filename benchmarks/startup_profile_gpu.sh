#!/usr/bin/env bash
# Where a GPU host's run start-up goes (issue 40), in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/startup_profile_gpu.sh
# 1. `python -X importtime` of what a train worker imports (torch, ray.train.torch, the model
#    code), each in a fresh process, the slowest modules summed into $OUT/importtime.txt;
# 2. the runbooks' mainline space (4090_mainline) at PROFILE_STEPS steps, repeats=1, on every GPU;
#    the manifest's start-up breakdowns in $OUT/startup.tsv. PROFILE_SPY=1 adds py-spy over the
#    driver and every Ray process it starts (raw stacks in $OUT/spy.txt.gz); at 20 samples/s
#    over the ~40 processes of a sweep it fell 200 s behind on a 2x H100 host, so its stacks
#    were not usable there: off by default.
# Extra --set arguments are passed to the sweep.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
nproc | tee "$OUT/nproc.txt"
SECONDS=0; make_corpus; echo "corpus ${SECONDS} s" | tee -a "$OUT/prep.log"
{
  for mod in "import torch; torch.cuda.init()" "import ray.train.torch" \
      "from trainables.observe.startup import import_model_code; import_model_code()"; do
    echo "== $mod"
    /usr/bin/time -f "wall %e s" python -X importtime -c "$mod" 2> /tmp/it.txt
    grep -E "^wall" /tmp/it.txt || tail -1 /tmp/it.txt
    grep "import time:" /tmp/it.txt | sort -t'|' -k2 -n -r | head -25
  done
} > "$OUT/importtime.txt" 2>&1
R=/tmp/profile_root; rm -rf $R
spy=()
[ "${PROFILE_SPY:-0}" = 1 ] && spy=(py-spy record --subprocesses --idle --format raw -r 5 -o "$OUT/spy.txt" --)
"${spy[@]}" python -m platform.tune --space 4090_mainline --output-root $R --set manifest_path=$M \
  --set train_workers=$GPUS --set max_steps=${PROFILE_STEPS:-100} --set repeats=1 "$@" \
  2>&1 | quiet | tee "$OUT/sweep.log"
cut -f1,4,11,18,19,20 $R/run_manifest.tsv | tee "$OUT/startup.tsv"
cp $R/groups.json "$OUT/" 2>/dev/null
[ -f "$OUT/spy.txt" ] && gzip -f "$OUT/spy.txt"
