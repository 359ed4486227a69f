"""Whether checkpoints slow the steps themselves: ``platform.train`` with checkpoints and without,
alternating, per strategy, in one command. ``ckpt_overhead_share`` counts the seconds a save
held training; what it cannot see is a step slowed by checkpoint work beside it (making the
host buffers, the writer process starting). Here each run's windows are compared: the first
timed windows against the run's later ones, and the step time of the runs with checkpoints
against the runs without.

    python -m benchmarks.probes.checkpoint_ab --space h200_train_z1 --manifest PATH \
        --output-root DIR [--strategies ddp,fsdp2] [--every 200] [--repeats 2] [--set KEY=VALUE ...]

Per run: samples/s of windows 1-4, the excess seconds of windows 1-2 over the run's median
window, and the seconds in steps after the start-up window (window 0). Per strategy: the
median over repeats of that step time, with checkpoints over without.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def run(space: str, root: Path, sets: list[str]) -> int:
    cmd = [sys.executable, "-m", "platform.train", "--space", space, "--output-root", str(root)]
    cmd += [a for s in sets for a in ("--set", s)]
    return subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode


def windows(root: Path) -> dict:
    import pandas as pd

    t = pd.read_parquet(root / "timing.parquet")
    t = t[(t["rank"] == 0) & (t["attempt"] == 0)].sort_values("window")
    secs = (t["steps_in_window"] * t["iter_ms_mean"] / 1e3).tolist()
    later = statistics.median(secs[3:]) if len(secs) > 4 else float("nan")
    m = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).iloc[0]
    parts = dict(p.split("=") for p in str(m.get("startup_breakdown", "")).split() if "=" in p)
    return {
        "samples_per_s": [round(x, 1) for x in t["samples_per_s"].tolist()[:5]],
        "excess_w1_w2_s": round(sum(s - later for s in secs[1:3]), 3),
        "step_s": round(sum(secs[1:]), 2),
        "checkpoint_buffers_s": float(parts.get("checkpoint_buffers", 0.0)),
        "ckpt_block_s": float(m.get("ckpt_overhead_share") or 0.0) * sum(secs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", default="h200_train_z1")
    p.add_argument("--manifest", required=True)
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument("--strategies", default="ddp,fsdp2")
    p.add_argument("--every", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args(argv)
    args.output_root.mkdir(parents=True, exist_ok=True)
    rows = []
    for strategy in args.strategies.split(","):
        for r in range(args.repeats):
            for every in (args.every, 0):
                root = args.output_root / f"{strategy}_ck{every}_r{r}"
                sets = [f"manifest_path={args.manifest}", f"strategy={strategy}"]
                sets += [] if strategy == "deepspeed" else ["zero_stage=0"]
                # export_model none: "best" needs checkpoints, and the export is after the steps
                sets += [f"checkpoint_every={every}", "export_model=none", *args.set]
                code = run(args.space, root, sets)
                row = {"strategy": strategy, "every": every, "repeat": r, "exit_code": code}
                if code == 0:
                    row |= windows(root)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        "\n| strategy | checkpoints | repeat | samples/s, windows 0-4 | windows 1-2 excess s "
        "| step s (windows 1-) | checkpoint_buffers s (start-up) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['strategy']} | {r['every'] or 'none'} | {r['repeat']} | "
            f"{r.get('samples_per_s')} | {r.get('excess_w1_w2_s')} | {r.get('step_s')} | "
            f"{r.get('checkpoint_buffers_s')} |"
        )
    summary = {}
    for strategy in args.strategies.split(","):
        mine = [r for r in rows if r["strategy"] == strategy and "step_s" in r]
        on = [r["step_s"] for r in mine if r["every"]]
        off = [r["step_s"] for r in mine if not r["every"]]
        if on and off:
            ratio = statistics.median(on) / statistics.median(off)
            summary[strategy] = {"step_s_with_over_without": round(ratio, 4)}
            print(f"{strategy}: step time with checkpoints / without = {ratio:.4f} (medians)")
    out = args.output_root / "checkpoint_ab.json"
    out.write_text(json.dumps({"runs": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
