#!/usr/bin/env bash
# Where a GPU host's first-run start-up goes, and why its imports are slow (issue 40), in one
# command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/startup_where_gpu.sh
# 1. $OUT/host.txt: the interpreter's bytecode settings, whether the packages a worker imports
#    have bytecode (__pycache__) and can be written, the filesystems, the CPU;
# 2. $OUT/imports.txt: import torch / the model code / ray.train.torch, each twice in new
#    processes, then with the bundle and the image's packages byte-compiled (compileall);
# 3. $OUT/chain.json: benchmarks.startup_chain --importtime on the runbooks' mainline point
#    (every GPU, 20 steps): each Ray process's start, the actor it became and its imports.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
make_corpus
pkgs() { python3 -c "import importlib.util as u, os, sys; [print(os.path.dirname(u.find_spec(m).origin)) for m in sys.argv[1:]]" "$@"; }
{
  python3 -c "import sys, os; print(sys.version); print('dont_write_bytecode', sys.flags.dont_write_bytecode, 'pycache_prefix', sys.pycache_prefix)"
  env | grep -E '^PYTHON' | sort
  for d in $(pkgs torch transformers ray sympy); do
    n_py=$(find "$d" -name '*.py' | wc -l); n_pyc=$(find "$d" -name '*.pyc' | wc -l)
    echo "$d: $n_py .py, $n_pyc .pyc; $(touch "$d/.w" 2>/dev/null && echo writable && rm -f "$d/.w" || echo read-only)"
  done
  df -T / /tmp "$(pkgs transformers)" | cat
  lscpu | grep -E 'Model name|^CPU\(s\)'
  python3 -c "import time; t=time.perf_counter(); sum(range(10**7)); print('sum(range(1e7))', round(time.perf_counter()-t, 3), 's')"
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
MODEL="import transformers.models.bert.modeling_bert, transformers.models.wav2vec2.modeling_wav2vec2"
imports() {  # imports LABEL
  for i in 1 2; do
    for m in "import torch" "$MODEL" "import ray.train.torch"; do
      /usr/bin/time -f "$1 run$i %e s: ${m:0:40}" python3 -c "$m" 2>&1 | tail -1
    done
  done
}
{
  imports "as installed"
  SECONDS=0
  for d in /tmp/site $(pkgs torch transformers); do python3 -m compileall -q -j 0 "$d" >/dev/null 2>&1; done
  echo "compileall: ${SECONDS} s"
  imports "byte-compiled"
} 2>&1 | tee "$OUT/imports.txt"
python -m benchmarks.startup_chain --space 4090_mainline --importtime --json "$OUT/chain.json" \
  --set manifest_path=$M --set train_workers="$GPUS" --set max_steps=20 --set log_every=10 \
  --set repeats=1 --set micro_batch=160 --set num_workers=6 "$@" 2>&1 | quiet | tee "$OUT/chain.txt"
