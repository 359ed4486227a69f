#!/usr/bin/env bash
# Issue 4's workload options on a 2-GPU machine, through the device tool:
#   source .gpu/setup.sh && bash benchmarks/workload_options_gpu.sh options     # compile x bucketing
#   source .gpu/setup.sh && bash benchmarks/workload_options_gpu.sh compile     # static shapes
#   source .gpu/setup.sh && bash benchmarks/workload_options_gpu.sh pretrained  # checkpoints, DS z1
# Logs and result files go to $OUT. The corpus (1,600 utterances of 2-8 s) is made once per
# machine under /tmp and reused while the machine stays warm.
set -u -o pipefail
source "$(dirname "$0")/gpu_common.sh"
[ "${1:-options}" != compile ] && make_corpus

case "${1:-options}" in
options)
  # DDP z0 mb160 nw8 pf4 (fast_smoke) with torch_compile x length_bucketing, every rank timed.
  python -m benchmarks.workload_options --space fast_smoke --output-root /tmp/wo \
    --set manifest_path=$M --set max_steps=80 --set log_every=10 --set tail_timing_points=3 \
    --set timing_ranks=all --json "$OUT/workload_options.json" 2>&1 | quiet | tee "$OUT/options.log"
  cp /tmp/wo/run_manifest.tsv "$OUT/options_manifest.tsv"
  python -c "import pandas as pd; pd.read_parquet('/tmp/wo/timing.parquet').to_csv('$OUT/options_timing.csv', index=False)"
  ;;
compile)
  # torch.compile on fixed shapes: synthetic 2 s utterances and 64 tokens, static compile.
  python -m benchmarks.workload_options --space fast_smoke --output-root /tmp/wc --sweep torch_compile \
    --set dataset=synthetic --set audio_s=2.0 --set text_tokens=64 --set compile_dynamic=false \
    --set max_steps=60 --set log_every=10 --set tail_timing_points=3 \
    --json "$OUT/compile_static.json" 2>&1 | quiet | tee "$OUT/compile.log"
  cp /tmp/wc/run_manifest.tsv "$OUT/compile_manifest.tsv"
  ;;
pretrained)
  # Random base-size weights saved with save_pretrained stand in for downloaded checkpoints.
  python -c "
from trainables.model.stage1 import build_model
m = build_model('base', 256)
m.speech.save_pretrained('/tmp/ckpt/speech'); m.text.save_pretrained('/tmp/ckpt/text')" 2>&1 | tail -1
  python -m platform.tune --space fast_smoke --output-root /tmp/pt --set manifest_path=$M \
    --set strategy=deepspeed --set zero_stage=1 --set speech_pretrained_path=/tmp/ckpt/speech \
    --set text_pretrained_path=/tmp/ckpt/text --set max_steps=40 --set log_every=10 \
    --set tail_timing_points=2 2>&1 | quiet | tee "$OUT/pretrained.log"
  cp /tmp/pt/run_manifest.tsv "$OUT/pretrained_manifest.tsv"
  ;;
esac
