#!/usr/bin/env bash
# The adoption pieces on a GPU, where NVML is real (issue 16): a short one-GPU sweep with the
# TensorBoard logger while its Prometheus endpoint is scraped; then every gauge the Grafana
# dashboard reads must be in the scrape (the GPU ones included, which a CPU never sets), and
# report.html must have its GPU section drawn from real NVML samples.
#   source .gpu/setup.sh && bash benchmarks/dashboard_gpu.sh      # on nvidia-h100-x1
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
list_gpus
ROOT=/tmp/dash
rm -rf $ROOT
PORT=18999
( for _ in $(seq 1 400); do
    curl -s "http://127.0.0.1:$PORT/metrics" 2>/dev/null | grep '^ray_stage1_' >> /tmp/scrape.txt
    sleep 1
  done ) &
SCRAPER=$!
python -m platform.tune --space fast_smoke --output-root $ROOT --metrics-port $PORT \
  --logger tensorboard --set train_workers=1 --set dataset=synthetic --set audio_s=2.0 \
  --set 'micro_batch=[32, 64]' --set max_steps=60 --set log_every=10 --set tail_timing_points=3 \
  --set gpu_telemetry_interval_s=1 --set heartbeat_every_s=10 2>&1 | quiet | tee "$OUT/console.log"
kill $SCRAPER 2>/dev/null
sort -u /tmp/scrape.txt | head -200 > "$OUT/scrape.txt"
cp $ROOT/report.html "$OUT/report.html"
python - <<'PY' 2>&1 | tee "$OUT/check.json"
import json, os, re
from pathlib import Path
from platform.record.grafana import dashboard, gauges_in
from tests.test_report import check_filled
out = Path(os.environ.get("OUT", "/tmp/out"))
scraped = set(re.findall(r"^(ray_stage1_\w+)\{", (out / "scrape.txt").read_text(), re.M))
names = gauges_in(dashboard())
found = check_filled((out / "report.html").read_text())
print(json.dumps({
    "dashboard_gauges": sorted(names),
    "scraped_gauges": sorted(scraped),
    "dashboard_names_only_scraped_gauges": names <= scraped,
    "every_dashboard_gauge_scraped": names == scraped & names,
    "report_gpu_images": found.images["gpu"],
    "report_gpu_text": found.text["gpu"][:400],
    "report_bytes": (out / "report.html").stat().st_size,
}, indent=1))
PY
