"""``python -m platform.leak PATH ...``: does memory grow with steps?

PATH is a sweep's output root (every run) or a run folder ``<root>/runs/<run>``, a folder or on
object storage (``s3://bucket/prefix``: read from a local copy of its result files, nothing
written back: platform/storage/open_root.py). The fit, its limits and the verdicts are in
platform/analysis/verdicts/leak.py. Prints one verdict per run (OK, LEAK, or NOT JUDGED when a
node or a GPU had too few samples to fit: the line names which), one NOT JUDGED line for a
sweep without timing rows (no run could be judged), then the line ``limits: ...`` it judged by,
so that a saved log states its limits (the report judges the folder by them). Exit 0 when
every run is OK, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from dataclasses import fields

from platform.analysis.verdicts.leak import LeakLimits, root_verdicts
from platform.analysis.verdicts.limits import flags_line
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.open_root import open_root, root_of
from stage1_common.storage import StorageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser("python -m platform.leak", __doc__.split("\n")[0])
    p.add_argument(
        "paths",
        nargs="+",
        help="output roots or run folders: folders or s3://bucket/prefix[/runs/RUN]",
    )
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
        with ExitStack() as copies:
            # Every PATH checked (and a bucket's copied) before any line is printed.
            roots = []
            for path in args.paths:
                output_root, runs = root_of(path)
                roots.append((copies.enter_context(open_root(output_root)), runs))
            verdicts = [v for root, runs in roots for v in root_verdicts(root, runs, limits)]
    except (UsageError, StorageError) as exc:
        print(f"platform.leak: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for v in verdicts:
        print(v["line"])
    print(flags_line(limits))
    return 0 if all(v["passed"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
