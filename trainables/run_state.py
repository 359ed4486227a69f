"""Where a run stands (RunState: the last finished step, the attempt, the latest validation),
and how that position goes into a checkpoint and comes back from one: the newest complete
checkpoint of the run's folder on a restart, this rank's part of a new one at a window."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainables.checkpoint import (
    check_shape,
    checkpoint_name,
    find_resume_checkpoint,
    load_checkpoint,
    prepare_folder,
    read_meta,
    restore_rng,
    save_checkpoint,
)
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
    return {
        "world_size": world_size,
        "micro_batch": cfg.micro_batch,
        "grad_accum_steps": cfg.grad_accum_steps,
        "strategy": cfg.strategy,
        "zero_stage": cfg.zero_stage,
        "seed": cfg.seed,
    }


def resume_position(
    cfg: TrialConfig, run_dir: Path | None, world_size: int
) -> tuple[RunState, Path | None, dict[str, Any] | None]:
    """The newest complete checkpoint in the run's folder, if any (a worker-group restart, Ray
    Train's FailureConfig, or ``--resume`` after the driver died), and its meta: the loader
    starts at its data position before the model is built. Incomplete ones (a save or upload
    cut off) are skipped and named."""
    state = RunState(attempt_start_ts=time.time())
    folder, skipped = (None, [])
    if cfg.checkpoint_every and run_dir is not None:
        folder, skipped = find_resume_checkpoint(run_dir)
    state.resume_notes = "; ".join(skipped)
    if folder is None:
        return state, None, None
    meta = read_meta(folder)
    check_shape(meta, _shape(cfg, world_size), folder)
    return state, folder, meta


def resume(engine, state: RunState, folder: Path, *, rank: int, device) -> None:
    """Load the checkpoint's model, optimizer and schedule; its RNG states come back last. The
    loader's iterator was made before that, as it was made before the checkpoint in the run
    that saved it: the sample sequence and dropout masks go on the same."""
    meta = load_checkpoint(engine, folder, rank=rank, device=device)
    state.step = state.resumed_from_step = int(meta["step"])
    state.last_val = meta.get("last_val")
    restore_rng(folder, rank=rank, device=device)


def save(cfg: TrialConfig, worker, engine, batches, state: RunState) -> tuple[Path, dict[str, Any]]:
    """This rank's part of the checkpoint at ``state.step``, written into its folder in the
    run's storage (Ray Train registers it at the report); returns the folder and what rank 0
    records about it. ``worker``: the loop's WorkerContext (rank, world_size, device,
    run_dir)."""
    t0 = time.perf_counter()
    folder = worker.run_dir / checkpoint_name(state.step)
    prepare_folder(folder, rank=worker.rank, world_size=worker.world_size)
    meta = {
        # best_metric at the latest validation: how Ray Train ranks it, and the export picks
        "score": (state.last_val or {}).get(cfg.best_metric),
        "step": state.step,
        **batches.position,
        **_shape(cfg, worker.world_size),
        "best_metric": cfg.best_metric,
        "last_val": state.last_val,
        "saved_ts": time.time(),
    }
    size = save_checkpoint(engine, folder, meta, rank=worker.rank, device=worker.device)
    info = {"save_s": time.perf_counter() - t0, "size_bytes": size}
    return folder, info
