"""A sweep's output root on object storage, worked on where the command runs: its result files
copied to a local folder (not its checkpoints, compile cache, tokenizers, TensorBoard or Tune
folders: the analysis reads none of them), the command run there, and the files it wrote or
changed uploaded back, each whole (stage1_common/storage.py). Nothing is uploaded when the
command fails."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.storage import Location, StorageError, explain

__all__ = ["working_copy"]

_SKIPPED_TOP = {
    OutputRoot.CACHE,
    OutputRoot.TOKENIZERS,
    OutputRoot.TENSORBOARD,
    OutputRoot.TUNE,
    OutputRoot.MLFLOW_ARTIFACTS,
}


def wanted(relative: str) -> bool:
    """Whether the analysis reads the file at ``relative`` (a path inside the root)."""
    parts = relative.split("/")
    if parts[0] in _SKIPPED_TOP:
        return False
    return not any(RunFolder.uploaded_by_ray_train(p) or p == RunFolder.EXPORT for p in parts[1:])


@contextmanager
def working_copy(root: Location) -> Iterator[Path]:
    """Yield a local folder holding ``root``'s result files; on a clean exit, upload what the
    block wrote or changed there."""
    with tempfile.TemporaryDirectory(prefix="stage1-root-") as tmp:
        local = Path(tmp) / (root.name or "root")
        local.mkdir()
        copied = _download(root, local)
        yield local
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            if copied.get(rel) != path.stat().st_mtime_ns:
                root.join(rel).write_bytes(path.read_bytes())


def _download(root: Location, local: Path) -> dict[str, int]:
    """The result files, each with its local modification time (to tell what changed)."""
    try:
        got = root.pull(local, wanted)
    except OSError as exc:
        raise StorageError(f"{root}: {explain(root, exc)}") from None
    return {rel: (local / rel).stat().st_mtime_ns for rel in got}
