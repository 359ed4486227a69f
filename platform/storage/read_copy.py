"""A sweep's output root on object storage, read where the command runs: its result files (those
working_copy.wanted names) copied to a temporary local folder, the command run on that copy,
and nothing uploaded back. For the commands that only read a root (``platform.stability``,
``platform.leak``); the ones that write beside the sweep use working_copy.py."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs

from platform.storage.working_copy import wanted
from stage1_common.storage import Location, StorageError, explain

__all__ = ["check_readable", "read_copy"]


def check_readable(root: Location) -> None:
    """StorageError (one line naming ``root`` and the fix) when its bucket is not there, the
    credentials are refused or the endpoint does not answer; a prefix without files passes
    (the command then says what it lacks). Listing a missing bucket with ``allow_not_found``
    (as ``Location.files`` does) answers "nothing" instead."""
    try:
        root.fs.get_file_info(pafs.FileSelector(root.path, recursive=False))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"{root}: {explain(root, exc)}") from None


@contextmanager
def read_copy(root: Location) -> Iterator[Path]:
    """Yield a local folder holding ``root``'s result files; removed at the end, never
    uploaded. StorageError (one line) when the bucket cannot be read."""
    check_readable(root)
    with tempfile.TemporaryDirectory(prefix="stage1-read-") as tmp:
        local = Path(tmp) / (root.name or "root")
        local.mkdir()
        try:
            root.pull(local, wanted)
        except OSError as exc:
            raise StorageError(f"{root}: {explain(root, exc)}") from None
        yield local
