"""Where a worker writes its run's folder (``runs/<run>/``: its rank's record, stack dumps, the
export), and what of it each rank publishes when.

The run's ticket says where the runs write (``RunTicket.storage``, trainables/ticket.py), its
kind decided by the driver; the folder's place (trainables/run_folder/place.py: the folder every
node mounts, or this node's copy uploaded to the bucket) does the rest. A rank registers first,
before anything can fail: its record (the driver reads a failed rank's log paths from it) and
its previous attempt's are published at once; a stack dump as soon as it is written; everything
else when the run ends, also when it fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stage1_common.output_root import RunFolder
from trainables.run_folder.place import InBucket, InFolder
from trainables.run_folder.worker_logs import register_worker
from trainables.ticket import RunStorage

__all__ = ["RunFiles"]


class RunFiles:
    """A run's folder on this node, and its place (``place``): what is published, where its
    checkpoints live."""

    def __init__(self, name: str, storage: RunStorage) -> None:
        """The folder of run ``name`` (a run ticket's) in ``storage``."""
        self.storage = storage
        self.place: InFolder | InBucket = storage.place(name)
        self.folder: Path = self.place.folder
        self.record: dict[str, Any] = {}

    def register(self, rank: int, local_rank: int) -> dict[str, Any]:
        """This rank's record (pid, node, log files: trainables/run_folder/worker_logs.py), written
        and published first, before anything can fail."""
        self.record = register_worker(self.folder, rank, local_rank)
        folder = RunFolder(self.folder)
        previous = folder.worker(rank, previous=True)
        if previous.exists():  # the attempt before a restart: the driver says why it ended
            self.publish(previous)
        self.publish(folder.worker(rank))
        return self.record

    def publish(self, path: Path) -> None:
        """Publish one file of the folder now (a stack dump, a record)."""
        self.place.publish(path)

    def publish_all(self) -> None:
        """Publish every file of the folder but the checkpoints (the ranks of a node share the
        folder: its first local rank calls this)."""
        self.place.publish_all()

    def publish_at_end(self, local_rank: int, *, finished: bool = False) -> None:
        """At the end of the run, also a failed one: this rank's log tails and the node's
        folder; ``finished`` (the run ended, not by an error): the node's copy may go."""
        self.place.publish_at_end(self.record, local_rank, finished=finished)
