"""``python -m platform.calibrate``: the platform against its references at one point on this
machine, kept in the machine cache and shown in every sweep's summary and report.

    python -m platform.calibrate [--strategies ddp,fsdp2,zero1,zero2] [--pairs 3] [--nproc N]
        [--set KEY=VALUE ...] [--output-root DIR] [--compile-cache-dir DIR]
    python -m platform.calibrate --from DIR [--compile-cache-dir DIR]

The first runs ``python -m benchmarks.reference_compare`` (each strategy's bare reference,
then the platform at the same point, ``--pairs`` turns; its output in ``--output-root``) and
stores its result; ``--from`` stores a reference_compare.json measured earlier (DIR holds it,
or is it) and runs nothing. The calibration goes to ``<machine cache>/calibration.json``
(``--compile-cache-dir``, else STAGE1_CACHE_DIR, else the user's cache folder), replacing the
host's older one (platform/analysis/calibration.py). Prints each comparison's ratio; exit 0
when every comparison asked for was measured, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from platform.analysis.calibration import REFERENCES, entry_of, host_name, store, utc_time
from platform.errors import EXIT_USAGE, UsageError
from platform.record.cli import cli_parser
from stage1_common.machine_cache import machine_cache
from stage1_common.version import git

__all__ = ["build_parser", "main"]

PROG = "platform.calibrate"
RESULT = "reference_compare.json"  # what benchmarks/reference_compare.py writes
ROOT = Path(__file__).resolve().parents[1]
# What only a measurement takes (--from stores one already made).
MEASURING = ("strategies", "pairs", "nproc", "set", "output_root")


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(
        f"python -m {PROG}",
        "Measure the platform against its references at one point on this machine (or store "
        "a measurement made), and keep it in the machine cache for every sweep's report.",
    )
    p.add_argument(
        "--strategies",
        help=f"comparisons to measure, of {', '.join(REFERENCES)} (default: ddp,fsdp2,zero1,zero2)",
    )
    p.add_argument("--pairs", type=int, help="turns of references then platform (default: 3)")
    p.add_argument("--nproc", type=int, help="processes, one per GPU (default: 2)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="passed to the platform's sweep (on a CPU: num_workers=0, cpus_per_worker=1)",
    )
    p.add_argument(
        "--output-root",
        type=Path,
        help="reference_compare's folder (default: outputs/calibrate_<time>)",
    )
    p.add_argument(
        "--compile-cache-dir",
        type=Path,
        help="the machine cache to keep the calibration in, and the sweep's compile cache "
        "(default: STAGE1_CACHE_DIR, else the user's cache folder)",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="DIR",
        help="store this reference_compare.json (or the one in this folder) and run nothing",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cache = _cache(args.compile_cache_dir)
        if args.source is not None:
            given = [f"--{k.replace('_', '-')}" for k in MEASURING if getattr(args, k) is not None]
            if given:
                raise UsageError(
                    f"--from stores a measurement already made; {', '.join(given)} only go "
                    "with a new one: leave them out"
                )
            result = args.source / RESULT if args.source.is_dir() else args.source
            record = _read(result)
            measured = utc_time(_written(result))  # where the record does not say
        else:
            command, result = _measurement(args, cache)
            print(f"{PROG}: measuring into {result.parent}: {' '.join(command)}", flush=True)
            code = subprocess.run(command, cwd=ROOT, check=False).returncode
            if not result.is_file():
                print(f"{PROG}: reference_compare wrote no {RESULT} (exit {code})", file=sys.stderr)
                return 1
            record, measured = _read(result), utc_time()
        entry = entry_of(record, measured=measured, source=str(result.resolve()))
        path, older = store(cache, entry)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _print_stored(entry, path, older)
    asked = [str(r.get("strategy")) for r in record["rows"]]
    missing = [s for s in asked if s not in entry["comparisons"]]
    if missing:
        print(f"{PROG}: not measured (a side failed): {', '.join(missing)}")
    return 1 if missing else 0


def _cache(configured: Path | None) -> Path:
    """The machine cache folder; an existing file in its place is bad input."""
    cache = machine_cache(str(configured.expanduser().resolve()) if configured else "")
    if cache.exists() and not cache.is_dir():
        raise UsageError(f"--compile-cache-dir {cache} is a file; give a folder")
    return cache


def _measurement(args: argparse.Namespace, cache: Path) -> tuple[list[str], Path]:
    """reference_compare's command and the file it will write; UsageError for bad values."""
    strategies = args.strategies or "ddp,fsdp2,zero1,zero2"
    unknown = [s for s in strategies.split(",") if s not in REFERENCES]
    if unknown or not strategies:
        raise UsageError(
            f"--strategies {strategies}: unknown {', '.join(unknown)}; of {', '.join(REFERENCES)}"
        )
    pairs = 3 if args.pairs is None else args.pairs
    if pairs < 1:
        raise UsageError(f"--pairs {pairs}: at least 1")
    if args.nproc is not None and args.nproc < 1:
        raise UsageError(f"--nproc {args.nproc}: at least 1")
    out = args.output_root or Path("outputs") / time.strftime("calibrate_%Y%m%d-%H%M%S")
    out = out.expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--output-root {out} is not an empty folder; name a new one")
    command = [sys.executable, "-m", "benchmarks.reference_compare", "--strategies", strategies]
    command += ["--pairs", str(pairs), "--output-root", str(out)]
    if args.nproc is not None:
        command += ["--nproc", str(args.nproc)]
    sets = list(args.set or [])
    if args.compile_cache_dir is not None:  # the sweep compiles into the same machine cache
        sets.append(f"compile_cache_dir={cache}")
    command += [a for item in sets for a in ("--set", item)]
    return command, out / RESULT


def _read(path: Path) -> dict:
    """A reference_compare.json's record; UsageError for a file that is missing or not one."""
    if not path.is_file():
        raise UsageError(f"--from {path}: no such file; give a folder holding {RESULT}, or it")
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from {path}: not readable JSON ({exc})") from None
    if not isinstance(record, dict):
        raise UsageError(f"--from {path}: not a {RESULT} (no rows)")
    return record


def _written(path: Path) -> float:
    """When a file was written, as near as can be told: its modification time, or its last
    commit's where that is earlier (a checkout writes a committed result anew)."""
    committed = git("log", "-1", "--format=%ct", "--", path.name, checkout=path.resolve().parent)
    mtime = path.stat().st_mtime
    return min(mtime, float(committed)) if committed else mtime


def _print_stored(entry: dict, path: Path, older: dict | None) -> None:
    host = host_name(entry["host"])
    replaced = f", replacing the one measured {older.get('measured')}" if older else ""
    print(f"calibration of {host}, measured {entry['measured']}, stored in {path}{replaced}:")
    for name, c in entry["comparisons"].items():
        versus = "" if c["reference"] == name else f" (vs {c['reference']})"
        print(
            f"  {name}{versus}: platform at {c['ratio']:.3f} of its reference "
            f"({c['pairs']} pair{'' if c['pairs'] == 1 else 's'}, {c['low']:.3f}-{c['high']:.3f})"
        )


if __name__ == "__main__":
    sys.exit(main())
