"""``python -m platform.report OUTPUT_ROOT [--out FILE]``: one self-contained report.html.

Prints ``report: PATH (SIZE MB)``; exit 2 when the folder holds no sweep. The page is built by
``platform.analysis.report.page``. OUTPUT_ROOT may be on object storage (``s3://bucket/prefix``):
the page is built from a local copy of the result files and uploaded beside them
(platform/storage/working_copy.py), or written to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from platform.analysis.report.page import write_report
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from platform.storage.working_copy import working_copy
from stage1_common.fileio import unwritable_parent
from stage1_common.output_root import OutputRoot
from stage1_common.storage import Location, StorageError, check_writable, is_remote

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
        if is_remote(args.output_root):
            where, size = _remote(Location.of(args.output_root), args.out)
        else:
            where = write_report(Path(args.output_root), args.out)
            size = where.stat().st_size
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


def _remote(root: Location, out: Path | None) -> tuple[str, int]:
    """The page of a root on object storage: uploaded beside it, or written to ``out``."""
    if out is None:
        check_writable(root)  # before any work: a bucket the page cannot go to is one line
    with working_copy(root) as local:
        path = write_report(local, out, shown_as=root.uri)
        size = path.stat().st_size
    return (str(root.join(OutputRoot.REPORT)) if out is None else str(path)), size


if __name__ == "__main__":
    sys.exit(main())
