"""``--resume``: finish a sweep in the output root it was started in.

Runs that finished ok are kept as they are (their rows and manifest entries); failed,
interrupted and never-started runs run again. Their earlier rows are removed from every Parquet
dataset first, so the datasets never hold a run twice.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from platform.errors import UsageError
from platform.spaces.expand import RunSpec
from platform.storage import results
from stage1_common.fileio import remove_stale_temporaries
from stage1_common.output_root import OutputRoot

__all__ = ["EARLY_STATUSES", "clear_earlier_attempts", "drop_rows", "previous_status"]

# Runs the scheduler ended on purpose (platform/control/race.py): kept by --resume like ok runs.
EARLY_STATUSES = ("stopped_early", "skipped")

_COUNTS = ("gpu_telemetry_rows", "host_telemetry_rows", "stall_alerts")


def previous_status(root: OutputRoot, runs: list[RunSpec]) -> dict[str, dict[str, Any]]:
    """The recorded status of every run that finished ok, in the recorder's form; ``runs`` put
    in the order the earlier attempt ran them (a warm start may have ordered them from the
    catalogue of that time). Refuses an output root without a sweep, or one holding a
    different sweep."""
    manifest = root.manifest
    if not manifest.is_file() and _started(root):
        return {}  # the earlier attempt stopped before its manifest was written: nothing ran
    if not manifest.is_file():
        raise UsageError(
            f"--resume: {root.shown} holds no sweep ({OutputRoot.MANIFEST} is missing); "
            "drop --resume to start one there"
        )
    with manifest.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    recorded, wanted = [r["run"] for r in rows], [r.name for r in runs]
    if sorted(recorded) != sorted(wanted):
        raise UsageError(
            f"--resume: {root.shown} holds a different sweep ({len(recorded)} runs, first "
            f"{recorded[:1]}); resume with the --space and --set that started it"
        )
    order = {name: i for i, name in enumerate(recorded)}
    runs.sort(key=lambda r: order[r.name])
    done = {}
    for row in rows:
        if row["status"] not in ("ok", *EARLY_STATUSES):
            continue
        effective = {k: row[k] for k in results.EFFECTIVE_KEYS if row.get(k)}
        done[row["run"]] = {
            "status": row["status"],
            "failure_reason": row.get("failure_reason") or "",
            "exit_code": 0 if row["status"] != "skipped" else None,
            "duration_sec": float(row["duration_sec"]) if row.get("duration_sec") else None,
            "effective": effective,
            **{k: int(float(row[k])) for k in _COUNTS if row.get(k)},
            **{
                k: row[k]
                for k in (*results.PLACEMENT_KEYS, *results.STARTUP_KEYS)
                if row.get(k) not in (None, "")
            },
        }
    return done


def _started(root: OutputRoot) -> bool:
    """A sweep was started here (the driver writes these before the manifest)."""
    return root.runs.is_dir() or root.data.is_dir()


def drop_rows(root: OutputRoot, run_names: list[str], *, keep_parts: bool = False) -> int:
    """Delete the part files of these runs from every dataset (unless ``keep_parts``: a
    training run resumes from a checkpoint and keeps what it measured), the files their
    earlier attempt left in ``runs/<run>/``, and the temporaries of writes a SIGKILL cut short;
    returns how many part files went."""
    removed = 0
    for folder, _ in () if keep_parts else results.DATASETS.values():
        for run in run_names:
            for part in (root / folder).glob(f"{run}-*.parquet"):
                part.unlink()
                removed += 1
    for run in run_names:
        for path in _attempt_files(root, run, again=not keep_parts):
            path.unlink(missing_ok=True)
    remove_stale_temporaries(root.path)
    return removed


def _attempt_files(root: OutputRoot, run: str, *, again: bool) -> list[Path]:
    """What one attempt of a run leaves in ``runs/<run>/`` that a new attempt must not inherit
    (a stale stack dump would make the next failure look like a hang). ``again``: the run
    trains again from its start (a sweep's run), so its injected faults are armed again; a
    training resumed from its checkpoint goes on without them."""
    folder = root.run_folder(run)
    patterns = [folder.stacks(), folder.fail_tail, folder.worker()]
    if again:
        patterns.append(folder.faults_armed())
    return [path for pattern in patterns for path in pattern.parent.glob(pattern.name)]


def clear_earlier_attempts(root: OutputRoot, kept: int, todo: list[str], training: bool) -> None:
    """``--resume``: the runs to redo (``todo``) lose what their earlier attempts left (a
    training run keeps its windows: it continues from its checkpoint); ``kept``: the runs that
    finished ok."""
    removed = drop_rows(root, todo, keep_parts=training)
    print(
        f"resuming: {kept} runs finished ok are kept, {len(todo)} run again "
        + (
            "from their latest complete checkpoint (earlier windows kept)"
            if training
            else f"({removed} part files of their earlier attempts removed)"
        ),
        flush=True,
    )
