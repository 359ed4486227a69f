"""``python -m platform.catalogue``: every sweep and training this machine ran (its catalogue,
platform/storage/catalogue.py), two of them compared, one configuration's history.

    python -m platform.catalogue [list]
    python -m platform.catalogue compare A B    # a sweep (or a prefix of its id), an output
                                                # root, host:FINGERPRINT, torch:VERSION, gpu:NAME
    python -m platform.catalogue history GROUP_OR_COST_KEY
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser

__all__ = ["main"]

PROG = "platform.catalogue"


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(f"python -m {PROG}", "The sweeps this machine ran, compared, and a config's "
                   "history.")  # fmt: skip
    p.add_argument("command", nargs="?", default="list", choices=("list", "compare", "history"))
    p.add_argument("args", nargs="*", help="compare: A B; history: a group or a cost key")
    p.add_argument(
        "--catalogue",
        type=Path,
        action="append",
        help="read this catalogue (a folder of the dataset, or an output root); repeatable "
        "(default: this machine's, in its cache folder)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from platform.analysis import history
    from platform.storage.catalogue import read, store

    try:
        need = {"list": (0, "list takes no arguments"),
                "history": (1, "history takes one group name or cost key"),
                "compare": (2, "compare takes two sides: sweeps, output roots, host:H, torch:V")}  # fmt: skip
        _need(args.args, *need[args.command])
        places = [_place(p) for p in args.catalogue] if args.catalogue else [store()]
        rows = read(*places).to_pandas()
        if args.command == "list":
            table = history.sweeps(rows)
            print(table.to_string(index=False) if len(table) else
                  f"no sweep in the catalogue ({', '.join(map(str, places))}) yet")  # fmt: skip
            return 0
        if args.command == "history":
            table = history.history(rows, args.args[0])
            if table.empty:
                raise UsageError(f"{args.args[0]}: no run of it in the catalogue; see the groups "
                                 "with python -m platform.catalogue list")  # fmt: skip
            print(table.to_string(index=False))
            return 0
        a, b = (_side(rows, s) for s in args.args)
        table = history.compare(a, b)
        if table.empty:
            print(f"{args.args[0]} and {args.args[1]} share no measured configuration")
            return 0
        print(f"b/a of mean tail samples/s, 95 % band: the widest of Welch on the tail windows, "
              "the run-to-run spread pooled over the shared configurations and "
              f"+-{history.NOISE_FLOOR * 100:g} % "
              f"(b = {args.args[1]}, a = {args.args[0]}):")  # fmt: skip
        for r in table.itertuples():
            print(f"  {r.group:<40} {r.a_samples_per_s:9.1f} -> {r.b_samples_per_s:9.1f}  "
                  f"{r.ratio:.3f}x [{r.low:.3f}, {r.high:.3f}]"
                  f"{'  within noise' if r.within_noise else ''}  (runs {r.a_runs}/{r.b_runs}, "
                  f"windows {r.a_windows}/{r.b_windows})")  # fmt: skip
        return 0
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _place(path: Path) -> Path:
    """A catalogue folder, or an output root (its catalogue.parquet)."""
    if (path / "catalogue.parquet").is_file():
        return path / "catalogue.parquet"
    if path.is_dir() or path.is_file():
        return path
    raise UsageError(f"--catalogue {path}: no such folder or file; give a catalogue folder or "
                     "an output root")  # fmt: skip


def _need(args: list[str], n: int, what: str) -> None:
    """One line for a wrong count of arguments."""
    if len(args) != n:
        raise UsageError(f"{what}, got {len(args)}")


def _side(rows: pd.DataFrame, text: str) -> pd.DataFrame:
    """The rows one side of a comparison names."""
    field, sep, value = text.partition(":")
    if sep and field in ("host", "torch", "gpu", "platform", "ray", "deepspeed"):
        picked = rows[rows[field].astype(str).str.startswith(value)]
    elif (Path(text) / "catalogue.parquet").is_file():
        from platform.storage.catalogue import read

        picked = read(Path(text) / "catalogue.parquet").to_pandas()
    else:
        picked = rows[rows["sweep"].astype(str).str.startswith(text)]
    if picked.empty:
        raise UsageError(f"{text}: nothing in the catalogue; name a sweep (its id or a prefix, "
                         "see list), an output root, host:H, torch:V or gpu:NAME")  # fmt: skip
    return picked


if __name__ == "__main__":
    sys.exit(main())
