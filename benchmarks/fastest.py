"""The fastest configuration against the runbooks' mainline, one command, one machine.

    python -m benchmarks.fastest --space h200_fastest --output-root ROOT \
        --set manifest_path=M [--set KEY=VALUE ...] [--torchrun] [--scaling] [--json OUT.json]

1. Runs the space (its ``baseline`` group is the mainline point) with ``platform.tune``.
2. Prints every group against the baseline: tail samples/s and its ratio, MFU, padding, data
   share (mean data wait over mean iteration, tail windows and whole run), start-up and its
   breakdown, compile_s, and the loss at the first and last window (the same trend?).
3. ``--torchrun``: the winner's configuration under plain torchrun, same loop
   (benchmarks.ray_vs_torchrun): platform over torchrun.
4. ``--scaling``: the winner again on 1, 2, 4, ... GPUs below the space's train_workers (one
   sweep of one run each, same command): efficiency = samples/s(N) / (N x samples/s(1)).

Timings compare only within one command on one machine; quote the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from benchmarks.sweeps import run_variants
from stage1_common.fileio import write_json

PROG = "benchmarks.fastest"


def group_table(root: Path) -> pd.DataFrame:
    """One row per group: the ranking's figures with the run manifest's and the windows'."""
    ranked = pd.read_csv(root / "ranked_groups.csv")
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    timing = pd.read_parquet(root / "timing.parquet")
    per_run = pd.read_csv(root / "per_run_metrics.csv")
    rows = []
    for g in ranked.to_dict("records"):
        runs = manifest[(manifest["group"] == g["group"]) & (manifest["status"] == "ok")]
        first = runs.iloc[0] if len(runs) else {}  # run-level text: the first ok run's
        t = timing[timing["group"] == g["group"]].sort_values(["run", "step"])
        tail = per_run[per_run["group"] == g["group"]]  # the analysis' tail figures per run
        losses = t.groupby("run")["loss"]
        rows.append(
            {
                "group": g["group"],
                "baseline": bool(g.get("baseline", False)),
                "runs_ok": int(g["runs_ok"]),
                "tail_samples_per_s": g["tail_samples_per_sec_robust"],
                "vs_baseline": g.get("vs_baseline"),
                "iter_p50_ms": g["tail_mean_iter_p50_ms"],
                "mfu": tail["mfu"].mean(),
                "padding": t["padding_ratio"].mean(),
                "data_share_run": t["data_ms_mean"].sum() / max(t["iter_ms_mean"].sum(), 1e-9),
                "epochs": int(t["epoch"].max()) + 1 if len(t) else 0,
                "data_share_tail": tail["data_share"].mean(),
                "startup_s": pd.to_numeric(runs["startup_s"], errors="coerce").mean(),
                "compile_s": pd.to_numeric(runs.get("compile_s"), errors="coerce").mean(),
                **{
                    k: first.get(k, "")
                    for k in ("startup_breakdown", "compile_effective", "fallbacks")
                },
                "loss_first": losses.first().mean(),
                "loss_last": losses.last().mean(),
                "peak_mem_gib": t["peak_mem_gib"].max(),
            }
        )
    return pd.DataFrame(rows)


def _markdown(table: pd.DataFrame) -> str:
    cols = [
        ("group", "group", "{}"),
        ("tail_samples_per_s", "tail samples/s", "{:.0f}"),
        ("vs_baseline", "x mainline", "{:.3f}"),
        ("mfu", "MFU", "{:.3f}"),
        ("iter_p50_ms", "iter p50 ms", "{:.1f}"),
        ("padding", "padding", "{:.3f}"),
        ("data_share_run", "data/iter (run)", "{:.4f}"),
        ("epochs", "epochs", "{}"),
        ("startup_s", "startup s", "{:.1f}"),
        ("compile_s", "compile s", "{:.1f}"),
        ("loss_first", "loss first", "{:.3f}"),
        ("loss_last", "loss last", "{:.3f}"),
        ("peak_mem_gib", "peak GiB", "{:.1f}"),
    ]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + " --- |" * len(cols)]
    for row in table.to_dict("records"):
        cells = []
        for key, _, fmt in cols:
            value = row[key]
            try:
                cells.append(fmt.format(value) if pd.notna(value) else "-")
            except (TypeError, ValueError):
                cells.append(str(value))
        if row["baseline"]:
            cells[0] += " (mainline)"
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for row in table.to_dict("records"):
        lines.append(f"- {row['group']}: startup {row['startup_breakdown']}")
        if row["fallbacks"]:
            lines.append(f"  fallbacks: {row['fallbacks']}")
    return "\n".join(lines) + "\n"


def scaling_sizes(workers: int) -> list[int]:
    """The smaller worker counts a winner on ``workers`` GPUs is run at: every power of two."""
    return [n for n in (2**i for i in range(workers.bit_length())) if n < workers]


def _scaling(args: argparse.Namespace, best: dict) -> dict:
    """The winner again at each smaller power of two of GPUs, one sweep each, and the ratios."""
    workers = int(best["config"]["train_workers"])
    per_size = {workers: float(best["tail_samples_per_sec_robust"])}
    sets = [s for s in args.set if not s.startswith("repeats=")]
    sets += [f"{k}={json.dumps(v)}" for k, v in best["swept"].items()] + ["repeats=1"]
    for n in scaling_sizes(workers):
        root = args.output_root.with_name(f"{args.output_root.name}_{n}gpu")
        run_variants(PROG, args.space, root, [*sets, f"train_workers={n}"])
        ranked = root / "ranked_groups.csv"
        if ranked.is_file():
            per_size[n] = float(pd.read_csv(ranked)["tail_samples_per_sec_robust"].iloc[0])
            print(f"scaling: {n} GPU {per_size[n]:.0f} samples/s", flush=True)
    sizes = sorted(per_size)
    result = {"group": best["group"], "samples_per_s": {str(n): per_size[n] for n in sizes}}
    if 1 in per_size:
        result["efficiency"] = {str(n): per_size[n] / (n * per_size[1]) for n in sizes}
    ratio = result.get("efficiency", {})
    shown = [
        f"{n} GPU {per_size[n]:.0f} samples/s"
        + (f" (efficiency {ratio[str(n)]:.3f})" if ratio else "")
        for n in sizes
    ]
    print(f"scaling {best['group']}: " + ", ".join(shown), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--space", default="h200_fastest")
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--torchrun", action="store_true", help="the winner under plain torchrun")
    p.add_argument("--scaling", action="store_true", help="the winner on 1, 2, ... GPUs as well")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args(argv)
    cmd, code, ok = run_variants(PROG, args.space, args.output_root, args.set)
    if not ok:
        return 1
    table = group_table(args.output_root)
    out: dict = {"command": " ".join(cmd), "exit_code": code, "groups": table.to_dict("records")}
    print(_markdown(table), flush=True)
    best_path = args.output_root / "best_config.json"
    if args.torchrun and best_path.is_file():
        from benchmarks import ray_vs_torchrun

        if ray_vs_torchrun.main(["--output-root", str(args.output_root)]) == 0:
            out["ray_vs_torchrun"] = json.loads(
                (args.output_root / "ray_vs_torchrun.json").read_text()
            )
    if args.scaling and best_path.is_file():
        out["scaling"] = _scaling(args, json.loads(best_path.read_text()))
    if args.json:
        write_json(args.json, json.loads(json.dumps(out, default=str)))
        (args.json.with_suffix(".md")).write_text(_markdown(table))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
