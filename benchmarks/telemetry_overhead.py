"""What telemetry and heartbeats cost: the same sweep with them off and on, in one run.

    python -m benchmarks.telemetry_overhead --space SPACE --output-root OUT [--repeats 3]
        [--set KEY=VALUE ...] [--json FILE]

Runs ``python -m platform.tune`` on SPACE with ``telemetry`` swept off and on (on: the NVML and
host samplers in every worker, their rows gathered at each report, the driver's heartbeats and
stall checks) and ``repeats`` interleaved repeats, then prints the median tail samples/s of each
variant and their ratio (on / off; the goal is 0.99 or more). For the runs with telemetry it
also prints, per GPU, the number of NVML samples and their median spacing against the set
interval.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from benchmarks.sweeps import run_variants
from stage1_common.fileio import write_json


def summarise(output_root: Path) -> dict:
    manifest = pd.read_csv(output_root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    ok = manifest[manifest["status"] == "ok"]
    variants = {}
    for on, runs in ok.groupby(ok["telemetry"].astype(str) == "True"):
        sps = runs["tail_samples_per_sec_mean"].astype(float)
        variants["on" if on else "off"] = {
            "runs_ok": len(runs),
            "tail_samples_per_s": [round(v, 2) for v in sps],
            "median_tail_samples_per_s": float(sps.median()),
        }
    out: dict = {"variants": variants}
    if {"on", "off"} <= set(variants):
        out["ratio_on_over_off"] = (
            variants["on"]["median_tail_samples_per_s"]
            / variants["off"]["median_tail_samples_per_s"]
        )
    gpu_dir = output_root / "gpu_telemetry.parquet"
    if gpu_dir.is_dir():
        gpu = pd.read_parquet(gpu_dir)
        intervals = dict(
            zip(manifest["run"], manifest["gpu_telemetry_interval_s"].astype(float), strict=True)
        )
        per_gpu = []
        for (run, uuid), rows in gpu.groupby(["run", "gpu_uuid"]):
            spacing = rows.sort_values("ts")["ts"].diff().dropna()
            per_gpu.append(
                {
                    "run": run,
                    "gpu_uuid": uuid,
                    "rank": int(rows["rank"].iloc[0]),
                    "rows": len(rows),
                    "median_spacing_s": float(spacing.median()) if len(spacing) else None,
                    "interval_s": intervals.get(run),
                    "power_w_median": float(rows["power_w"].median()),
                    "util_gpu_pct_median": float(rows["util_gpu_pct"].median()),
                    "sm_clock_mhz_median": float(rows["sm_clock_mhz"].median()),
                    "throttle_reasons_seen": sorted(
                        {int(v) for v in rows["throttle_reasons"].dropna()}
                    ),
                }
            )
        out["gpus"] = per_gpu
        out["gpu_rows_match_manifest"] = all(
            int(manifest.loc[manifest["run"] == run, "gpu_telemetry_rows"].iloc[0])
            == int((gpu["run"] == run).sum())
            for run in gpu["run"].unique()
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", required=True)
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", type=Path, help="also write the summary here")
    args = p.parse_args(argv)
    ran = run_variants(
        "telemetry_overhead",
        args.space,
        args.output_root,
        ["telemetry=[false, true]", f"repeats={args.repeats}", *args.set],
    )
    cmd, code, wrote = ran
    if not wrote:
        return 2 if code == 2 else 1  # bad input stays exit 2
    summary = summarise(args.output_root)
    for name, v in summary["variants"].items():
        print(
            f"telemetry {name:>3}: median tail {v['median_tail_samples_per_s']:.1f} samples/s "
            f"over {v['runs_ok']} runs {v['tail_samples_per_s']}"
        )
    if "ratio_on_over_off" in summary:
        print(f"ratio on/off: {summary['ratio_on_over_off']:.3f} (goal >= 0.99)")
    for g in summary.get("gpus", []):
        print(
            f"  {g['run']} rank {g['rank']} {g['gpu_uuid'][:12]}: {g['rows']} NVML rows, median "
            f"spacing {g['median_spacing_s']:.2f} s (set {g['interval_s']} s), "
            f"{g['power_w_median']:.0f} W, util {g['util_gpu_pct_median']:.0f} %"
        )
    if args.json:
        write_json(args.json, {"command": cmd, "exit_code": code, **summary})
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
