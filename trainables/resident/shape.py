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
from trainables.watchdog import pg_timeout_for

__all__ = ["GroupKey", "GroupShape", "group_cpus", "scaling_config"]


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
        for the run's key) or else the run's own."""
        return cls(
            cpus_per_worker=int(cpus or cfg.cpus_per_train_worker), **asdict(GroupKey.of(cfg))
        )

    @classmethod
    def of_run(cls, run: dict[str, Any]) -> GroupShape:
        """The shape of the group ``run`` trains in: a run as the pool receives it, its
        ``config`` and the sweep's ``group_cpus`` for its key."""
        return cls.of(TrialConfig.from_dict(run["config"]), run.get("group_cpus"))

    @property
    def key(self) -> GroupKey:
        return GroupKey(**{f.name: getattr(self, f.name) for f in fields(GroupKey)})

    def to_dict(self) -> dict[str, Any]:
        """``groups.json``'s ``shape`` of the group."""
        return asdict(self)


def group_cpus(configs: Iterable[TrialConfig]) -> dict[GroupKey, int]:
    """The CPUs per worker a resident group of each key reserves: the most any planned run of
    that key needs (its loader workers + 1, or cpus_per_worker), so that runs that differ only
    in CPU-side keys train in one group instead of one group each."""
    most: dict[GroupKey, int] = {}
    for cfg in configs:
        key = GroupKey.of(cfg)
        most[key] = max(most.get(key, 0), cfg.cpus_per_train_worker)
    return most


def scaling_config(cfg: TrialConfig, cpus: int | None = None):
    """Ray Train's worker group of a run's shape (a fresh run's own, or a resident group's): one
    worker per GPU (or CPU worker), its CPUs (``cpus``, or the run's own), its placement."""
    from ray.train import ScalingConfig

    if cfg.use_gpu == "auto":
        raise ValueError("use_gpu must be resolved by the driver before the trial starts")
    shape = GroupShape.of(cfg, cpus)
    resources = {"CPU": shape.cpus_per_worker}
    if shape.use_gpu:
        resources["GPU"] = 1
    return ScalingConfig(
        num_workers=shape.train_workers,
        use_gpu=shape.use_gpu,
        resources_per_worker=resources,
        placement_strategy=shape.placement_strategy,
    )
