"""A run's checkpoints in the bucket of an output root on object storage: the one a run resumes
from (the newest complete one) or exports (the best complete one), chosen by rank 0 from the
bucket's listing, and a complete copy of it on every node before any rank loads it.

Ray Train uploads the checkpoints (each node's first local rank reports its node's folder,
trainables/ray_worker.py) and deletes the node's copy once uploaded; a checkpoint counts as
complete in the bucket as it does on a disk: every rank's done file there, every file it lists
with its size (trainables/checkpoint/files.py: ``complete_by``). A node's copy is made by its first
local rank while the others wait at a barrier; every rank then loads the same folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stage1_common.output_root import CheckpointFolder, RunFolder
from stage1_common.storage import Location
from trainables.checkpoint.files import complete_by, is_complete, read_meta
from trainables.distributed import broadcast_from_rank0

__all__ = ["best_in_bucket", "choose", "local_copy", "newest_in_bucket"]


def _checkpoints(remote: Location) -> dict[str, dict[str, int]]:
    """Each checkpoint folder under the run's place in the bucket: its files and sizes."""
    out: dict[str, dict[str, int]] = {}
    for rel, size in remote.files().items():
        top, _, rest = rel.partition("/")
        if rest and RunFolder.checkpoint_step(top) is not None:
            out.setdefault(top, {})[rest] = size
    return out


def _complete(remote: Location, name: str, files: dict[str, int]) -> tuple[bool, str]:
    folder = remote.join(name)
    return complete_by(lambda f: folder.join(f).read_text(), files.get)


def newest_in_bucket(remote: Location) -> tuple[str | None, list[str]]:
    """The newest complete checkpoint's folder name (None if none) and a note for every newer
    one skipped as incomplete (an upload cut off)."""
    found = _checkpoints(remote)
    skipped = []
    for name in sorted(found, key=RunFolder.checkpoint_step, reverse=True):
        ok, why = _complete(remote, name, found[name])
        if ok:
            return name, skipped
        skipped.append(f"skipped {name} in the bucket: incomplete ({why})")
    return None, skipped


def best_in_bucket(remote: Location, order: str) -> list:
    """[name, score] of the complete checkpoint with the best validation score ("min" or
    "max"; the later one on a tie), or [None, None]: ``best_checkpoint`` over the bucket."""
    best: list = [None, None]
    found = _checkpoints(remote)
    for name in sorted(found, key=RunFolder.checkpoint_step):
        if not _complete(remote, name, found[name])[0]:
            continue
        score = json.loads(remote.join(name, CheckpointFolder.META).read_text()).get("score")
        if score is None:
            continue
        if best[1] is None or (score <= best[1] if order == "min" else score >= best[1]):
            best = [name, float(score)]
    return best


def local_copy(
    remote: Location, name: str, run_dir: Path, *, local_rank: int, world_size: int
) -> Path:
    """``run_dir/name`` complete on this node: its first local rank downloads the bucket's
    folder unless a complete copy is there; every rank returns once every node has it."""
    folder = Path(run_dir) / name
    if local_rank == 0 and not _same(folder, remote.join(name)):
        tmp = folder.with_name(f".{name}.download")
        shutil.rmtree(tmp, ignore_errors=True)
        remote.join(name).download(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()
    read_meta(folder)  # every rank sees the whole copy (a missing meta would raise here)
    return folder


def _same(folder: Path, there: Location) -> bool:
    """Whether this node holds a complete copy of the bucket's checkpoint (the meta names the
    save: its time and DCP folder; a folder left by an earlier sweep at the same address is
    not it)."""
    if not is_complete(folder)[0]:
        return False
    try:
        meta = CheckpointFolder(folder).meta
        return meta.read_text() == there.join(CheckpointFolder.META).read_text()
    except OSError:
        return False


def choose(pick, world_size: int, rank: int) -> list:
    """Rank 0's answer of ``pick()`` on every rank (the bucket is listed once)."""
    return broadcast_from_rank0(list(pick()) if rank == 0 else [None, None], world_size)
