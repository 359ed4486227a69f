"""A run as it crosses the Ray boundary: one typed ticket, from where the driver hands the run to
Tune to every process that trains it.

The driver builds a ``RunTicket`` for each run it hands to Tune (platform/execution/tuner.py)
and gives Tune ``encode()``'s plain values as the trial's param space; the trial function
decodes it once (trainables/trial.py: ``run_trial``), a fresh run's ``TorchTrainer`` carries it
encoded again to its workers, which decode it once each (trainables/ray_worker.py). Decoding is
the one ``TrialConfig.from_dict`` of a run on the workers' side. Inside the resident protocol
(trial -> group pool -> a group's ranks, trainables/resident/) the ticket object itself travels:
Ray's actor calls pickle it, no JSON-able values needed there.

``RunStorage`` is where the runs' files go, the one place that says whether the output root is
on object storage (``on_bucket``). ``GroupTicket`` is what a resident group's train function
receives (trainables/resident/serve.py).

Every read of these dicts by key is here: tests/test_layering.py fails when another module
reads or writes a run's dict by a string key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from stage1_common.output_root import OutputRoot
from stage1_common.storage import is_remote
from trainables.config import TrialConfig

__all__ = ["GroupTicket", "RunStorage", "RunTicket"]

_RUN = "run"  # Tune's param space of a trial (and a fresh run's train_loop_config): {"run": ...}
_GROUP = "group"  # a resident group's train_loop_config: {"group": ...}


@dataclass(frozen=True)
class RunStorage:
    """Where a sweep's runs write, as every worker sees it. With a root in a folder every node
    mounts, the runs write there; with a root on object storage (``on_bucket``), Ray Train's
    storage is the bucket and each rank writes the run's folder on its own node, in a scratch
    folder named ``scratch`` (trainables/run_folder/run_files.py), uploaded to the bucket."""

    runs: str  # Ray Train's storage of every run: the root's runs/ folder, or its bucket's runs/
    groups: str  # Ray Train's storage of the resident groups: tune/groups/, in the root or bucket
    scratch: str = ""  # on a bucket: the nodes' scratch folder of the root ("": not on a bucket)

    def __post_init__(self) -> None:
        if is_remote(self.runs) != bool(self.scratch):
            raise ValueError(
                f"RunStorage: runs {self.runs!r} with scratch {self.scratch!r}: a scratch folder "
                "goes with a root on object storage, and only with one"
            )

    @classmethod
    def of(cls, root: OutputRoot) -> RunStorage:
        """The storage of ``root`` (the driver's OutputRoot; on object storage, staged locally
        under a folder whose name the nodes' scratch folders take)."""
        return cls(
            runs=root.where(OutputRoot.RUNS),
            groups=root.where(OutputRoot.TUNE, OutputRoot.GROUP_RUNS),
            scratch="" if root.folder else root.path.name,
        )

    @property
    def on_bucket(self) -> bool:
        """Whether the output root is on object storage: each node writes its own copy of a
        run's folder and uploads it (the one spelling of that fact)."""
        return bool(self.scratch)


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
        values.update(storage=asdict(self.storage), config=self.config.to_dict())
        return {_RUN: values}

    @classmethod
    def decode(cls, encoded: dict[str, Any]) -> RunTicket:
        """The ticket ``encode`` gave, its config validated again (``TrialConfig.from_dict``:
        once per process that receives it)."""
        values = dict(encoded[_RUN])
        values.update(
            storage=RunStorage(**values["storage"]),
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
