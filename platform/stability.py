"""``python -m platform.stability``: the Phase B acceptance check of the runbooks.

    python -m platform.stability --output-root DIR --groups a,b --min-repeats 3 \\
        --max-iter-ratio-median 1.5 --max-iter-ratio-max 2.5 --max-iter-p50-cv 0.05

Prints one verdict line per group: PASS, FAIL (a figure above its limit, named with its value
and the limit, e.g. ``iter p50 CV 0.0532 > 0.05``; or no ok run) or NOT ENOUGH REPEATS (fewer
ok runs than --min-repeats; figures within their limits), then the line ``limits:
--min-repeats 3 ...`` it judged by, so that a saved log states its limits (the report judges
the folder by them). The figures and verdicts are in platform/analysis/verdicts/stability.py.
OUTPUT_ROOT may also be a folder of analysis files only (its group_summary.csv), or on object
storage (``s3://bucket/prefix``: read from a local copy of its result files, nothing written
back: platform/storage/open_root.py). Exit 0 when all pass, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from platform.analysis.verdicts.limits import flags_line
from platform.analysis.verdicts.stability import StabilityLimits, judge, verdict_line
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.open_root import open_root
from stage1_common.storage import StorageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser("python -m platform.stability", __doc__.split("\n")[0])
    p.add_argument(
        "--output-root",
        required=True,
        help="a sweep's output root (or its analysis files): a folder or s3://bucket/prefix",
    )
    p.add_argument("--groups", default="", help="comma-separated group names (default: all)")
    p.add_argument(
        "--min-repeats",
        type=int,
        default=StabilityLimits.min_repeats,
        help="ok runs a group needs (1: a one-run group is judged without its iter p50 CV)",
    )
    p.add_argument(
        "--max-iter-ratio-median",
        type=float,
        default=StabilityLimits.max_iter_ratio_median,
        help="limit of the median over ok runs of the tail iter p90/p50",
    )
    p.add_argument(
        "--max-iter-ratio-max",
        type=float,
        default=StabilityLimits.max_iter_ratio_max,
        help="limit of the largest tail iter p90/p50 of any ok run",
    )
    p.add_argument(
        "--max-iter-p50-cv",
        type=float,
        default=StabilityLimits.max_iter_p50_cv,
        help="limit of the coefficient of variation of the ok runs' tail iter p50",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = StabilityLimits(**{f.name: getattr(args, f.name) for f in fields(StabilityLimits)})
        with open_root(args.output_root) as root:
            verdicts = judge(root, limits, args.groups)
    except (UsageError, StorageError) as exc:
        print(f"platform.stability: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for v in verdicts:
        print(verdict_line(v))
    print(flags_line(limits))
    return 0 if all(v["passed"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
