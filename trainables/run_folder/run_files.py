"""Where a worker writes its run's folder (``runs/<run>/``: its rank's record, stack dumps, the
export), and how that folder reaches an output root on object storage.

With a root in a folder every node mounts, the worker writes there directly. With a root on
object storage (the run ticket's ``storage.on_bucket``, trainables/ticket.py), each rank writes
the folder on its own node, under the system's temporary folder, and uploads it to
``<root>/runs/<run>/`` in the bucket: its record at once (the driver reads the log paths of a
failed rank from it), a stack dump as soon as it is written (a hung rank may be killed before it
ends), everything else when the run ends, also when it fails, with the last ``LOG_TAIL_LINES``
lines of the rank's stdout and stderr (``workers/rank<r>.stdout.log``: its node and its Ray
session folder may be gone later). Each file is uploaded whole (stage1_common/storage.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.storage import Location
from trainables.checkpoint.place import InBucket, InFolder
from trainables.run_folder.worker_logs import register_worker, tail_lines
from trainables.ticket import RunStorage

__all__ = ["LOG_TAIL_LINES", "RunFiles"]

LOG_TAIL_LINES = 2000  # a resident worker's log holds every run it served: the end of it


def _scratch_top() -> Path:
    """Every node's scratch folders of roots on object storage: ``<tmp>/stage1-scratch/``."""
    return Path(tempfile.gettempdir()) / "stage1-scratch"


def _node() -> str:
    """This node's id (Ray's, in a Ray worker; the hostname elsewhere), short. Never starts
    Ray (``ray.get_runtime_context`` would start a local cluster in a process without one)."""
    import socket
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()[:12]
    return socket.gethostname()


class RunFiles:
    """A run's folder on this node and, for a root on object storage, its place in the bucket."""

    def __init__(self, name: str, storage: RunStorage) -> None:
        """The folder of run ``name`` (a run ticket's) in ``storage``."""
        self.storage = storage
        self.remote: Location | None = None  # on a bucket: the run's folder there
        if storage.on_bucket:
            # One folder per node (several raylets of one host, or containers sharing /tmp,
            # must not share it: each node's copy holds only its own ranks' parts).
            node = _scratch_top() / storage.scratch / _node()
            self.folder = node / OutputRoot.RUNS / name
            self.remote = Location.of(storage.runs).join(name)
        else:
            self.folder = Path(storage.runs) / name
        self.record: dict[str, Any] = {}

    @property
    def checkpoints(self) -> InFolder | InBucket:
        """Where the run's checkpoints live (trainables/checkpoint/place.py): the run's folder,
        or its folder in the bucket."""
        return InFolder() if self.remote is None else InBucket(self.remote)

    def register(self, rank: int, local_rank: int) -> dict[str, Any]:
        """This rank's record (pid, node, log files: trainables/run_folder/worker_logs.py), written
        and uploaded first, before anything can fail."""
        self.record = register_worker(self.folder, rank, local_rank)
        folder = RunFolder(self.folder)
        previous = folder.worker(rank, previous=True)
        if previous.exists():  # the attempt before a restart: the driver says why it ended
            self.publish(previous)
        self.publish(folder.worker(rank))
        return self.record

    def publish_at_end(self, local_rank: int, *, finished: bool = False) -> None:
        """At the end of the run, also a failed one: this rank's log tails, and the node's
        folder (by the node's first local rank: the ranks of a node share it). ``finished``
        (the run ended, not by an error): the node's copy is deleted once uploaded."""
        if self.remote is None:
            return
        try:
            self._publish_at_end(local_rank)
        except Exception as exc:  # the bucket is unreachable: said, never hiding the run's error
            print(f"run files: not uploaded to {self.remote} ({exc})", file=sys.stderr)
            return
        if finished and local_rank == 0:
            self._drop_local()

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

    def _publish_at_end(self, local_rank: int) -> None:
        rank = self.record.get("rank")
        for stream in ("stdout", "stderr"):
            path = self.record.get(stream)
            if rank is None or not path:
                continue
            try:
                text = "\n".join(tail_lines(Path(path), LOG_TAIL_LINES)) + "\n"
            except OSError:
                continue
            log = RunFolder(self.folder).worker_log(rank, stream)
            self.remote.join(log.relative_to(self.folder).as_posix()).write_text(text)
        if local_rank == 0:
            self.publish_all()

    def publish(self, path: Path) -> None:
        """Upload one file of the folder now (nothing for a root every node mounts)."""
        if self.remote is None or not Path(path).is_file():
            return
        rel = Path(path).relative_to(self.folder).as_posix()
        self.remote.join(rel).write_bytes(Path(path).read_bytes())

    def publish_all(self) -> None:
        """Upload every file of the folder but the checkpoints (Ray Train uploads those) and
        unfinished temporaries. The ranks of a node share the folder: its first local rank
        calls this."""
        if self.remote is None or not self.folder.is_dir():
            return
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            parts = path.relative_to(self.folder).parts
            if any(RunFolder.uploaded_by_ray_train(p) or p.startswith(".") for p in parts):
                continue
            self.publish(path)
