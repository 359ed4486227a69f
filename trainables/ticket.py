"""A run as it crosses the Ray boundary: one typed ticket, from where the driver hands the run to
Tune to every process that trains it.

The driver builds a ``RunTicket`` for each run it hands to Tune (platform/execution/tuner.py)
and gives Tune ``encode()``'s plain values as the trial's param space; the trial function
decodes it once (trainables/trial.py: ``run_trial``), a fresh run's ``TorchTrainer`` carries it
encoded again to its workers, which decode it once each (trainables/ray_worker.py). Decoding is
the one ``TrialConfig.from_dict`` of a run on the workers' side. Inside the resident protocol
(trial -> group pool -> a group's ranks, trainables/resident/) the ticket object itself travels:
Ray's actor calls pickle it, no JSON-able values needed there.

``RunStorage`` is where the runs' files go, of the kind the driver chose for its output root
(platform/storage/mirror.py: ``run_storage``): ``RunsInFolder`` (a folder every node mounts) or
``RunsInBucket`` (object storage), each naming the place of a run's files on a node
(trainables/run_folder/place.py). The encoded ticket names the storage's class, and decoding
gives that class back: no worker asks which kind it has. ``GroupTicket`` is what a resident
group's train function receives (trainables/resident/serve.py).

Every read of these dicts by key is here: tests/test_layering.py fails when another module
reads or writes a run's dict by a string key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from trainables.config import TrialConfig
from trainables.run_folder.place import InBucket, InFolder

__all__ = ["GroupTicket", "RunStorage", "RunTicket", "RunsInBucket", "RunsInFolder"]

_RUN = "run"  # Tune's param space of a trial (and a fresh run's train_loop_config): {"run": ...}
_GROUP = "group"  # a resident group's train_loop_config: {"group": ...}
_CLASS = "class"  # an encoded storage's class (``_STORAGES``)


@dataclass(frozen=True)
class RunStorage(ABC):
    """Where a sweep's runs write, as every worker sees it: Ray Train's storage of the runs and
    of the resident groups, and the place of a run's files on a node (``place``)."""

    runs: str  # Ray Train's storage of every run: the root's runs/ folder, or its bucket's runs/
    groups: str  # Ray Train's storage of the resident groups: tune/groups/, in the root or bucket

    @abstractmethod
    def place(self, name: str) -> InFolder | InBucket:
        """Where the files of run ``name`` live, seen from this node."""


@dataclass(frozen=True)
class RunsInFolder(RunStorage):
    """The runs of a root in a folder every node mounts: each writes its folder there."""

    def place(self, name: str) -> InFolder:
        return InFolder(Path(self.runs) / name)


@dataclass(frozen=True)
class RunsInBucket(RunStorage):
    """The runs of a root on object storage: Ray Train's storage is the bucket, and each rank
    writes the run's folder on its own node, in a scratch folder named ``scratch``
    (trainables/run_folder/place.py), uploaded to the bucket."""

    scratch: str  # the nodes' scratch folder of the root (the driver's staging folder's name)

    def __post_init__(self) -> None:
        if not self.scratch:
            raise ValueError(
                f"RunsInBucket: runs {self.runs!r} without a scratch folder: each node writes "
                "a run's folder in one before uploading it"
            )

    def place(self, name: str) -> InBucket:
        return InBucket.on_this_node(self.runs, self.scratch, name)


# How an encoded storage names its class: decoding gives the class the driver chose.
_STORAGES: dict[str, type[RunStorage]] = {c.__name__: c for c in (RunsInFolder, RunsInBucket)}


@dataclass(frozen=True)
class RunTicket:
    """One run of a sweep (or platform.train's run) and everything its trial and workers need:
    its name, group and repeat, where its files go, the sweep's resident group pool, when its
    trial started and its validated ``TrialConfig``."""

    name: str
    group: str
    repeat: int
    storage: RunStorage
    config: TrialConfig
    pool: str | None = None  # the sweep's GroupPool actor (None: no run of the sweep is resident)
    group_cpus: int | None = None  # a resident run: the CPUs per worker its group reserves
    start_ts: float | None = None  # when its trial started (``started``; None before)

    def started(self, now: float) -> RunTicket:
        """This ticket with its trial's start time (startup_s counts from it)."""
        return replace(self, start_ts=now)

    def encode(self) -> dict[str, Any]:
        """Plain values (JSON-able: they cross Ray inside Tune's param space): a trial's param
        space, and a fresh run's ``train_loop_config``."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        storage = {_CLASS: type(self.storage).__name__, **asdict(self.storage)}
        values.update(storage=storage, config=self.config.to_dict())
        return {_RUN: values}

    @classmethod
    def decode(cls, encoded: dict[str, Any]) -> RunTicket:
        """The ticket ``encode`` gave, its config validated again (``TrialConfig.from_dict``:
        once per process that receives it)."""
        values = dict(encoded[_RUN])
        storage = dict(values["storage"])
        values.update(
            storage=_STORAGES[storage.pop(_CLASS)](**storage),
            config=TrialConfig.from_dict(values["config"]),
        )
        return cls(**values)

    @staticmethod
    def name_in(encoded: dict[str, Any]) -> str:
        """The run's name in an encoded ticket, without decoding it (the driver's Tune
        callbacks: a trial's ``config``)."""
        return encoded[_RUN]["name"]


@dataclass(frozen=True)
class GroupTicket:
    """What a resident group's train function receives (trainables/resident/serve.py): the
    sweep's pool to ask for runs, the group's id, the CPUs each of its workers reserves."""

    pool: str
    group: str
    cpus: int

    def encode(self) -> dict[str, Any]:
        """Plain values: the group's ``train_loop_config``."""
        return {_GROUP: asdict(self)}

    @classmethod
    def decode(cls, encoded: dict[str, Any]) -> GroupTicket:
        return cls(**encoded[_GROUP])
