"""``python -m platform.stability``: the Phase B acceptance check of the runbooks.

    python -m platform.stability --output-root DIR --groups a,b --min-repeats 3 \\
        --max-iter-ratio-median 1.5 --max-iter-ratio-max 2.5 --max-iter-p50-cv 0.05

Per group, over its ok runs (figures as in platform/stats.py): the median and the max of the
runs' tail iter p90/p50, and the coefficient of variation (sample std / mean) of the runs' tail
iter p50. A group passes when it has at least --min-repeats ok runs and every figure is at or
below its limit. Prints one verdict line per group; exit 0 when all pass, 1 when any fails, 2 for
bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from platform.analysis import stats
from platform.analysis.analyze import read_manifest
from platform.errors import EXIT_USAGE, UsageError
from platform.storage import results

__all__ = ["check", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m platform.stability", description=__doc__.split("\n")[0]
    )
    p.add_argument("--output-root", type=Path, required=True, help="a sweep's output root")
    p.add_argument("--groups", default="", help="comma-separated group names (default: all)")
    p.add_argument("--min-repeats", type=int, default=3)
    p.add_argument("--max-iter-ratio-median", type=float, default=1.5)
    p.add_argument("--max-iter-ratio-max", type=float, default=2.5)
    p.add_argument("--max-iter-p50-cv", type=float, default=0.05)
    return p


def check(
    groups: pd.DataFrame,
    names: list[str],
    *,
    min_repeats: int,
    max_ratio_median: float,
    max_ratio_max: float,
    max_cv: float,
) -> list[dict]:
    """One verdict per named group (``groups``: stats.group_summary's table)."""
    table = groups.set_index("group")
    verdicts = []
    for name in names:
        g = table.loc[name]
        failures = []
        if g["runs_ok"] < min_repeats:
            failures.append(f"{int(g['runs_ok'])} ok runs < {min_repeats}")
        for label, value, limit in (
            ("iter p90/p50 median", g["iter_ratio_median"], max_ratio_median),
            ("iter p90/p50 max", g["iter_ratio_max"], max_ratio_max),
            ("iter p50 CV", g["iter_p50_cv"], max_cv),
        ):
            if not (isinstance(value, float) and math.isfinite(value)):
                failures.append(f"{label} unknown")
            elif value > limit:
                failures.append(f"{label} {value:.4g} > {limit:g}")
        verdicts.append(
            {
                "group": name,
                "runs_ok": int(g["runs_ok"]),
                "iter_ratio_median": float(g["iter_ratio_median"]),
                "iter_ratio_max": float(g["iter_ratio_max"]),
                "iter_p50_cv": float(g["iter_p50_cv"]),
                "passed": not failures,
                "failures": failures,
            }
        )
    return verdicts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.min_repeats < 1:
            raise UsageError(f"--min-repeats must be >= 1, got {args.min_repeats}")
        for flag in ("max_iter_ratio_median", "max_iter_ratio_max", "max_iter_p50_cv"):
            if getattr(args, flag) <= 0:
                raise UsageError(f"--{flag.replace('_', '-')} must be > 0")
        manifest = read_manifest(args.output_root)
        timing = results.read_dataset(args.output_root / results.TIMING_DIR, results.TIMING_SCHEMA)
        groups = stats.group_summary(stats.per_run_metrics(manifest, timing))
        known = list(groups["group"])
        names = [g.strip() for g in args.groups.split(",") if g.strip()] or known
        unknown = [g for g in names if g not in known]
        if unknown:
            raise UsageError(
                f"--groups: {', '.join(unknown)} not in {args.output_root}; its groups: "
                + ", ".join(known)
            )
    except UsageError as exc:
        print(f"platform.stability: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verdicts = check(
        groups,
        names,
        min_repeats=args.min_repeats,
        max_ratio_median=args.max_iter_ratio_median,
        max_ratio_max=args.max_iter_ratio_max,
        max_cv=args.max_iter_p50_cv,
    )
    for v in verdicts:
        print(
            f"{'PASS' if v['passed'] else 'FAIL'} {v['group']}: {v['runs_ok']} ok runs, iter "
            f"p90/p50 median {v['iter_ratio_median']:.3f} max {v['iter_ratio_max']:.3f}, iter p50 "
            f"CV {v['iter_p50_cv']:.4f}"
            + (f" ({'; '.join(v['failures'])})" if v["failures"] else "")
        )
    return 0 if all(v["passed"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
