"""``python -m platform.leak PATH ...``: does memory grow with steps?

PATH is a sweep's output root (every run) or a run folder ``<root>/runs/<run>``, a folder or on
object storage (``s3://bucket/prefix``: read from a local copy of its result files, nothing
written back: platform/storage/read_copy.py). The fit, its limits and the verdicts are in
platform/analysis/verdicts/leak.py. Prints one verdict per run (OK, LEAK, or NOT JUDGED when a node or a
GPU had too few samples to fit: the line names which), one NOT JUDGED line for a sweep without
timing rows (no run could be judged), then the line ``limits: ...`` it judged by, so that a
saved log states its limits (the report judges the folder by them). Exit 0 when every run is
OK, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from contextlib import ExitStack
from dataclasses import fields
from pathlib import Path

from platform.analysis.verdicts.leak import LeakLimits, root_verdicts, targets
from platform.analysis.verdicts.limits import flags_line
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.read_copy import check_readable, read_copy
from stage1_common.output_root import OutputRoot
from stage1_common.storage import Location, StorageError, explain, is_remote

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
            roots = [_target(path, copies) for path in args.paths]
            verdicts = [
                v for root, runs, shown in roots for v in root_verdicts(root, runs, limits, shown)
            ]
    except (UsageError, StorageError) as exc:
        print(f"platform.leak: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for v in verdicts:
        print(v["line"])
    print(flags_line(limits))
    return 0 if all(v["passed"] for v in verdicts) else 1


def _target(path: str, copies: ExitStack) -> tuple[OutputRoot, list[str] | None, str]:
    """(output root, runs or None for all, the root's name in the lines) of one PATH; a root
    on object storage is copied to a local folder that ``copies`` removes at the end."""
    if not is_remote(path):
        ((root, runs),) = targets([Path(path)])
        return root, runs, str(root)
    location = Location.of(path)
    root, runs = _remote_root(location)
    return OutputRoot(copies.enter_context(read_copy(root))), runs, root.uri


def _remote_root(location: Location) -> tuple[Location, list[str] | None]:
    """As ``targets`` for a path on object storage: the root and its runs (None: all)."""
    parent, run = posixpath.split(location.path)
    top, runs_dir = posixpath.split(parent)
    base, sep, query = location.uri.partition("?")
    top_uri = posixpath.dirname(posixpath.dirname(base)) + sep + query
    check_readable(location)  # a bucket that is not there is its own line
    try:
        if location.join(OutputRoot.MANIFEST).exists():
            return location, None
        root = Location(location.fs, top, top_uri)
        if runs_dir == OutputRoot.RUNS and root.join(OutputRoot.MANIFEST).exists():
            return root, [run]
    except OSError as exc:
        raise StorageError(f"{location}: {explain(location, exc)}") from None
    raise UsageError(
        f"{location} is neither a sweep's output root nor a run folder <root>/runs/<run>; "
        "give one of those"
    )


if __name__ == "__main__":
    sys.exit(main())
