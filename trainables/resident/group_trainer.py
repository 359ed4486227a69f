"""A resident group's Ray Train trainer, as its ``GroupHost`` builds it (``build_group_trainer``):
torch-free, so the host never imports torch (issue 40: the first run's chain of processes).

The group's train function is ``serve_group``, a reference Ray Train pickles by name; the
workers import trainables/resident/serve.py (torch, the loop) when it runs.
"""

from __future__ import annotations

from typing import Any

from trainables.observe.gc_control import collector_paused
from trainables.resident.shape import GroupShape
from trainables.ticket import GroupTicket
from trainables.torch_backend import torch_trainer

__all__ = ["build_group_trainer", "serve_group"]


def build_group_trainer(shape: GroupShape, group: GroupTicket, storage_path: str):
    """A resident group's trainer of ``shape`` (its CPUs: the sweep's ``group_cpus`` for its key,
    which the driver puts in every run's ticket): its workers serve runs until the pool closes
    the group. No restarts: a failed worker ends the group (the pool fails its run and builds a
    new group for the next)."""
    from ray.train import FailureConfig, LoggingConfig, RunConfig

    run_config = RunConfig(
        name=group.group,
        storage_path=storage_path,
        failure_config=FailureConfig(max_failures=0),
        logging_config=LoggingConfig(log_level="WARNING"),
    )
    return torch_trainer(serve_group, group.encode(), shape, run_config)


def serve_group(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point of a resident group (trainables/resident/serve.py, imported with
    the collector paused: trainables/observe/gc_control.py)."""
    with collector_paused():
        from trainables.resident.serve import serve_loop_per_worker

    serve_loop_per_worker(loop_config)
