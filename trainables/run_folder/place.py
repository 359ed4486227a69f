"""Where a run's files live, as one object per kind of output root: the run's folder every node
mounts (``InFolder``), or each node's scratch copy of it uploaded to the bucket of a root on
object storage (``InBucket``).

The driver chooses the kind once, when it builds the run's ticket (platform/storage/mirror.py:
``run_storage``, whose answer the ticket carries: trainables/ticket.py, ``RunsInFolder`` or
``RunsInBucket``, each naming its place of a run). The run's files
(trainables/run_folder/run_files.py), the loop, the resume and the Ray worker call the place's
methods and never ask which root they have.

In a folder every node mounts, every rank writes the run's folder there directly: nothing to
upload. On object storage, each rank writes the folder on its own node, under the system's
temporary folder, and uploads it to ``<root>/runs/<run>/`` in the bucket: its record at once
(the driver reads the log paths of a failed rank from it), a stack dump as soon as it is
written (a hung rank may be killed before it ends), everything else when the run ends, also
when it fails, with the last ``LOG_TAIL_LINES`` lines of the rank's stdout and stderr
(``workers/rank<r>.stdout.log``: its node and its Ray session folder may be gone later). Each
file is uploaded whole (stage1_common/storage.py). The checkpoints are Ray Train's to upload;
which checkpoint a run resumes from or exports is chosen in the bucket
(trainables/checkpoint/in_bucket.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.storage import Location
from trainables.run_folder.worker_logs import tail_lines

__all__ = ["LOG_TAIL_LINES", "InBucket", "InFolder"]

LOG_TAIL_LINES = 2000  # a resident worker's log holds every run it served: the end of it


class InFolder:
    """A run's files in its folder, which every node mounts: every rank writes there, nothing
    is uploaded, rank 0 scans the folder for checkpoints (every rank wrote its part of a save
    there already: Ray Train copies nothing)."""

    per_node = False  # one folder for every node: rank 0 alone registers a save

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder  # the run's folder (None: a run without one, outside Ray)

    # --- the run's files ---
    def publish(self, path: Path) -> None:
        """Nothing: the file is where every node reads it."""

    def publish_all(self) -> None:
        """Nothing: every file is where every node reads it."""

    def publish_at_end(self, record: dict[str, Any], local_rank: int, *, finished: bool) -> None:
        """Nothing: the rank's log tails are read where its node keeps them."""

    # --- its checkpoints ---
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
    """A run's files on a root on object storage: each node writes its own copy of the run's
    folder (``folder``) and uploads it to the run's folder in the bucket (``in_bucket``); its
    first local rank has Ray Train upload a save of the node's ranks, and a resume or the best
    checkpoint is chosen by rank 0 from the bucket and copied whole to every node."""

    per_node = True  # every node's ranks register their node's folder

    def __init__(self, folder: Path, in_bucket: Location) -> None:
        self.folder = folder  # this node's copy of the run's folder
        self.in_bucket = in_bucket  # the run's folder in the bucket

    @classmethod
    def on_this_node(cls, runs: str, scratch: str, name: str) -> InBucket:
        """Run ``name`` of the runs in the bucket at ``runs``, its folder on this node under
        the sweep's scratch folder ``scratch``: one folder per node (several raylets of one
        host, or containers sharing /tmp, must not share it: each node's copy holds only its
        own ranks' parts)."""
        node = _scratch_top() / scratch / _node()
        return cls(node / OutputRoot.RUNS / name, Location.of(runs).join(name))

    # --- the run's files ---
    def publish(self, path: Path) -> None:
        """Upload one file of the run's folder now."""
        if not Path(path).is_file():
            return
        rel = Path(path).relative_to(self.folder).as_posix()
        self.in_bucket.join(rel).write_bytes(Path(path).read_bytes())

    def publish_all(self) -> None:
        """Upload every file of the folder but the checkpoints (Ray Train uploads those) and
        unfinished temporaries. The ranks of a node share the folder: its first local rank
        calls this."""
        if not self.folder.is_dir():
            return
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            parts = path.relative_to(self.folder).parts
            if any(RunFolder.uploaded_by_ray_train(p) or p.startswith(".") for p in parts):
                continue
            self.publish(path)

    def publish_at_end(self, record: dict[str, Any], local_rank: int, *, finished: bool) -> None:
        """At the end of the run, also a failed one: the log tails of the rank whose ``record``
        this is (trainables/run_folder/worker_logs.py), and the node's folder (by the node's
        first local rank: the ranks of a node share it). ``finished`` (the run ended, not by an
        error): the node's copy is deleted once uploaded."""
        try:
            self._publish_at_end(record, local_rank)
        except Exception as exc:  # the bucket is unreachable: said, never hiding the run's error
            print(f"run files: not uploaded to {self.in_bucket} ({exc})", file=sys.stderr)
            return
        if finished and local_rank == 0:
            self._drop_local()

    def _publish_at_end(self, record: dict[str, Any], local_rank: int) -> None:
        rank = record.get("rank")
        for stream in ("stdout", "stderr"):
            path = record.get(stream)
            if rank is None or not path:
                continue
            try:
                text = "\n".join(tail_lines(Path(path), LOG_TAIL_LINES)) + "\n"
            except OSError:
                continue
            log = RunFolder(self.folder).worker_log(rank, stream)
            self.in_bucket.join(log.relative_to(self.folder).as_posix()).write_text(text)
        if local_rank == 0:
            self.publish_all()

    def _drop_local(self) -> None:
        """Delete the node's copy of the run's folder, uploaded now, then the empty folders
        above it up to the sweep's scratch folder. Its checkpoint folders too: Ray Train has
        uploaded every registered one by the run's last report (SYNC, and reports register in
        order), and what else is there are copies downloaded for a resume or an export. A
        failed run's copy stays for its restart."""
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)
        folder, top = self.folder.parent, _scratch_top()
        while folder != top:
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break
            folder = folder.parent

    # --- its checkpoints ---
    def newest(self, worker) -> tuple[Path | None, list[str]]:
        from trainables.checkpoint.in_bucket import choose, local_copy, newest_in_bucket

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
        from trainables.checkpoint.in_bucket import best_in_bucket, choose, local_copy

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


def _scratch_top() -> Path:
    """Every node's scratch folders of roots on object storage: ``<tmp>/stage1-scratch/``."""
    return Path(tempfile.gettempdir()) / "stage1-scratch"


def _node() -> str:
    """This node's id (Ray's, in a Ray worker; the hostname elsewhere), short. Never starts
    Ray (``ray.get_runtime_context`` would start a local cluster in a process without one)."""
    import socket

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()[:12]
    return socket.gethostname()
