"""A Ray Train worker around the training loop (trainables/loop.py): the entry point of a fresh
run's ``TorchTrainer`` (``train_loop_per_worker``), the worker's context (its rank, device, the
run's folder: ``ray_worker_context``, shared with the resident groups'
trainables/resident/serve.py), the reports it makes (a window, a checkpoint) and its Ray
metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainables.config import TrialConfig
from trainables.observe.gc_control import collector_paused
from trainables.observe.startup import process_start
from trainables.run_folder.run_files import RunFiles
from trainables.ticket import RunTicket

if TYPE_CHECKING:
    from trainables.loop import WorkerContext

__all__ = ["quiet_report_log", "ray_gauges", "ray_worker_context", "train_loop_per_worker"]


def quiet_report_log() -> None:
    """Ray Train V2 logs every report of every rank at INFO, under a logger named after its
    source file (so RunConfig's LoggingConfig does not reach it); the driver prints progress."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # moved in another Ray version: the lines come back, nothing breaks
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: one call per worker; ``loop_config`` is the run's encoded
    ``RunTicket`` (trainables/trial.py: build_trainer), decoded here once."""
    import ray.train

    # The loop (torch, the engine, the data) imported where it trains, not where the trainer
    # is built (trainables/trial.py), the collector paused meanwhile; before the entry's
    # time, as when the train function's unpickling imported it (the worker's part).
    with collector_paused():
        from trainables.loop import run_training
    entry_ts = time.time()

    quiet_report_log()
    ticket = RunTicket.decode(loop_config)
    cfg = ticket.config
    gauges = ray_gauges(ticket.name) if cfg.telemetry else None
    ctx = ray.train.get_context()
    rank, files = ctx.get_world_rank(), RunFiles(ticket.name, ticket.storage)

    def report(metrics: dict[str, Any], checkpoint: tuple[Path, str] | None = None) -> None:
        if gauges is not None and rank == 0:
            gauges.update(metrics)
        # In Ray Train V2 every report is a barrier across workers: once per window only.
        if checkpoint is None:
            ray.train.report(metrics)
            return
        ray.train.report(metrics, **_checkpoint_report(checkpoint, files, ctx, metrics, cfg))

    worker = ray_worker_context(ticket, report, entry_ts, resident=False, files=files)
    finished = False
    try:
        run_training(cfg, worker)
        finished = True
    finally:  # a root on object storage
        files.publish_at_end(ctx.get_local_rank(), finished=finished)


def _checkpoint_report(
    checkpoint: tuple[Path, str], files: RunFiles, ctx, metrics: dict[str, Any], cfg: TrialConfig
) -> dict[str, Any]:
    """How a rank hands a complete checkpoint to Ray Train, which registers it once every rank
    has reported. In a folder every node mounts, every rank wrote its part into the run's
    storage already: nothing to copy (NO_UPLOAD). For a root on object storage, each node's
    first local rank has Ray Train upload the node's folder (the other ranks of the node wrote
    into the same folder), in the background while training goes on (ASYNC) but for the last
    step's (SYNC: the export and the run's end need it whole in the bucket), and the node's
    copy is deleted once uploaded (trainables/checkpoint/in_bucket.py reads the bucket)."""
    import ray.train
    from ray.train import CheckpointUploadMode

    folder, name = checkpoint
    final = int(metrics.get("step") or 0) >= cfg.max_steps
    plan = files.place.upload(ctx.get_local_rank(), final)
    if plan is None:
        return {}
    mode, delete = getattr(CheckpointUploadMode, plan[0]), plan[1]
    return {
        "checkpoint": ray.train.Checkpoint.from_directory(str(folder)),
        "checkpoint_dir_name": name,
        "checkpoint_upload_mode": mode,
        "delete_local_checkpoint_after_upload": delete,
    }


_GAUGES: dict[str, Any] = {}  # one set per process (a resident worker serves many runs)


def ray_gauges(run: str):
    """This process's RayGauges, set to ``run``'s tags."""
    from trainables.observe.telemetry import RayGauges

    if "gauges" not in _GAUGES:
        _GAUGES["gauges"] = RayGauges(run)
    _GAUGES["gauges"].run = run
    return _GAUGES["gauges"]


def ray_worker_context(
    ticket: RunTicket,
    report: Callable[..., None],
    entry_ts: float,
    *,
    resident: bool,
    imports_s: float = 0.0,
    files: RunFiles | None = None,
) -> WorkerContext:
    """The WorkerContext of this Ray Train worker for the run of ``ticket`` (its trial's start
    time set); registers the worker's log files first, before anything can fail."""
    import ray.train
    import ray.train.torch

    from trainables.loop import WorkerContext

    ctx = ray.train.get_context()
    files = files or RunFiles(ticket.name, ticket.storage)
    # First, before anything can fail: where this rank's log files are (fail_tail_lines).
    record = files.register(ctx.get_world_rank(), ctx.get_local_rank())
    return WorkerContext(
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        device=ray.train.torch.get_device(),
        report=report,
        start_ts=ticket.start_ts,
        local_rank=ctx.get_local_rank(),
        run_dir=files.folder,
        node=record["node_ip"],
        node_id=record["node_id"],
        entry_ts=entry_ts,
        files=files,
        process_ts=0.0 if resident else process_start(),
        resident=resident,
        imports_s=imports_s,
    )
