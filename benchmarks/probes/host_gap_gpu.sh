#!/usr/bin/env bash
# Issue 53, item 1 on a 2-GPU host: where the platform's eager DDP loses host time against its
# reference, one suspect at a time, in one command through the device tool:
#   source .gpu/setup.sh && bash benchmarks/probes/host_gap_gpu.sh
# 1. benchmarks.reference_compare --strategies ddp: the reference and the platform (Ray, a
#    resident group) at the references' point; the platform run's config.json is kept.
# 2. HG_PAIRS times, alternating: the bare reference; the reference fed by a torch DataLoader
#    (--loader 4, pinned, as the platform's synthetic data is fed); the platform's own loop
#    without Ray (torchrun -m trainables.torchrun_main, the run's config).
# 3. benchmarks.probes.thread_census beside all of it: each process's threads' CPU use, in cores.
# Writes $OUT/host_gap.md (samples/s of every run, medians per variant) and the logs.
set -u -o pipefail
source "$(dirname "$0")/../gpu_common.sh"
list_gpus
{ nproc; lscpu | grep -E "Model name|Socket|Thread|NUMA|MHz"; nvidia-smi topo -m; } > "$OUT/host.txt" 2>&1
rm -rf /tmp/hg && mkdir -p /tmp/hg
python -m benchmarks.probes.thread_census --out "$OUT/census.jsonl" --period 1 \
  --match benchmarks.strategy_reference --match trainables.torchrun_main --match RayTrainWorker \
  --match ray::  &
CENSUS=$!
python -m benchmarks.reference_compare --strategies ddp --nproc "$GPUS" --output-root /tmp/hg/rc \
  "$@" 2>&1 | quiet | tee "$OUT/rc.log"
cp /tmp/hg/rc/reference_compare.md "$OUT/rc.md" 2>/dev/null
CONFIG=$(ls /tmp/hg/rc/platform/runs/*/config.json | head -1)
REF=(python -m torch.distributed.run --standalone --nproc_per_node="$GPUS" -m benchmarks.strategy_reference
     --strategy ddp)
for i in $(seq "${HG_PAIRS:-2}"); do
  "${REF[@]}" --json /tmp/hg/ref_$i.json 2>&1 | tail -1 | tee -a "$OUT/runs.log"
  "${REF[@]}" --loader 4 --json /tmp/hg/refloader_$i.json 2>&1 | tail -1 | tee -a "$OUT/runs.log"
  python -m torch.distributed.run --standalone --nproc_per_node="$GPUS" -m trainables.torchrun_main \
    --config "$CONFIG" --out /tmp/hg/loop_$i 2>&1 | grep -v "^torchrun: step" | tail -3 | tee -a "$OUT/runs.log"
done
kill $CENSUS; wait $CENSUS 2>/dev/null
python - "$GPUS" <<'EOF' | tee "$OUT/host_gap.md"
import glob, json, statistics, sys
rows = {"reference": [], "reference + DataLoader(4 workers)": [], "platform loop, torchrun": []}
for f in sorted(glob.glob("/tmp/hg/ref_*.json")):
    rows["reference"].append(json.load(open(f))["tail_samples_per_s"])
for f in sorted(glob.glob("/tmp/hg/refloader_*.json")):
    rows["reference + DataLoader(4 workers)"].append(json.load(open(f))["tail_samples_per_s"])
for f in sorted(glob.glob("/tmp/hg/loop_*/torchrun_summary.json")):
    rows["platform loop, torchrun"].append(json.load(open(f))["tail_samples_per_sec_mean"])
base = statistics.median(rows["reference"]) if rows["reference"] else None
print("| variant | tail samples/s (each run) | median | / reference |\n| --- | --- | --- | --- |")
for name, vals in rows.items():
    med = statistics.median(vals) if vals else None
    print(f"| {name} | {', '.join(f'{v:.1f}' for v in vals)} | {med or 0:.1f} | "
          f"{(med / base) if med and base else 0:.3f} |")
EOF
python -m benchmarks.probes.thread_census --summarize "$OUT/census.jsonl" | tee "$OUT/census.md"
