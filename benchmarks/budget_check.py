"""Issue 57's acceptance, read from the output roots: a ``--budget`` sweep against the full grid
of the same space on the same host (benchmarks/budget_gpu.sh). Prints, and with ``--markdown``
writes: the budget sweep's wall time against its budget, what it ran and left unrun, its winner
with its P(fastest), and whether that is the full grid's winner or a group the grid's report
puts within noise of it; the budget winner's rank and ratio in the grid's ranking, and the grid's
groups ranked above it that the budget sweep never measured; the grid's ranking beside it.

A "within noise" pass is *vacuous* when the grid puts every one of its groups within noise of
its winner: then any name passes (issue 57's compiled check: P(fastest) 0.37, the budget's pick
last in the grid at 0.879x, the two groups that led never run by the budget).

    python -m benchmarks.budget_check BUDGET_ROOT GRID_ROOT [--wall S] [--budget 4m]

Exit code: 0 when the budget sweep named the grid's winner, or a group within noise of it while
the grid tells some group apart from its winner; 1 when it named neither; 3 when it named a
group within noise only because the grid cannot tell any of its groups apart (vacuous). The
wall time is printed and kept in ``--json``, not judged by the exit code.
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
    groups = list(ranked["group"])
    ranked_ok = [r.group for r in ranked.itertuples() if r.runs_ok > 0]
    # Every group the grid ranks with a run is its winner or within noise of it: any name passes.
    vacuous = len(ranked_ok) > 1 and set(ranked_ok) <= noise | {grid_best}
    measured = _measured(budget_root)
    place = groups.index(named) if named in groups else None
    above = groups[:place] if place is not None else groups
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
        "vacuous": bool(vacuous and named != grid_best),
        "budget_winner_grid_rank": None if place is None else place + 1,
        "budget_winner_vs_grid_best": None
        if place is None
        else round(float(ranked["tail_samples_per_sec_robust"].iloc[place]) / top, 3),
        "above_never_measured": [g for g in above if g not in measured],
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


def _measured(root: Path) -> set[str]:
    """The groups a sweep measured: an ok run, or a run a scheduler stopped early."""
    ranked = pd.read_csv(root / "ranked_groups.csv")
    stopped = ranked["runs_stopped"] if "runs_stopped" in ranked else 0
    return set(ranked[(ranked["runs_ok"] > 0) | (stopped > 0)]["group"])


def verdict(out: dict) -> tuple[str, int]:
    """The verdict line's words and the exit code (the module's docstring)."""
    if out["same_winner"]:
        return "the same group", 0
    if not out["within_noise"]:
        return "NOT the grid's winner", 1
    if out["vacuous"]:
        return (
            "a group within noise of it, VACUOUS: the grid puts every group within noise of "
            "its winner, so any name passes",
            3,
        )
    return "a group within noise of it", 0


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
    said, code = verdict(out)
    print(f"verdict: the budget sweep named {said}")
    rank = out["budget_winner_grid_rank"]
    print(
        f"in the grid: {out['budget_winner']} ranks {rank} of {len(out['grid_ranking'])} "
        f"({out['budget_winner_vs_grid_best']:.3f}x the grid's best)"
        if rank
        else f"in the grid: {out['budget_winner']} has no row"
    )
    if out["above_never_measured"]:
        print(f"ranked above it in the grid, never measured by the budget sweep: "
              f"{', '.join(out['above_never_measured'])}")  # fmt: skip
    for r in out["grid_ranking"]:
        print(f"  {r['group']:<40} {r['samples_per_s']:>9} samples/s  {r['vs_best']:.3f}x  "
              f"ok {r['runs_ok']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
