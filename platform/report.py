"""``python -m platform.report OUTPUT_ROOT [--out FILE]``: one self-contained report.html.

Prints ``report: PATH (SIZE MB)``; exit 2 when the folder holds no sweep. The page is built by
``platform.analysis.report.page``. OUTPUT_ROOT may be on object storage (``s3://bucket/prefix``):
the page is built from a local copy of the result files and uploaded beside them
(platform/storage/open_root.py), or written to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from platform.analysis.report.page import write_report
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.open_root import open_root
from stage1_common.fileio import unwritable_parent
from stage1_common.storage import StorageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(
        "python -m platform.report",
        "Write OUTPUT_ROOT/report.html: one self-contained page about a sweep.",
    )
    p.add_argument(
        "output_root",
        help="a sweep's output root (or its analysis files): a folder or s3://bucket/prefix",
    )
    p.add_argument(
        "--out", type=Path, help="where to write the page (default OUTPUT_ROOT/report.html)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.out is not None:
            _check_out(args.out)  # before any work: nothing is read, made or written
        # The page goes beside the sweep's files (on object storage: uploaded there), or to --out.
        with open_root(args.output_root, writes=args.out is None) as root:
            path = write_report(root, args.out)
            where = root.where(path.name) if args.out is None else str(path)
            size = path.stat().st_size
    except (UsageError, StorageError) as exc:
        print(f"platform.report: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report: {where} ({size / 1e6:.2f} MB)")
    return 0


def _check_out(out: Path) -> None:
    """UsageError when the page cannot be written to ``out``: a folder in its place, or a
    nearest existing folder above it that is a file or cannot be written (missing folders are
    made)."""
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file, e.g. {out / 'report.html'}")
    why = unwritable_parent(out.parent)
    if why is None:
        return
    raise UsageError(f"--out {out} cannot be written ({why}); choose a path in a writable folder")


if __name__ == "__main__":
    sys.exit(main())
