#!/usr/bin/env bash
# A sweep's first run on a GPU host, a baseline's tree against this one, alternating on one host
# (issue 40), then a worker's way to its first step with and without the device warm-up:
#   git archive REV | tar -x -C .base
#   source .gpu/setup.sh && BASE_DIR=.base bash benchmarks/probes/first_run_gpu.sh
# 1. benchmarks.probes.startup_chain on the runbooks' mainline point (every GPU, 20 steps), from
#    $BASE_DIR (base) and from this checkout (new) in FIRST_RUN_ORDER (default "base new base
#    new"),
#    every process's imports profiled: $OUT/chains.jsonl (one record a line: label, chain,
#    startup_s and its breakdown, launch to first window), $OUT/chains.txt. The machine cache
#    (STAGE1_CACHE_DIR, a new folder by default) starts empty, so this checkout's first sweep
#    is a machine's first.
#    FIRST_RUN_SPY=1: one more sweep of this checkout with py-spy on its first train worker from
#    the moment it is one until SPY_S seconds later (speedscope: samples in order, 100 a second,
#    every thread): $OUT/worker_spy.json.
# 2. benchmarks.probes.first_step (plain, warm; twice each): $OUT/first_step.{json,md}; FIRST_STEP=0
#    leaves it out.
set -u -o pipefail
source "$(dirname "$0")/../gpu_common.sh"
list_gpus
make_corpus
here=$(pwd)
export STAGE1_CACHE_DIR=${STAGE1_CACHE_DIR:-/tmp/stage1-cache-$$}
: > "$OUT/chains.jsonl"
chain() {  # chain LABEL DIR
  python -m benchmarks.probes.startup_chain --tree "$2" --space 4090_mainline --importtime \
    --json /tmp/chain.json --set manifest_path=$M --set train_workers="$GPUS" \
    --set max_steps=20 --set log_every=10 --set repeats=1 --set micro_batch=160 \
    --set num_workers=6 2>&1 | quiet | sed "s/^/[$1] /" | tee -a "$OUT/chains.txt"
  python -c "import json,sys; r=json.load(open('/tmp/chain.json')); r['label']=sys.argv[1]; print(json.dumps(r))" "$1" >> "$OUT/chains.jsonl"
}
spy_worker() {  # py-spy on the first process that becomes a Ray Train worker
  local pid=""
  for _ in $(seq 1200); do
    pid=$(pgrep -f "ray::RayTrainWorker" | head -1)
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] && py-spy record -p "$pid" -d "${SPY_S:-40}" -r 100 --threads --idle \
    --nonblocking --format speedscope -o "$OUT/worker_spy.json" > /dev/null 2>&1
}
declare -A seen=()
for label in ${FIRST_RUN_ORDER:-base new base new}; do
  seen[$label]=$(( ${seen[$label]:-0} + 1 ))
  if [ "$label" = base ]; then
    [ -n "${BASE_DIR:-}" ] && chain "base${seen[$label]}" "$BASE_DIR"
  else
    chain "new${seen[$label]}" "$here"
  fi
done
if [ "${FIRST_RUN_SPY:-0}" = 1 ]; then
  spy_worker & spy=$!
  chain "new_spied" "$here"
  wait $spy
fi
[ "${FIRST_STEP:-1}" = 1 ] || exit 0
# The benchmark's processes as a worker of this checkout's job is started on this host (the
# bytecode in the machine cache where the platform puts it: stage1_common/machine_cache.py).
eval "$(python -c "from stage1_common.machine_cache import bytecode_env; print(' '.join(f'export {k}={v!r};' for k, v in bytecode_env().items()))")"
python -m benchmarks.probes.first_step --repeats 2 --json "$OUT/first_step.json" 2>&1 \
  | tee "$OUT/first_step.md"
