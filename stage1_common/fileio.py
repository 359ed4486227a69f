"""Atomic file writing, shared by the driver and Ray workers.

Every output is written under a dot-prefixed temporary name in its own folder and renamed into
place, so a crash, Ctrl-C or SIGKILL never leaves a truncated file under the final name (and
Parquet dataset readers skip the leftovers). It lives here, not in ``platform``, because Ray
workers write files too and cannot import ``platform.*``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "TMP_SUFFIX",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "ensure_writable_dir",
    "remove_stale_temporaries",
    "unwritable_parent",
    "tsv_text",
    "write_json",
]

TMP_SUFFIX = ".tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


@contextmanager
def atomic_path(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` if the block succeeds,
    delete it if it raises. ``durable`` fsyncs before the rename (worth it for manifests, not
    for each of 281k audio files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if durable:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def tsv_text(rows: Iterable[dict[str, Any]], columns: list[str], float_format: str = ".6g") -> str:
    """Rows as tab-separated text with a header; None is an empty cell, floats use
    ``float_format`` (so the same values always give the same bytes)."""
    buf = io.StringIO()
    writer = csv.DictWriter(
        buf, fieldnames=columns, delimiter="\t", extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k), float_format) for k in columns})
    return buf.getvalue()


def _cell(value: Any, float_format: str) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return format(value, float_format)
    if isinstance(value, str):
        return value.replace("\t", " ").replace("\n", " ")
    return value


def ensure_writable_dir(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written there (raises OSError)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe{TMP_SUFFIX}"
    probe.write_text("ok")
    probe.unlink()


def unwritable_parent(path: Path) -> str | None:
    """Why ``path`` (missing folders included) could not be made, found without creating
    anything: its nearest existing ancestor is a file or cannot be written; None when it can."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def remove_stale_temporaries(root: Path) -> int:
    """Delete temporaries that a killed run left under ``root``; returns how many."""
    count = 0
    for tmp in Path(root).rglob(f".*{TMP_SUFFIX}"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
            count += 1
    return count
