"""A resident group's shape: the resources of its workers, described once for the driver (which
runs share a group, how many CPUs it reserves), the pool (which group a run goes to),
``groups.json`` (each group's ``shape``) and the group's ``TorchTrainer``.

Runs share a group when their ``GroupKey`` is the same: workers, GPUs, placement, nodes and the
process group's timeout. CPU-side keys (loader workers, prefetch, pinned memory) are not part of
it: a group reserves the CPUs of the most demanding planned run of its key (``group_cpus``), and
its ``GroupShape`` is its key with those CPUs per worker.

Imported by the driver too: no torch and no Ray at import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from trainables.config import TrialConfig
from trainables.observe.watchdog import pg_timeout_for

__all__ = ["GroupKey", "GroupShape", "group_cpus", "starts_group"]


@dataclass(frozen=True)
class GroupKey:
    """What a resident group is made for, but for its CPUs: runs of one key share a group."""

    train_workers: int
    use_gpu: bool
    placement_strategy: str
    nodes: int
    pg_timeout_s: int  # the process group's timeout (watchdog.pg_timeout_for)

    @classmethod
    def of(cls, cfg: TrialConfig) -> GroupKey:
        return cls(
            train_workers=cfg.train_workers,
            use_gpu=bool(cfg.use_gpu),
            placement_strategy=cfg.placement_strategy,
            nodes=cfg.nodes,
            pg_timeout_s=pg_timeout_for(cfg.stall_timeout_s, cfg.pg_timeout_s),
        )


@dataclass(frozen=True)
class GroupShape:
    """A resident group's resources: its key's and the CPUs each worker reserves. Runs of one
    shape train in one group. The fields, in this order, are ``groups.json``'s ``shape``."""

    train_workers: int
    use_gpu: bool
    cpus_per_worker: int
    placement_strategy: str
    nodes: int
    pg_timeout_s: int

    @classmethod
    def of(cls, cfg: TrialConfig, cpus: int | None = None) -> GroupShape:
        """The shape of ``cfg``'s group: CPUs per worker ``cpus`` (the sweep's ``group_cpus``
        for the run's key) or else the run's own. ``use_gpu`` must be resolved (the driver
        does it before the first trial)."""
        if cfg.use_gpu == "auto":
            raise ValueError("use_gpu must be resolved by the driver before the trial starts")
        return cls(
            cpus_per_worker=int(cpus or cfg.cpus_per_train_worker), **asdict(GroupKey.of(cfg))
        )

    @property
    def key(self) -> GroupKey:
        return GroupKey(**{f.name: getattr(self, f.name) for f in fields(GroupKey)})

    def to_dict(self) -> dict[str, Any]:
        """``groups.json``'s ``shape`` of the group."""
        return asdict(self)

    def scaling_config(self):
        """Ray Train's worker group of this shape: one worker per GPU (or CPU worker), its
        CPUs, its placement."""
        from ray.train import ScalingConfig

        resources = {"CPU": self.cpus_per_worker}
        if self.use_gpu:
            resources["GPU"] = 1
        return ScalingConfig(
            num_workers=self.train_workers,
            use_gpu=self.use_gpu,
            resources_per_worker=resources,
            placement_strategy=self.placement_strategy,
        )


def group_cpus(configs: Iterable[TrialConfig]) -> dict[GroupKey, int]:
    """The CPUs per worker a resident group of each key reserves: the most any planned run of
    that key needs (its loader workers + 1, or cpus_per_worker), so that runs that differ only
    in CPU-side keys train in one group instead of one group each."""
    most: dict[GroupKey, int] = {}
    for cfg in configs:
        key = GroupKey.of(cfg)
        most[key] = max(most.get(key, 0), cfg.cpus_per_train_worker)
    return most


def starts_group(cfg: TrialConfig, up: set[GroupKey]) -> bool:
    """Whether a run of ``cfg`` handed out now starts a worker group: a fresh run always, a
    resident one when no group of its key is ``up`` yet (its key is added to ``up``)."""
    key = GroupKey.of(cfg)
    starts = cfg.executor != "resident" or key not in up
    up.add(key)
    return starts
