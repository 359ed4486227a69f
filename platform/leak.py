"""``python -m platform.leak PATH ...``: does memory grow with steps?

PATH is a sweep's output root (every run) or a run folder ``<root>/runs/<run>``. The fit, its
limits and the verdicts are in platform/analysis/leak.py. Prints one verdict per run (OK, LEAK,
or NOT JUDGED when a memory had too few samples to fit), then the line ``limits: ...`` it
judged by, so that a saved log states its limits (the report judges the folder by them). Exit 0
when every run is OK, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from platform.analysis.leak import LeakLimits, root_verdicts, targets
from platform.analysis.limits import flags_line
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser("python -m platform.leak", __doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", type=Path, help="output roots or run folders")
    p.add_argument(
        "--max-host-mb-per-1k-steps",
        type=float,
        default=LeakLimits.max_host_mb_per_1k_steps,
        help="host RSS growth above this is a leak "
        f"(default {LeakLimits.max_host_mb_per_1k_steps:g})",
    )
    p.add_argument(
        "--skip-fraction",
        type=float,
        default=LeakLimits.skip_fraction,
        help="leave out this first share of the run's steps as warm-up "
        f"(default {LeakLimits.skip_fraction:g})",
    )
    p.add_argument(
        "--max-gpu-mb-per-1k-steps",
        type=float,
        default=LeakLimits.max_gpu_mb_per_1k_steps,
        help="GPU memory growth above this is a leak "
        f"(default {LeakLimits.max_gpu_mb_per_1k_steps:g})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        limits = LeakLimits(**{f.name: getattr(args, f.name) for f in fields(LeakLimits)})
        roots = targets(args.paths)
    except UsageError as exc:
        print(f"platform.leak: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verdicts = [v for root, runs in roots for v in root_verdicts(root, runs, limits)]
    for v in verdicts:
        print(v["line"])
    print(flags_line(limits))
    return 0 if all(v["passed"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
