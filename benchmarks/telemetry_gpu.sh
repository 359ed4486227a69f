#!/usr/bin/env bash
# Issue 5 on a 2-GPU machine, through the device tool:
#   source .gpu/setup.sh && bash benchmarks/telemetry_gpu.sh
# Records NVML's answers for the unit tests' replaying fake, then runs the telemetry overhead
# benchmark (telemetry off/on x 2 repeats, synthetic 2 s batches, 60 steps) whose telemetry runs
# must give NVML rows for every GPU at the set interval. Everything goes to $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python tests/gpu/record_nvml.py "$OUT/nvml_recording.json" --samples 8 --interval-s 0.25
python -m benchmarks.telemetry_overhead --space fast_smoke --output-root /tmp/ov --repeats 2 \
  --set dataset=synthetic --set audio_s=2.0 --set text_tokens=64 --set max_steps=60 \
  --set log_every=10 --set tail_timing_points=3 --json "$OUT/telemetry_overhead.json" 2>&1 \
  | grep -v -e PlacementGroupCleaner -e "Failed to query Ray Train Controller" | tee "$OUT/overhead.log"
cp /tmp/ov/run_manifest.tsv "$OUT/overhead_manifest.tsv"
python -c "import pandas as pd; pd.read_parquet('/tmp/ov/gpu_telemetry.parquet').to_csv('$OUT/gpu_telemetry.csv', index=False)"
python -c "import pandas as pd; pd.read_parquet('/tmp/ov/host_telemetry.parquet').to_csv('$OUT/host_telemetry.csv', index=False)"
cp /tmp/ov/runs/*_r1/env.json "$OUT/" 2>/dev/null || true
