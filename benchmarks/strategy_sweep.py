"""Strategies side by side on one shape: ``platform.tune`` over a space whose cases differ
only in strategy (benchmarks/spaces/gpu_strategies.yaml: ddp, fsdp2 with both reshard settings,
DeepSpeed ZeRO 1-3), then one row per run: tail samples/s, its ratio to the first case, peak GPU
memory, MFU, and what the run actually used.

    python -m benchmarks.strategy_sweep --space benchmarks/spaces/gpu_strategies.yaml \
        --output-root OUT [--set KEY=VALUE ...]

Writes OUT/strategy_sweep.json and .md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def table(root: Path) -> list[dict]:
    """One row per run of the sweep in ``root``, in the manifest's order."""
    from platform.analysis import stats  # the driver's own tail figures

    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    timing = pd.read_parquet(root / "timing.parquet")
    points = dict(zip(manifest["run"], manifest["tail_timing_points"].astype(int), strict=True))
    figures = stats.run_figures(timing, points)
    rows = []
    for rec in manifest.to_dict("records"):
        fig = figures.get(rec["run"], {})
        rows.append(
            {
                "run": rec["run"],
                "strategy": rec["strategy"],
                "zero_stage": int(rec["zero_stage"]),
                "fsdp_reshard_after_forward": rec["fsdp_reshard_after_forward"],
                "status": rec["status"],
                "strategy_effective": rec.get("strategy_effective", ""),
                "compile": rec.get("compile_effective", ""),
                "tail_samples_per_s": fig.get("tail_samples_per_sec_mean"),
                "peak_mem_gib": fig.get("peak_mem_gib"),
                "mfu": fig.get("mfu"),
            }
        )
    first = rows[0]["tail_samples_per_s"] if rows else None
    for row in rows:
        sps = row["tail_samples_per_s"]
        row["vs_first"] = sps / first if sps and first else None
    return rows


def markdown(rows: list[dict]) -> str:
    f = lambda v, fmt: "" if v is None or v != v else format(v, fmt)  # noqa: E731
    out = [
        "| strategy | ZeRO | reshard | compile | status | samples/s | vs first | peak GiB | MFU |",
        "|" + " --- |" * 9,
    ]
    for r in rows:
        reshard = r["fsdp_reshard_after_forward"] if r["strategy"] == "fsdp2" else ""
        out.append(
            f"| {r['strategy']} | {r['zero_stage']} | {reshard} | {r['compile']} | {r['status']} | "
            f"{f(r['tail_samples_per_s'], '.1f')} | {f(r['vs_first'], '.3f')} | "
            f"{f(r['peak_mem_gib'], '.2f')} | {f(r['mfu'], '.3f')} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.strategy_sweep")
    p.add_argument("--space", required=True)
    p.add_argument("--output-root", required=True, type=Path)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args(argv)
    cmd = [sys.executable, "-m", "platform.tune", "--space", args.space]
    cmd += ["--output-root", str(args.output_root), *[a for s in args.set for a in ("--set", s)]]
    code = subprocess.call(cmd, cwd=ROOT)
    rows = table(args.output_root)
    (args.output_root / "strategy_sweep.json").write_text(json.dumps(rows, indent=1))
    text = markdown(rows)
    (args.output_root / "strategy_sweep.md").write_text(text)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
