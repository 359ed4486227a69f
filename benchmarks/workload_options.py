"""torch.compile and length bucketing against the plain workload, side by side in one sweep.

    python -m benchmarks.workload_options --space SPACE --output-root OUT
        [--sweep torch_compile|length_bucketing ...] [--set KEY=VALUE ...] [--json FILE]

Runs ``python -m platform.tune`` on SPACE with ``torch_compile`` x ``length_bucketing`` swept
on and off (or only the ``--sweep`` ones; all off is the baseline; every other key as the space
and ``--set`` say), then prints, per variant, tail samples/s, padding ratio, data share of iter
time, MFU, start-up time and the ratio of its samples/s to the baseline's. The variants run in
one sweep on one machine, interleaved with any repeats, so the ratios compare like with like.
Compile time shows in startup_s and in the first windows, not in the tail.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from benchmarks.sweeps import run_variants
from stage1_common.fileio import write_json
from stage1_common.tail import tail_start

OPTIONS = ("torch_compile", "length_bucketing")


def summarise(output_root: Path) -> pd.DataFrame:
    """One row per variant (group): means over its ok runs, from rank 0's windows."""
    manifest = pd.read_csv(output_root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    timing = pd.read_parquet(output_root / "timing.parquet")
    timing = timing[timing["rank"] == 0]
    rows = []
    for group, runs in manifest.groupby("group", sort=False):
        ok = runs[runs["status"] == "ok"]
        # The same tail as the run figures: each run's last tail_timing_points windows after
        # its first (stage1_common/tail.py).
        ordered = [timing[timing["run"] == run].sort_values("window") for run in ok["run"]]
        tails = [
            windows.iloc[tail_start(len(windows), points) :]
            for windows, points in zip(ordered, ok["tail_timing_points"], strict=True)
        ]
        tail = pd.concat(tails) if tails else timing.iloc[0:0]
        rows.append(
            {
                "group": group,
                "torch_compile": str(runs["torch_compile"].iloc[0]),
                "length_bucketing": str(runs["length_bucketing"].iloc[0]),
                "runs_ok": len(ok),
                "compile_effective": ";".join(sorted(set(runs["compile_effective"]))),
                "tail_samples_per_s": ok["tail_samples_per_sec_mean"].astype(float).mean(),
                "padding_ratio": tail["padding_ratio"].mean(),
                "data_share": (tail["data_ms_mean"] / tail["iter_ms_mean"]).mean(),
                "mfu": tail["mfu"].mean(),
                "peak_mem_gib": tail["peak_mem_gib"].max(),
                "startup_s": timing[timing["run"].isin(ok["run"])]
                .groupby("run")["startup_s"]
                .first()
                .mean(),
            }
        )
    table = pd.DataFrame(rows)
    base = table[(table["torch_compile"] != "True") & (table["length_bucketing"] != "True")]
    reference = float(base["tail_samples_per_s"].iloc[0]) if len(base) else float("nan")
    table["ratio_to_baseline"] = table["tail_samples_per_s"] / reference
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", required=True)
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--sweep",
        action="append",
        choices=OPTIONS,
        help="option to compare on and off (repeatable; default: both)",
    )
    p.add_argument("--json", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    swept = [f"{key}=[false, true]" for key in args.sweep or OPTIONS]
    ran = run_variants("workload_options", args.space, args.output_root, [*swept, *args.set])
    cmd, code, wrote = ran
    if not wrote:
        return 2 if code == 2 else 1  # bad input stays exit 2
    table = summarise(args.output_root)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns="group").round(3).to_string(index=False))
    if args.json:
        write_json(
            args.json,
            {"command": cmd, "exit_code": code, "variants": table.to_dict("records")},
        )
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
