"""Checkpoints of a training run: what goes in, how it is known to be complete, where a run
resumes from.

A checkpoint folder (``checkpoint_step0000200``) holds:

- DDP: ``state.pt`` from rank 0 (model, optimizer, lr schedule, loss scaler), saved once;
- FSDP2: ``dcp/``, torch.distributed.checkpoint's sharded save of the model and optimizer (every
  rank writes its shards, ``__<rank>_<n>.distcp``; rank 0 the ``.metadata``), and ``state.pt``
  from rank 0 with the lr schedule and loss scaler;
- DeepSpeed: ``ds/``, written by ``engine.save_checkpoint`` from every rank (its own optimizer
  shards; with ZeRO-3 its own parameter shards too);
- every rank: ``rng-rank<r>.pt`` (python, numpy, torch and CUDA RNG states);
- rank 0: ``meta.json`` (step, data position, the run's shape, the best validation so far);
- every rank, written last: ``done-rank<r>.json``, the files that rank wrote and their sizes.

Every rank writes its part straight into the checkpoint's folder in the run's storage (no
second copy: ``ray.train.report(..., checkpoint_upload_mode=NO_UPLOAD)``), and Ray Train
registers the checkpoint once every rank has reported. On top of that, a checkpoint counts as
complete only when every rank's done file is there and every file it lists has its size: a save
cut off half-way is never resumed from, whatever cut it (the resume scan skips it and says so).
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "best_checkpoint",
    "checkpoint_name",
    "find_resume_checkpoint",
    "is_complete",
    "load_checkpoint",
    "prepare_folder",
    "save_checkpoint",
]

_NAME = re.compile(r"^checkpoint_step(\d+)$")
META = "meta.json"
DS_TAG = "ds"
DCP_DIR = "dcp"
# What must match for a checkpoint's data position and shards to mean the same thing.
SHAPE_KEYS = ("world_size", "micro_batch", "grad_accum_steps", "strategy", "zero_stage", "seed")


def checkpoint_name(step: int) -> str:
    return f"checkpoint_step{step:07d}"


def _rng_state(device: torch.device) -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _files(folder: Path) -> dict[str, int]:
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            out[str(path.relative_to(folder))] = path.stat().st_size
    return out


def _owned(name: str, rank: int) -> bool:
    """Whether a file of the checkpoint folder is this rank's: its RNG file and done file, and
    DeepSpeed's files named after its data-parallel rank (``*zero_pp_rank_<r>_*``); the rest
    (model states of ZeRO 0-2, DeepSpeed's helper script, state.pt, meta.json) is rank 0's."""
    base = Path(name).name
    for pattern in (r"rank(\d+)\.(pt|json)$", r"pp_rank_(\d+)_", r"^__(\d+)_\d+\.distcp$"):
        m = re.search(pattern, base)
        if m:
            return int(m.group(1)) == rank
    return rank == 0


def prepare_folder(folder: Path, *, rank: int, world_size: int) -> None:
    """Empty ``folder`` for a new save (an earlier attempt may have left a cut-off one there):
    rank 0 clears it while the others wait (every rank calls it)."""
    if rank == 0 and Path(folder).exists():
        import shutil

        shutil.rmtree(folder)
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier()  # note: a collective, once per checkpoint
    Path(folder).mkdir(parents=True, exist_ok=True)


def save_checkpoint(engine, folder: Path, meta: dict[str, Any], *, rank: int, device) -> int:
    """Write this rank's part of a checkpoint into ``folder`` (shared by the ranks, emptied by
    :func:`prepare_folder`); returns the bytes it wrote. Every rank calls it (DeepSpeed's save
    is collective)."""
    folder = Path(folder)
    if engine.kind == "deepspeed":
        (folder / DS_TAG).mkdir(parents=True, exist_ok=True)
        engine.model.save_checkpoint(str(folder), tag=DS_TAG, save_latest=False)
    elif engine.kind == "fsdp2":
        import torch.distributed.checkpoint as dcp

        dcp.save(_sharded_state(engine), checkpoint_id=folder / DCP_DIR)  # collective
        if rank == 0:
            torch.save(_schedule_state(engine), folder / "state.pt")
    elif rank == 0:
        state = {
            "model": engine.bare.state_dict(),
            "optimizer": engine.optimizer.state_dict(),
            "scheduler": engine.scheduler.state_dict(),
            "scaler": engine.scaler.state_dict() if engine.scaler is not None else None,
        }
        torch.save(state, folder / "state.pt")
    torch.save(_rng_state(device), folder / f"rng-rank{rank}.pt")
    if rank == 0:
        (folder / META).write_text(json.dumps(meta, indent=1))
    files = {k: v for k, v in _files(folder).items() if _owned(k, rank)}
    # Written last: its presence says this rank's files are whole.
    (folder / f"done-rank{rank}.json").write_text(json.dumps({"files": files}))
    return sum(files.values())


def is_complete(folder: Path) -> tuple[bool, str]:
    """Whether every rank's part of the checkpoint is there with its recorded sizes."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError):
        return False, f"{META} missing or unreadable"
    for rank in range(int(meta["world_size"])):
        try:
            files = json.loads((folder / f"done-rank{rank}.json").read_text())["files"]
        except (OSError, ValueError, KeyError):
            return False, f"rank {rank}'s part is missing (done-rank{rank}.json)"
        for name, size in files.items():
            path = folder / name
            if not path.is_file() or path.stat().st_size != size:
                return False, f"rank {rank}'s {name} is missing or cut short"
    return True, ""


def find_resume_checkpoint(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint under ``run_dir`` (None if there is none) and a note for
    every newer one that was skipped as incomplete."""
    found = []
    for path in Path(run_dir).glob("checkpoint_step*"):
        m = _NAME.match(path.name)
        if m and path.is_dir():
            found.append((int(m.group(1)), path))
    skipped = []
    for _, path in sorted(found, reverse=True):
        ok, why = is_complete(path)
        if ok:
            return path, skipped
        skipped.append(f"skipped {path.name}: incomplete ({why})")
    return None, skipped


def best_checkpoint(run_dir: Path, order: str) -> list:
    """[folder, score] of the complete checkpoint with the best validation score ("min" or
    "max"; the later one on a tie, as a later checkpoint has trained longer), or [None, None]."""
    best: list = [None, None]
    for path in sorted(Path(run_dir).glob("checkpoint_step*")):
        if not (_NAME.match(path.name) and is_complete(path)[0]):
            continue
        score = read_meta(path).get("score")
        if score is None:
            continue
        if best[1] is None or (score <= best[1] if order == "min" else score >= best[1]):
            best = [str(path), float(score)]
    return best


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / META).read_text())


def check_shape(meta: dict[str, Any], shape: dict[str, Any], folder: Path) -> None:
    """A checkpoint resumes only into a run of the same shape (data position and shards)."""
    diff = {k: (meta.get(k), shape[k]) for k in SHAPE_KEYS if meta.get(k) != shape[k]}
    if diff:
        said = ", ".join(f"{k} {a} (now {b})" for k, (a, b) in diff.items())
        raise ValueError(
            f"checkpoint {folder} was saved by a run with {said}; resume with the same settings "
            "or start a new --output-root"
        )


def load_checkpoint(engine, folder: Path, *, rank: int, device) -> dict[str, Any]:
    """Load the model, optimizer, schedule and scaler state (every rank calls it) and return
    the checkpoint's meta. RNG states are restored separately (:func:`restore_rng`), last."""
    folder = Path(folder)
    if engine.kind == "deepspeed":
        path, _ = engine.model.load_checkpoint(
            str(folder), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {folder / DS_TAG}")
    elif engine.kind == "fsdp2":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        # Loaded into this run's shards, whatever world size saved them (DCP reshards).
        sharded = _sharded_state(engine)
        dcp.load(sharded, checkpoint_id=folder / DCP_DIR)
        set_state_dict(
            engine.model,
            engine.optimizer,
            model_state_dict=sharded["model"],
            optim_state_dict=sharded["optimizer"],
        )
        _load_schedule(
            engine, torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
        )
    else:
        state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
        engine.bare.load_state_dict(state["model"])
        engine.optimizer.load_state_dict(state["optimizer"])
        _load_schedule(engine, state)
    return read_meta(folder)


def _sharded_state(engine) -> dict[str, Any]:
    """An FSDP2 engine's model and optimizer state as this rank's shards (DTensors)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = get_state_dict(engine.model, engine.optimizer)
    return {"model": model, "optimizer": optimizer}


def _schedule_state(engine) -> dict[str, Any]:
    return {
        "scheduler": engine.scheduler.state_dict(),
        "scaler": engine.scaler.state_dict() if engine.scaler is not None else None,
    }


def _load_schedule(engine, state: dict[str, Any]) -> None:
    engine.scheduler.load_state_dict(state["scheduler"])
    if engine.scaler is not None and state.get("scaler"):
        engine.scaler.load_state_dict(state["scaler"])


def restore_rng(folder: Path, *, rank: int, device) -> None:
    state = torch.load(Path(folder) / f"rng-rank{rank}.pt", map_location="cpu", weights_only=False)
    _set_rng_state(state, device)
