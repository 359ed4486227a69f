"""``python -m platform.analyze OUTPUT_ROOT``: a sweep's tables, best config and summary.

Prints summary.md and writes report.html beside it (one line either way); exit 2 for bad input.
The work is in ``platform.analysis.analyze``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from platform.analysis import stats
from platform.analysis.analyze import analyze
from platform.analysis.report import report_line
from platform.errors import EXIT_USAGE, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m platform.analyze",
        description="Per-run metrics, group summary, ranking, best config and summary of a sweep.",
    )
    p.add_argument("output_root", type=Path, help="a sweep's output root (holds run_manifest.tsv)")
    p.add_argument(
        "--unstable-ratio",
        type=float,
        default=stats.UNSTABLE_RATIO,
        help="a run is unstable when its tail iter p90/p50 exceeds this "
        f"(default {stats.UNSTABLE_RATIO:g})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.unstable_ratio <= 1:
            raise UsageError(f"--unstable-ratio must be > 1, got {args.unstable_ratio}")
        summary = analyze(args.output_root, unstable_ratio=args.unstable_ratio)
    except UsageError as exc:
        print(f"platform.analyze: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(summary["text"])
    print(report_line(args.output_root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
