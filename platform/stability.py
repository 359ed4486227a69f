"""``python -m platform.stability``: the Phase B acceptance check of the runbooks.

    python -m platform.stability --output-root DIR --groups a,b --min-repeats 3 \\
        --max-iter-ratio-median 1.5 --max-iter-ratio-max 2.5 --max-iter-p50-cv 0.05

Prints one verdict line per group (the figures and limits are in platform/analysis/stability.py);
exit 0 when all pass, 1 when any fails, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from platform.analysis.stability import (
    StabilityLimits,
    check,
    group_figures,
    pick_groups,
    verdict_line,
)
from platform.errors import EXIT_USAGE, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m platform.stability", description=__doc__.split("\n")[0]
    )
    p.add_argument("--output-root", type=Path, required=True, help="a sweep's output root")
    p.add_argument("--groups", default="", help="comma-separated group names (default: all)")
    p.add_argument("--min-repeats", type=int, default=StabilityLimits.min_repeats)
    p.add_argument(
        "--max-iter-ratio-median", type=float, default=StabilityLimits.max_iter_ratio_median
    )
    p.add_argument("--max-iter-ratio-max", type=float, default=StabilityLimits.max_iter_ratio_max)
    p.add_argument("--max-iter-p50-cv", type=float, default=StabilityLimits.max_iter_p50_cv)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = StabilityLimits(**{f.name: getattr(args, f.name) for f in fields(StabilityLimits)})
        groups = group_figures(args.output_root)
        names = pick_groups(groups, args.groups, args.output_root)
    except UsageError as exc:
        print(f"platform.stability: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verdicts = check(groups, names, limits)
    for v in verdicts:
        print(verdict_line(v))
    return 0 if all(v["passed"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
