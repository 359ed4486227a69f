"""A space as a full grid and as a race, side by side in one run: both winners, their samples/s,
the steps and the wall time of each, and the race's ratios.

    python -m benchmarks.race --space cpu_race [--set KEY=VALUE ...] [--output-root DIR]
        [--json PATH] [--markdown PATH]

Each sweep is ``python -m platform.tune`` in a subprocess (its progress lines pass through),
the grid with ``scheduler=fifo``, the race with ``scheduler=race``; wall time is the
subprocess's. "Same winner within noise": the race's winner is the grid's, or its figure in the
grid lies inside the grid winner's 95 % interval (or within the race's noise floor of it when the
grid ran one repeat).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def sweep(space: str, root: Path, scheduler: str, sets: list[str]) -> dict[str, Any]:
    args = ["--space", space, "--output-root", str(root), "--set", f"scheduler={scheduler}"]
    args += [a for s in sets for a in ("--set", s)]
    t0 = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "platform.tune", *args], cwd=ROOT)
    wall = time.monotonic() - t0
    summary = json.loads((root / "summary.json").read_text())
    ranking = {g["group"]: g for g in summary["ranking"]}
    best = summary["best_group"]
    early = summary.get("early_stopping") or {}
    import pandas as pd

    timing = pd.read_parquet(root / "timing.parquet")
    rank0 = timing[timing["rank"] == 0]
    return {
        "exit_code": code,
        "wall_s": wall,
        "winner": best,
        "winner_samples_per_s": (ranking.get(best) or {}).get("tail_samples_per_sec_robust"),
        "steps": int(rank0.groupby("run")["step"].max().sum()),
        "runs_started": int(rank0["run"].nunique()),
        "ranking": summary["ranking"],
        "early_stopping": {k: v for k, v in early.items() if k != "scheduler"},
    }


def compare(grid: dict[str, Any], race: dict[str, Any], noise_floor: float) -> dict[str, Any]:
    ranking = {g["group"]: g for g in grid["ranking"]}
    top, theirs = ranking.get(grid["winner"], {}), ranking.get(race["winner"], {})
    low, high = top.get("ci95_low"), top.get("ci95_high")
    value, best = theirs.get("tail_samples_per_sec_robust"), top.get("tail_samples_per_sec_robust")
    if race["winner"] == grid["winner"]:
        same = True
    elif value is None or best is None:
        same = False
    elif low is not None and high is not None:
        same = low <= value <= high
    else:
        same = value >= best * (1 - noise_floor)
    return {
        "same_winner": race["winner"] == grid["winner"],
        "same_winner_within_noise": bool(same),
        "steps_ratio": race["steps"] / grid["steps"] if grid["steps"] else None,
        "wall_ratio": race["wall_s"] / grid["wall_s"] if grid["wall_s"] else None,
    }


def markdown(space: str, grid: dict, race: dict, cmp: dict) -> str:
    def sps(x):
        return "-" if x is None else f"{x:.1f}"

    rows = [
        f"# Grid vs race: `{space}`",
        "",
        "| | full grid | race | race / grid |",
        "| --- | --- | --- | --- |",
        f"| winner | {grid['winner']} | {race['winner']} | "
        f"{'same' if cmp['same_winner'] else ('within noise' if cmp['same_winner_within_noise'] else 'different')} |",
        f"| winner samples/s (robust) | {sps(grid['winner_samples_per_s'])} | "
        f"{sps(race['winner_samples_per_s'])} | |",
        f"| steps run | {grid['steps']} | {race['steps']} | {cmp['steps_ratio']:.2f} |",
        f"| runs started | {grid['runs_started']} | {race['runs_started']} | |",
        f"| wall time | {grid['wall_s']:.0f} s | {race['wall_s']:.0f} s | {cmp['wall_ratio']:.2f} |",
        "",
    ]
    for back in race["early_stopping"].get("readmitted") or []:
        rows.append(f"- {back['group']} came back into the race ({back['why']})")
    for group, e in (race["early_stopping"].get("eliminated") or {}).items():
        rows.append(f"- {group} left the race ({e['kind']}): {e['reason']}")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.race", description=__doc__.split("\n")[0]
    )
    p.add_argument("--space", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--output-root", type=Path, default=Path("outputs") / f"race_bench_{int(time.time())}"
    )
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    from platform.spaces.load import load_space

    noise = load_space(args.space).with_overrides(args.set).scheduler.noise_floor
    grid = sweep(args.space, args.output_root / "grid", "fifo", args.set)
    race = sweep(args.space, args.output_root / "race", "race", args.set)
    cmp = compare(grid, race, noise)
    text = markdown(args.space, grid, race, cmp)
    print("\n" + text)
    record = {"space": args.space, "sets": args.set, "grid": grid, "race": race, **cmp}
    if args.json:
        args.json.write_text(json.dumps(record, indent=2, default=str))
    if args.markdown:
        args.markdown.write_text(text)
    return 0 if grid["exit_code"] == race["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
