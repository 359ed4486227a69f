"""The Tune trial function: one run of the sweep, trained in a Ray Train trainer of its
own (``executor: fresh``) or in the sweep's resident group of its shape (``resident``: the trial
submits the run to the group pool and relays its windows to Tune, trainables/resident/relay.py)."""

from __future__ import annotations

import time
from typing import Any

from trainables.resident.relay import make_room, relay
from trainables.resident.shape import GroupShape
from trainables.ticket import RunTicket

__all__ = ["build_trainer", "run_trial"]


def build_trainer(ticket: RunTicket):
    """A fresh run's Ray Train trainer (torch's backend, trainables/torch_backend.py: nothing
    here imports torch): its workers receive ``ticket`` (started: its trial's start time set)
    encoded, and decode it once each (trainables/ray_worker.py)."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig
    from ray.tune.integration.ray_train import TuneReportCallback

    from trainables.ray_worker import train_loop_per_worker  # torch-free until it runs
    from trainables.torch_backend import torch_trainer

    cfg = ticket.config
    shape = GroupShape.of(cfg)  # the run's own CPUs: a fresh run's worker group

    # Forwards rank 0's window reports to the Tune trial, where the platform's Tune callback
    # (in the driver) records them.
    callbacks = [TuneReportCallback()]
    return torch_trainer(
        train_loop_per_worker,
        ticket.encode(),
        shape,
        RunConfig(
            name=ticket.name,
            storage_path=ticket.storage.runs,
            callbacks=callbacks,
            # num_to_keep: the best by best_metric when validating (else the newest); Ray Train
            # always keeps the latest too, which is the one a restart resumes from.
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.keep_checkpoints,
                checkpoint_score_attribute="checkpoint_score" if cfg.val_every else None,
                checkpoint_score_order=cfg.checkpoint_score_order,
            ),
            # A dead worker restarts the worker group, which resumes from the newest complete
            # checkpoint in the run's folder (trainables/run_folder/run_state.py: resume).
            failure_config=FailureConfig(max_failures=cfg.max_failures),
            # Ray Train logs every report of every rank at INFO; the driver prints progress
            # itself. The full logs stay in Ray's session log folder.
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )


def run_trial(config: dict[str, Any]) -> None:
    """Tune entry point; ``config`` is the run's encoded ``RunTicket`` (trainables/ticket.py),
    decoded here once."""
    start_ts = time.time()  # startup_s counts from here
    ticket = RunTicket.decode(config).started(start_ts)
    if ticket.config.executor == "resident":
        relay(ticket)
        return
    if ticket.pool:  # resident groups of this sweep may hold the resources it needs
        make_room(ticket.pool)
    build_trainer(ticket).fit()
