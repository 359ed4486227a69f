"""Issue 57's acceptance, read from the output roots: a ``--budget`` sweep against the full grid
of the same space on the same host (benchmarks/budget_gpu.sh). Prints, and with ``--markdown``
writes: the budget sweep's wall time against its budget, what it ran and left unrun, its winner
with its P(fastest), and whether that is the full grid's winner or a group the grid's report
puts within noise of it; the grid's ranking beside it.

    python -m benchmarks.budget_check BUDGET_ROOT GRID_ROOT [--wall S] [--budget 4m]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from stage1_common.durations import parse_duration, shown


def compare(budget_root: Path, grid_root: Path) -> dict:
    b = json.loads((budget_root / "summary.json").read_text())
    g = json.loads((grid_root / "summary.json").read_text())
    grid_best = g["best_group"]
    noise = set((g.get("confidence") or {}).get("within_noise") or [])
    named = b["best_group"]
    ranked = pd.read_csv(grid_root / "ranked_groups.csv")
    top = ranked["tail_samples_per_sec_robust"].max()
    return {
        "budget_winner": named,
        "budget_p_fastest": (b.get("confidence") or {}).get("p_fastest"),
        "budget_line": (b.get("budget") or {}).get("line"),
        "budget_how_sure": (b.get("confidence") or {}).get("line"),
        "grid_winner": grid_best,
        "grid_within_noise": sorted(noise),
        "grid_how_sure": (g.get("confidence") or {}).get("line"),
        "same_winner": named == grid_best,
        "within_noise": named == grid_best or named in noise,
        "grid_ranking": [
            {
                "group": r.group,
                "samples_per_s": round(r.tail_samples_per_sec_robust, 1),
                "vs_best": round(r.tail_samples_per_sec_robust / top, 3),
                "runs_ok": r.runs_ok,
            }
            for r in ranked.itertuples()
        ],  # fmt: skip
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.budget_check")
    p.add_argument("budget_root", type=Path)
    p.add_argument("grid_root", type=Path)
    p.add_argument("--wall", type=float, help="the budget sweep's wall seconds")
    p.add_argument("--budget", default="4m")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out = compare(args.budget_root, args.grid_root)
    limit = parse_duration(args.budget)
    if args.wall is not None:
        out["wall_s"] = args.wall
        out["within_budget_plus_30s"] = args.wall <= limit + 30
        print(f"budget sweep: wall {shown(args.wall)} against {shown(limit)} + 30 s: "
              f"{'within' if out['within_budget_plus_30s'] else 'OVER'}")  # fmt: skip
    print(f"budget sweep: {out['budget_line']}")
    print(f"budget sweep names {out['budget_winner']} ({out['budget_how_sure']})")
    print(f"full grid names {out['grid_winner']} ({out['grid_how_sure']})")
    verdict = (
        "the same group"
        if out["same_winner"]
        else ("a group within noise of it" if out["within_noise"] else "NOT the grid's winner")
    )
    print(f"verdict: the budget sweep named {verdict}")
    for r in out["grid_ranking"]:
        print(f"  {r['group']:<40} {r['samples_per_s']:>9} samples/s  {r['vs_best']:.3f}x  "
              f"ok {r['runs_ok']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if out["within_noise"] else 1


if __name__ == "__main__":
    sys.exit(main())
