"""Checkpoints of a training run: what goes in, how it is known to be complete, where a run
resumes from.

A checkpoint folder (``checkpoint_step0000200``; the names: stage1_common/output_root.py,
RunFolder and CheckpointFolder) holds:

- DDP and FSDP2: ``dcp-<token>/`` (named in meta.json, new for every save), torch.distributed.checkpoint's save of the model and optimizer
  (every rank writes its part, ``__<rank>_<n>.distcp``; rank 0 the ``.metadata``), written
  asynchronously by default (trainables/checkpoint/state.py), and ``state.pt`` from rank 0 with
  the lr schedule and loss scaler;
- DeepSpeed: ``ds/``, written by ``engine.save_checkpoint`` from every rank (its own optimizer
  shards; with ZeRO-3 its own parameter shards too);
- every rank: ``rng-rank<r>.pt`` (python, numpy, torch and CUDA RNG states);
- rank 0: ``meta.json`` (step, data position, the run's shape, the best validation so far);
- every rank, written last, once its files are whole: ``done-rank<r>.json``, the files that
  rank wrote and their sizes, and the save's times (``save_s``, ``block_s``, ``wait_s``).

The model and optimizer state as DCP sees it (``dcp_state``) and its loading (``load_state``)
are here too; the writing is trainables/checkpoint/state.py's.

Every rank writes its part straight into the checkpoint's folder in the run's storage (no
second copy: ``ray.train.report(..., checkpoint_upload_mode=NO_UPLOAD)``); rank 0 hands the
checkpoint to Ray Train at the first report after it is complete. For an output root on object
storage the folder is on each node, and Ray Train uploads it to the bucket
(trainables/ray_worker.py; resuming from there: trainables/checkpoint/in_bucket.py). A checkpoint
counts as complete only when every rank's done file is there and every file it lists has its
size: a save cut off half-way (a kill while an asynchronous write was in flight) is never
resumed from, whatever cut it (the resume scan skips it and says so).
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stage1_common.output_root import CheckpointFolder, RunFolder
from trainables.distributed import broadcast_from_rank0

__all__ = [
    "DURATION_KEYS",
    "best_checkpoint",
    "complete_by",
    "dcp_dir",
    "dcp_state",
    "find_resume_checkpoint",
    "finish_part",
    "is_complete",
    "load_schedule",
    "load_state",
    "part_records",
    "prepare_folder",
    "read_meta",
    "restore_rng",
    "write_small_parts",
]

# What must match for a checkpoint's data position and shards to mean the same thing.
SHAPE_KEYS = ("world_size", "micro_batch", "grad_accum_steps", "strategy", "zero_stage", "seed")
# And with batching duration, whose epochs' steps these decide (in a checkpoint's meta only
# when it has them: one of count batching, or of a version before them, resumes as before).
DURATION_KEYS = ("batching", "batch_audio_s", "batch_max_pad", "max_audio_s", "min_audio_s")


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
            try:
                out[str(path.relative_to(folder))] = path.stat().st_size
            except FileNotFoundError:  # another rank's file, renamed or removed meanwhile
                continue
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


def prepare_folder(folder: Path, *, rank: int, world_size: int, clears: bool | None = None) -> str:
    """Empty ``folder`` for a new save (an earlier attempt may have left a cut-off one there):
    rank 0 clears it while the others wait (every rank calls it; ``clears``: whether this rank
    does, for folders on each node: each node's first local rank). Returns the name of this
    save's DCP folder, the same on every rank and new for every save: a writer process that
    outlived its killed rank finds its folder gone instead of writing into this save."""
    if (rank == 0 if clears is None else clears) and Path(folder).exists():
        import shutil

        shutil.rmtree(folder)
    # note: a collective (a barrier), once per checkpoint
    name = broadcast_from_rank0([CheckpointFolder.dcp_name(secrets.token_hex(4))], world_size)[0]
    Path(folder).mkdir(parents=True, exist_ok=True)
    return name


def dcp_dir(folder: Path) -> Path | None:
    """A checkpoint's DCP folder (None: DeepSpeed's, or a DDP one from before DCP)."""
    name = read_meta(folder).get("dcp_dir", CheckpointFolder.DCP)
    path = Path(folder) / name
    return path if path.is_dir() else None


def write_small_parts(engine, folder: Path, meta: dict[str, Any], *, rank: int, device) -> None:
    """What a save writes besides the model and optimizer state (trainables/checkpoint/state.py),
    synchronously: this rank's RNG states; rank 0 the lr schedule and loss scaler (DDP, FSDP2:
    DeepSpeed saves its own) and ``meta.json``."""
    parts = CheckpointFolder(folder)
    if rank == 0 and engine.kind != "deepspeed":
        torch.save(_schedule_state(engine), parts.state)
    torch.save(_rng_state(device), parts.rng(rank))
    if rank == 0:
        parts.meta.write_text(json.dumps(meta, indent=1))


def finish_part(folder: Path, rank: int, **times: float) -> int:
    """This rank's done file, written once every file it wrote is whole: the files and their
    sizes, and how long the save took (``save_s``), held training (``block_s``) and held the
    run's end (``wait_s``). Returns the bytes of its files."""
    folder = Path(folder)
    done = CheckpointFolder(folder).done(rank)
    files = {k: v for k, v in _files(folder).items() if _owned(k, rank) and k != done.name}
    # Beside the folder (so no rank lists it), then renamed: it may be written again later.
    tmp = folder.parent / f".{folder.name}-{done.name}.tmp"
    tmp.write_text(json.dumps({"files": files, **times}))
    os.replace(tmp, done)
    return sum(files.values())


def part_records(folder: Path) -> list[dict[str, Any]]:
    """Every rank's done file of a complete checkpoint, in rank order."""
    world = int(read_meta(folder)["world_size"])
    parts = CheckpointFolder(folder)
    return [json.loads(parts.done(r).read_text()) for r in range(world)]


def is_complete(folder: Path) -> tuple[bool, str]:
    """Whether every rank's part of the checkpoint is there with its recorded sizes."""
    folder = Path(folder)

    def size(name: str) -> int | None:
        path = folder / name
        return path.stat().st_size if path.is_file() else None

    return complete_by(lambda name: (folder / name).read_text(), size)


def complete_by(read_text, size) -> tuple[bool, str]:
    """``is_complete`` over any store: ``read_text(name)`` and ``size(name)`` (None when the file
    is not there) of the files in one checkpoint's folder (a local folder, or a bucket's
    listing: trainables/checkpoint/in_bucket.py)."""
    try:
        meta = json.loads(read_text(CheckpointFolder.META))
    except (OSError, ValueError):
        return False, f"{CheckpointFolder.META} missing or unreadable"
    for rank in range(int(meta["world_size"])):
        done = CheckpointFolder.DONE.format(rank=rank)
        try:
            files = json.loads(read_text(done))["files"]
        except (OSError, ValueError, KeyError):
            return False, f"rank {rank}'s part is missing ({done})"
        for name, n in files.items():
            if size(name) != n:
                return False, f"rank {rank}'s {name} is missing or cut short"
    return True, ""


def find_resume_checkpoint(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint under ``run_dir`` (None if there is none) and a note for
    every newer one that was skipped as incomplete."""
    skipped = []
    for path in reversed(RunFolder(run_dir).checkpoints()):
        ok, why = is_complete(path)
        if ok:
            return path, skipped
        skipped.append(f"skipped {path.name}: incomplete ({why})")
    return None, skipped


def best_checkpoint(run_dir: Path, order: str) -> list:
    """[folder, score] of the complete checkpoint with the best validation score ("min" or
    "max"; the later one on a tie, as a later checkpoint has trained longer), or [None, None]."""
    best: list = [None, None]
    for path in RunFolder(run_dir).checkpoints():
        if not is_complete(path)[0]:
            continue
        score = read_meta(path).get("score")
        if score is None:
            continue
        if best[1] is None or (score <= best[1] if order == "min" else score >= best[1]):
            best = [str(path), float(score)]
    return best


def read_meta(folder: Path) -> dict[str, Any]:
    return json.loads(CheckpointFolder(folder).meta.read_text())


def check_shape(meta: dict[str, Any], shape: dict[str, Any], folder: Path) -> str:
    """A checkpoint resumes only into a run of the same shape (data position and shards), but a
    DDP or FSDP2 one (DCP) loads into another world size: DCP reshards. Returns a note when it
    does."""
    resharded = (
        meta.get("world_size") != shape["world_size"]
        and shape["strategy"] in ("ddp", "fsdp2")
        # duration batches: another world size cuts every epoch anew, no position carries over
        and "batching" not in meta
        and "batching" not in shape
        and dcp_dir(folder) is not None
    )
    keys = [k for k in SHAPE_KEYS if not (resharded and k == "world_size")]
    keys += [k for k in DURATION_KEYS if k in meta or k in shape]
    diff = {k: (meta.get(k), shape.get(k)) for k in keys if meta.get(k) != shape.get(k)}
    if diff:
        said = ", ".join(f"{k} {a} (now {b})" for k, (a, b) in diff.items())
        raise ValueError(
            f"checkpoint {folder} was saved by a run with {said}; resume with the same settings "
            "or start a new --output-root"
        )
    if not resharded:
        return ""
    return f"resharded from {meta['world_size']} ranks to {shape['world_size']}"


def load_schedule(engine, folder: Path) -> None:
    """The lr schedule and loss scaler of a DDP or FSDP2 checkpoint (DeepSpeed loads its own)."""
    if engine.kind == "deepspeed":
        return
    state = torch.load(CheckpointFolder(folder).state, map_location="cpu", weights_only=False)
    engine.scheduler.load_state_dict(state["scheduler"])
    if engine.scaler is not None and state.get("scaler"):
        engine.scaler.load_state_dict(state["scaler"])


def _schedule_state(engine) -> dict[str, Any]:
    return {
        "scheduler": engine.scheduler.state_dict(),
        "scaler": engine.scaler.state_dict() if engine.scaler is not None else None,
    }


def restore_rng(folder: Path, *, rank: int, device) -> None:
    path = CheckpointFolder(folder).rng(rank)
    state = torch.load(path, map_location="cpu", weights_only=False)
    _set_rng_state(state, device)


def dcp_state(engine) -> dict[str, Any]:
    """The model and optimizer state as DCP saves and loads it: keyed by parameter names, this
    rank's shards (DTensors) under FSDP2, whole tensors under DDP."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = get_state_dict(engine.bare, engine.optimizer)
    return {"model": model, "optimizer": optimizer}


def load_state(engine, folder: Path) -> None:
    """Load the checkpoint's model and optimizer state into ``engine`` (every rank calls it)."""
    parts = CheckpointFolder(folder)
    if engine.kind == "deepspeed":
        path, _ = engine.model.load_checkpoint(
            str(parts.path),
            tag=parts.DEEPSPEED,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {parts.deepspeed}")
        return
    path = dcp_dir(folder)
    if path is None:  # a DDP checkpoint from before DCP: whole, in state.pt
        state = torch.load(parts.state, map_location="cpu", weights_only=False)
        engine.bare.load_state_dict(state["model"])
        engine.optimizer.load_state_dict(state["optimizer"])
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    # Loaded into this run's shards, whatever world size saved them (DCP reshards).
    state = dcp_state(engine)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        engine.bare,
        engine.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )
