"""``python -m platform.grafana [--out FILE]``: the Grafana dashboard of the ray_stage1_* gauges.

Writes the board ``platform.record.grafana`` builds to FILE; exit 2 when it cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from platform.errors import EXIT_USAGE
from platform.record.cli import cli_parser
from platform.record.grafana import FILENAME, UID, board_json
from platform.storage import results

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(
        "python -m platform.grafana",
        "Write the Grafana dashboard of the platform's ray_stage1_* gauges.",
    )
    p.add_argument("--out", type=Path, default=Path(FILENAME), help=f"default ./{FILENAME}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        results.atomic_write_text(args.out, board_json())
    except OSError as exc:
        print(f"platform.grafana: error: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"dashboard: {args.out} (uid {UID}); import it in Grafana with the Prometheus source")
    return 0


if __name__ == "__main__":
    sys.exit(main())
