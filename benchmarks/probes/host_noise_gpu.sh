#!/usr/bin/env bash
# Issue 53, item 1, second step on a 2-GPU host: the platform's loop runs at the reference's
# speed under torchrun but not under Ray (host_gap_gpu.sh). Does other work on the machine's
# cores slow the reference the same way, and which of Ray's processes are busy meanwhile?
#   source .gpu/setup.sh && bash benchmarks/probes/host_noise_gpu.sh
# 1. HN_PAIRS times: the bare reference (DDP, the references' point), then the same with
#    HN_BURNERS processes spinning on the CPU beside it (nothing else shared).
# 2. The platform at the same point (DDP, HN_REPEATS runs in one sweep), as it is, then with
#    RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=2 (Ray's default; the platform sets 0.25).
# 3. The platform's loop under torchrun, its windows kept (cpu_s, gc_ms per window).
# benchmarks.probes.thread_census --all beside it: $OUT/census.md lists the busiest other processes.
# Writes $OUT/host_noise.md and $OUT/data.tar.gz (timing windows of both sides, manifests).
set -u -o pipefail
source "$(dirname "$0")/../gpu_common.sh"
list_gpus
rm -rf /tmp/hn && mkdir -p /tmp/hn
python -m benchmarks.probes.thread_census --out /tmp/hn/census.jsonl --period 1 \
  --match benchmarks.strategy_reference --match trainables.torchrun_main --match RayTrainWorker &
CENSUS=$!
REF=(python -m torch.distributed.run --standalone --nproc_per_node="$GPUS" -m benchmarks.strategy_reference
     --strategy ddp)
for i in $(seq "${HN_PAIRS:-2}"); do
  "${REF[@]}" --json /tmp/hn/ref_$i.json 2>&1 | tail -1
  BURN=()
  for b in $(seq "${HN_BURNERS:-2}"); do python -c "while True: pass" & BURN+=($!); done
  "${REF[@]}" --json /tmp/hn/refburn_$i.json 2>&1 | tail -1
  kill "${BURN[@]}"
done
python - "${HN_REPEATS:-3}" <<'PY'
import sys, yaml
space = yaml.safe_load(open("benchmarks/spaces/strategy_references.yaml"))
space["cases"] = [c for c in space["cases"] if c["strategy"] == "ddp"]
space["repeats"] = int(sys.argv[1])
yaml.safe_dump(space, open("/tmp/hn/ddp.yaml", "w"), sort_keys=False)
PY
SETS=(--set train_workers="$GPUS")
python -m platform.tune --space /tmp/hn/ddp.yaml --output-root /tmp/hn/plat "${SETS[@]}" 2>&1 | quiet | grep -E "ok in|tail|samples/s  " | tee /tmp/hn/plat.log
RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=2 python -m platform.tune --space /tmp/hn/ddp.yaml --output-root /tmp/hn/plat_hc2 \
  "${SETS[@]}" 2>&1 | quiet | grep -E "ok in|tail|samples/s  " | tee /tmp/hn/plat_hc2.log
CONFIG=$(ls /tmp/hn/plat/runs/*/config.json | head -1)
python -m torch.distributed.run --standalone --nproc_per_node="$GPUS" -m trainables.torchrun_main \
  --config "$CONFIG" --out /tmp/hn/loop 2>&1 | grep "torchrun: tail"
kill $CENSUS; wait $CENSUS 2>/dev/null
python -m benchmarks.probes.thread_census --summarize /tmp/hn/census.jsonl > "$OUT/census.md"
python - <<'PY' | tee "$OUT/host_noise.md"
import glob, json, statistics
import pandas as pd
def refs(pat):
    return [json.load(open(f))["tail_samples_per_s"] for f in sorted(glob.glob(pat))]
rows = {"reference": refs("/tmp/hn/ref_*.json"), "reference + spinning processes": refs("/tmp/hn/refburn_*.json")}
for name, root in (("platform (Ray)", "/tmp/hn/plat"), ("platform (Ray), health check 2 s", "/tmp/hn/plat_hc2")):
    try:
        m = pd.read_csv(f"{root}/run_manifest.tsv", sep="\t")
        rows[name] = list(m["tail_samples_per_sec_mean"])
    except Exception as e:
        rows[name] = []
try:
    rows["platform loop, torchrun"] = [json.load(open("/tmp/hn/loop/torchrun_summary.json"))["tail_samples_per_sec_mean"]]
except Exception:
    pass
base = statistics.median(rows["reference"])
print("| variant | tail samples/s (each run) | median | / reference |\n| --- | --- | --- | --- |")
for name, vals in rows.items():
    med = statistics.median(vals) if vals else 0
    print(f"| {name} | {', '.join(f'{v:.1f}' for v in vals)} | {med:.1f} | {med / base:.3f} |")
cols = ["run", "step", "samples_per_s", "iter_ms_p50", "step_ms_p50", "data_ms_p50", "cpu_ms_mean", "gc_ms", "gc_collections", "report_ms"]
for root in ("/tmp/hn/plat", "/tmp/hn/plat_hc2"):
    try:
        t = pd.read_parquet(f"{root}/timing.parquet")
        print(f"\n{root} windows:\n" + t[[c for c in cols if c in t.columns]].to_string(index=False))
    except Exception as e:
        print(root, e)
try:
    rows = [json.loads(l) for l in open("/tmp/hn/loop/torchrun_timing.jsonl")]
    print("\ntorchrun windows:\n" + pd.DataFrame(rows)[[c for c in cols if c in rows[0]]].to_string(index=False))
except Exception as e:
    print(e)
PY
tar czf "$OUT/data.tar.gz" -C /tmp/hn --exclude='*.pt' --exclude=tune census.jsonl plat/timing.parquet plat/run_manifest.tsv \
  plat_hc2/timing.parquet plat_hc2/run_manifest.tsv loop/torchrun_timing.jsonl 2>/dev/null
