"""``python -m platform.analyze OUTPUT_ROOT``: a sweep's tables, best config and summary.

Prints summary.md and writes report.html beside it (one line either way); exit 2 for bad input.
The work is in ``platform.analysis.analyze``. OUTPUT_ROOT may be on object storage
(``s3://bucket/prefix``): the analysis runs on a local copy of the result files and its files
are uploaded beside them (platform/storage/working_copy.py), the training command naming the
bucket's best_config.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from platform.analysis import stats
from platform.analysis.analyze import analyze
from platform.analysis.report.page import report_line
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.results import read_json
from platform.storage.working_copy import working_copy
from stage1_common.output_root import OutputRoot
from stage1_common.storage import Location, StorageError, check_writable, is_remote

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
        if is_remote(args.output_root):
            text, line, train = _remote(Location.of(args.output_root), args.unstable_ratio)
        else:
            root = Path(args.output_root)
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


def _train_command(root: Path) -> str:
    """The platform.train command of the sweep's winner (best_config.json), or ''."""
    best = read_json(Path(root) / OutputRoot.BEST_CONFIG)
    return str(best.get("command") or "")


def _remote(root: Location, unstable_ratio: float) -> tuple[str, str, str]:
    """The analysis of a root on object storage, its files uploaded beside the sweep's."""
    check_writable(root)  # before any work: a bucket the files cannot go to is one line
    with working_copy(root) as local:
        try:
            summary = analyze(local, unstable_ratio=unstable_ratio, shown_as=root.uri)
        except UsageError as exc:  # it names the local copy: name the root instead
            raise UsageError(str(exc).replace(str(local), root.uri)) from None
        return summary["text"], report_line(local, shown_as=root.uri), _train_command(local)


if __name__ == "__main__":
    sys.exit(main())
