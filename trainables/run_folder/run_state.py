"""Where a run stands (RunState: the last finished step, the attempt, the latest validation),
and how that position goes into a checkpoint and comes back from one: the newest complete
checkpoint of the run's folder on a restart, this rank's part of a new one at a window."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stage1_common.output_root import RunFolder
from trainables.checkpoint.files import (
    DURATION_KEYS,
    check_shape,
    load_schedule,
    load_state,
    prepare_folder,
    read_meta,
    restore_rng,
    write_small_parts,
)
from trainables.checkpoint.state import CheckpointWriter
from trainables.config import TrialConfig

__all__ = ["RunState", "resume", "resume_position", "save"]


@dataclass
class RunState:
    """Where training stands: the last finished step, the attempt, the latest validation."""

    step: int = 0
    resumed_from_step: int = 0
    attempt_start_ts: float = 0.0
    resume_notes: str = ""
    last_val: dict[str, Any] | None = None


def _shape(cfg: TrialConfig, world_size: int) -> dict[str, Any]:
    shape = {
        "world_size": world_size,
        "micro_batch": cfg.micro_batch,
        "grad_accum_steps": cfg.grad_accum_steps,
        "strategy": cfg.strategy,
        "zero_stage": cfg.zero_stage,
        "seed": cfg.seed,
    }
    if cfg.batching == "duration":  # its epochs' steps (the data position) depend on these
        shape.update({k: getattr(cfg, k) for k in DURATION_KEYS})
    return shape


def resume_position(
    cfg: TrialConfig, worker
) -> tuple[RunState, Path | None, dict[str, Any] | None]:
    """The newest complete checkpoint of the run (a worker-group restart, Ray Train's
    FailureConfig, or ``--resume`` after the driver died), and its meta: the loader starts at
    its data position before the model is built. Incomplete ones (a save or upload cut off) are
    skipped and named. The run's folder, or for a root on object storage the bucket (rank 0
    chooses, every node gets a complete copy). ``worker``: the loop's WorkerContext."""
    state = RunState(attempt_start_ts=time.time())
    folder, skipped = (None, [])
    if cfg.checkpoint_every:
        folder, skipped = worker.checkpoints.newest(worker)
    state.resume_notes = "; ".join(skipped)
    if folder is None:
        return state, None, None
    meta = read_meta(folder)
    resharded = check_shape(meta, _shape(cfg, worker.world_size), folder)
    if resharded:
        # The epoch's samples already taken are skipped by count: the offset (batches per
        # rank) scaled by the world sizes.
        meta["offset"] = int(meta["offset"]) * int(meta["world_size"]) // worker.world_size
        state.resume_notes = "; ".join(filter(None, [state.resume_notes, resharded]))
    return state, folder, meta


def resume(engine, state: RunState, folder: Path, *, rank: int, device) -> None:
    """Load the checkpoint's model, optimizer and schedule; its RNG states come back last. The
    loader's iterator was made before that, as it was made before the checkpoint in the run
    that saved it: the sample sequence and dropout masks go on the same."""
    meta = load_checkpoint(engine, folder)
    state.step = state.resumed_from_step = int(meta["step"])
    state.last_val = meta.get("last_val")
    restore_rng(folder, rank=rank, device=device)


def load_checkpoint(engine, folder: Path) -> dict[str, Any]:
    """The checkpoint's model, optimizer, schedule and scaler state, into ``engine`` (every
    rank calls it); returns its meta."""
    load_state(engine, folder)
    load_schedule(engine, folder)
    return read_meta(folder)


def save(cfg: TrialConfig, worker, writer: CheckpointWriter, batches, state: RunState) -> Path:
    """Begin the checkpoint at ``state.step``: rank 0 empties its folder in the run's storage,
    every rank writes its RNG states (rank 0 the meta and schedule) and starts its part of the
    model and optimizer state (``writer``: asynchronous by default; the save before must be
    finished first). The last step's save is waited for: the run ends with it complete.
    ``worker``: the loop's WorkerContext (rank, world_size, device, run_dir)."""
    t0 = time.perf_counter()
    writer.wait()
    folder = RunFolder(worker.run_dir).checkpoint(state.step)
    clears = worker.checkpoints.clears(worker.local_rank)
    dcp_name = prepare_folder(folder, rank=worker.rank, world_size=worker.world_size, clears=clears)
    meta = {
        # best_metric at the latest validation: how Ray Train ranks it, and the export picks
        "score": (state.last_val or {}).get(cfg.best_metric),
        "step": state.step,
        **batches.position,
        **_shape(cfg, worker.world_size),
        "best_metric": cfg.best_metric,
        "last_val": state.last_val,
        "saved_ts": time.time(),
        "dcp_dir": dcp_name,
    }
    write_small_parts(writer.engine, folder, meta, rank=worker.rank, device=worker.device)
    writer.save(folder, dcp_name, t0)
    if state.step == cfg.max_steps:
        writer.wait(at_end=True)
    if not writer.in_flight and worker.world_size > 1:
        import torch.distributed as dist

        dist.barrier()  # every rank's part is complete before rank 0 registers it
    return folder
