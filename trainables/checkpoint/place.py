"""Where a run's checkpoints live, as one object per kind of output root: the run's folder every
node mounts (``InFolder``) or the bucket of a root on object storage, each node writing its own
copy (``InBucket``). The run's files choose it once (trainables/run_folder/run_files.py:
``RunFiles.checkpoints``); the loop, the resume and the Ray worker call its methods and never
ask which root they have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stage1_common.storage import Location

__all__ = ["InBucket", "InFolder"]


class InFolder:
    """Checkpoints in the run's folder, which every node mounts: rank 0 scans it, every rank
    wrote its part of a save there already (Ray Train copies nothing)."""

    per_node = False  # one folder for every node: rank 0 alone registers a save

    def newest(self, worker) -> tuple[Path | None, list[str]]:
        """The newest complete checkpoint of the run's folder and the incomplete ones skipped."""
        from trainables.checkpoint.files import find_resume_checkpoint

        if worker.run_dir is None:
            return None, []
        return find_resume_checkpoint(worker.run_dir)

    def best(self, worker, order: str) -> list[Any]:
        """[folder, score] of the best kept checkpoint on every rank, or [None, None]."""
        from trainables.checkpoint.files import best_checkpoint
        from trainables.distributed import broadcast_from_rank0

        best = [None, None]
        if worker.rank == 0:
            best = best_checkpoint(worker.run_dir, order)
        return broadcast_from_rank0(best, worker.world_size)

    def shown(self, name: str) -> str:
        """How a registered checkpoint is named in the window's fields ('' in a folder)."""
        return ""

    def upload(self, local_rank: int, final: bool) -> tuple[str, bool] | None:
        """Ray Train's ``CheckpointUploadMode`` name for this rank's report, and whether the
        local copy goes after it (None: the rank reports no checkpoint)."""
        return "NO_UPLOAD", False

    def clears(self, local_rank: int) -> bool | None:
        """Which rank readies a save's folder (None: the save's own rule, one folder for all)."""
        return None


class InBucket:
    """Checkpoints in the bucket of a root on object storage: each node writes its own copy of
    a save, its first local rank has Ray Train upload it, and a resume or the best checkpoint
    is chosen by rank 0 from the bucket and copied whole to every node."""

    per_node = True  # every node's ranks register their node's folder

    def __init__(self, remote: Location):
        self.in_bucket = remote  # the run's folder in the bucket

    def newest(self, worker) -> tuple[Path | None, list[str]]:
        from trainables.checkpoint.remote import choose, local_copy, newest_in_bucket

        name, skipped = choose(
            lambda: newest_in_bucket(self.in_bucket), worker.world_size, worker.rank
        )
        if name is None:
            return None, skipped
        folder = local_copy(
            self.in_bucket,
            name,
            worker.run_dir,
            local_rank=worker.local_rank,
            world_size=worker.world_size,
        )
        return folder, skipped

    def best(self, worker, order: str) -> list[Any]:
        from trainables.checkpoint.remote import best_in_bucket, choose, local_copy

        name, score = choose(
            lambda: best_in_bucket(self.in_bucket, order), worker.world_size, worker.rank
        )
        if name is None:
            return [None, None]
        kw = {"local_rank": worker.local_rank, "world_size": worker.world_size}
        return [str(local_copy(self.in_bucket, name, worker.run_dir, **kw)), score]

    def shown(self, name: str) -> str:
        return self.in_bucket.join(name).uri

    def upload(self, local_rank: int, final: bool) -> tuple[str, bool] | None:
        # The node's first local rank uploads the node's folder (the others wrote into it), in
        # the background but for the last step's (the export and the run's end need it whole).
        if local_rank != 0:
            return None
        return ("SYNC" if final else "ASYNC"), True

    def clears(self, local_rank: int) -> bool | None:
        return local_rank == 0  # each node's own folder
