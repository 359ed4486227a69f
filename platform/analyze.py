"""``python -m platform.analyze OUTPUT_ROOT``: a sweep's tables, best config and summary.

Prints summary.md and writes report.html beside it (one line either way); exit 2 for bad input.
The work is in ``platform.analysis.analyze``. OUTPUT_ROOT may be on object storage
(``s3://bucket/prefix``): the analysis runs on a local copy of the result files and its files
are uploaded beside them (platform/storage/open_root.py), the training command naming the
bucket's best_config.json.
"""

from __future__ import annotations

import argparse
import sys

from platform.analysis import stats
from platform.analysis.analyze import analyze
from platform.analysis.report.page import report_line
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.open_root import open_root
from platform.storage.results import read_json
from stage1_common.output_root import OutputRoot
from stage1_common.storage import StorageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(
        "python -m platform.analyze",
        "Per-run metrics, group summary, ranking, best config and summary of a sweep.",
    )
    p.add_argument(
        "output_root",
        help="a sweep's output root (holds run_manifest.tsv): a folder or s3://bucket/prefix",
    )
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
        with open_root(args.output_root, writes=True) as root:
            text = analyze(root, unstable_ratio=args.unstable_ratio)["text"]
            line, train = report_line(root), _train_command(root)
    except (UsageError, StorageError) as exc:
        print(f"platform.analyze: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(text)
    if train:
        print(f"train with it: {train}")
    print(line)
    return 0


def _train_command(root: OutputRoot) -> str:
    """The platform.train command of the sweep's winner (best_config.json), or ''."""
    return str(read_json(root.best_config).get("command") or "")


if __name__ == "__main__":
    sys.exit(main())
