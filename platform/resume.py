"""``--resume``: finish a sweep in the output root it was started in.

Runs that finished ok are kept as they are (their rows and manifest entries); failed,
interrupted and never-started runs run again. Their earlier rows are removed from every Parquet
dataset first, so the datasets never hold a run twice.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from platform import results
from platform.errors import UsageError
from platform.spaces import RunSpec

__all__ = ["previous_status", "drop_rows"]

_COUNTS = ("gpu_telemetry_rows", "host_telemetry_rows", "stall_alerts")


def previous_status(output_root: Path, runs: list[RunSpec]) -> dict[str, dict[str, Any]]:
    """The recorded status of every run that finished ok, in the recorder's form. Refuses an
    output root without a sweep, or one holding a different sweep."""
    manifest = Path(output_root) / results.MANIFEST
    if not manifest.is_file():
        raise UsageError(
            f"--resume: {output_root} holds no sweep ({results.MANIFEST} is missing); "
            "drop --resume to start one there"
        )
    with manifest.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    recorded, wanted = [r["run"] for r in rows], [r.name for r in runs]
    if recorded != wanted:
        raise UsageError(
            f"--resume: {output_root} holds a different sweep ({len(recorded)} runs, first "
            f"{recorded[:1]}); resume with the --space and --set that started it"
        )
    done = {}
    for row in rows:
        if row["status"] != "ok":
            continue
        effective = {k: row[k] for k in results.EFFECTIVE_KEYS if row.get(k)}
        done[row["run"]] = {
            "status": "ok",
            "failure_reason": "",
            "duration_sec": float(row["duration_sec"]) if row.get("duration_sec") else None,
            "effective": effective,
            **{k: int(float(row[k])) for k in _COUNTS if row.get(k)},
        }
    return done


def drop_rows(output_root: Path, run_names: list[str]) -> int:
    """Delete the part files of these runs from every dataset; returns how many went."""
    removed = 0
    for folder, _ in results.DATASETS.values():
        for run in run_names:
            for part in (Path(output_root) / folder).glob(f"{run}-*.parquet"):
                part.unlink()
                removed += 1
    return removed
