"""``python -m platform.report OUTPUT_ROOT [--out FILE]``: one self-contained report.html.

Prints ``report: PATH (SIZE MB)``; exit 2 when the folder holds no sweep. The page is built by
``platform.analysis.report``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from platform.analysis.report import write_report
from platform.errors import EXIT_USAGE, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m platform.report",
        description="Write OUTPUT_ROOT/report.html: one self-contained page about a sweep.",
    )
    p.add_argument("output_root", type=Path, help="a sweep's output root (or its analysis files)")
    p.add_argument(
        "--out", type=Path, help="where to write the page (default OUTPUT_ROOT/report.html)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        path = write_report(args.output_root, args.out)
    except UsageError as exc:
        print(f"platform.report: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
