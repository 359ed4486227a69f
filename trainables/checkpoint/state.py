"""How a checkpoint's model and optimizer state is written and read back, per strategy, and the
one save that may be in flight.

- ddp and fsdp2: torch.distributed.checkpoint (DCP) under ``dcp-<token>/``. Every rank writes
  its part (FSDP2: its shards; DDP: its share of the replicated state, which DCP
  deduplicates), rank 0 the metadata; a checkpoint loads into any world size (DCP reshards).
  With ``checkpoint_async`` (the default) the save is ``dcp.async_save``: the step is held only
  while the state is copied into the run's host buffers (trainables/checkpoint/asynchronous.py:
  CachedStager, pinned on a GPU), and a writer process per rank (a thread where the installed
  torch has no process-based writer) writes the files while training goes on.
- DeepSpeed: ``engine.save_checkpoint`` under ``ds/``, synchronous; ``checkpoint_mode`` in the
  manifest says why.

At most one save is in flight: the next save waits for it, and so does the run's last one. A
rank's part counts only once its done file is written, after its files are whole
(trainables/checkpoint/files.py): a save cut off by a kill is never resumed from. Rank 0 hands a
checkpoint to Ray Train only once every rank's part is complete (:meth:`registrable`).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stage1_common.output_root import CheckpointFolder
from trainables.checkpoint.asynchronous import checkpoint_mode, kept_open, make_stager
from trainables.checkpoint.files import (
    dcp_state,
    finish_part,
    is_complete,
    part_records,
    read_meta,
)
from trainables.distributed import gather_objects

__all__ = ["CheckpointWriter", "registered_fields"]


@dataclass
class _Save:
    """One save of this rank: what held training, and whether its files are whole. Its done
    file is written the moment they are (by the writer's completion callback, so a rank killed
    at the next step still leaves it), and again when training is held for it later."""

    folder: Path
    rank: int
    t0: float  # perf_counter at its start
    block_s: float = 0.0  # training held: the call (with the staging copy), the next save's wait
    call_s: float = 0.0  # of which the save call
    wait_s: float = 0.0  # the run's end waiting for it
    save_s: float = 0.0  # from its start to its files being whole
    upload: Future | None = None  # None: written synchronously
    written: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def whole(self, future: Future | None = None) -> None:
        """The files are written (``future``: the writer's, failed or not)."""
        with self.lock:
            self.save_s = time.perf_counter() - self.t0
            if future is not None and future.exception() is not None:
                return  # no done file: the part stays incomplete
            self.written = True
            self._done_file()

    def held(self, *, block_s: float = 0.0, wait_s: float = 0.0) -> None:
        """Training (``block_s``) or the run's end (``wait_s``) was held for it."""
        with self.lock:
            self.block_s += block_s
            self.wait_s += wait_s
            if self.written:
                self._done_file()

    def _done_file(self) -> None:
        times = {"save_s": self.save_s, "block_s": self.block_s, "call_s": self.call_s}
        finish_part(self.folder, self.rank, **times, wait_s=self.wait_s)


class CheckpointWriter:
    """Every rank's checkpoint writer for one run."""

    def __init__(
        self,
        cfg,
        engine,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        per_node: bool = False,
    ):
        self.engine, self.rank, self.world_size, self.device = engine, rank, world_size, device
        # A root on object storage: each node's folder holds only its own ranks' parts, so a
        # checkpoint is known complete by every rank together (registrable_everywhere).
        self.per_node = per_node
        self.mode, note = checkpoint_mode(cfg.strategy, cfg.checkpoint_async)
        engine.effective["checkpoint_mode"] = note
        self._save: _Save | None = None  # the one in flight
        self._unregistered: list[Path] = []  # rank 0 (per_node: every rank): not yet registered
        # Complete, but a newer one was registered first: (folder, per_node: its ranks' parts).
        self._superseded: list[tuple[Path, list[dict[str, Any]] | None]] = []
        self.registered_parts: list[dict[str, Any]] | None = None  # per_node: the last one's
        self._group = None  # a gloo group for DCP (async_save needs a CPU backend)
        self._stager = None
        self._pinned = cfg.checkpoint_pinned
        self._delay_s = cfg.inject_save_delay_s  # fault injection (tests)
        self._warm_up: tuple[Future, Path] | None = None
        if self.mode == "process":
            try:
                self._start_writer()
            except Exception as exc:  # the run trains on, saving synchronously
                self._fall_back("at the writer's start", exc)

    def _start_writer(self) -> None:
        """The writer processes start with the run: torch starts a rank's at its first
        async_save, so one tiny save into a temporary local folder goes first, and the first
        checkpoint does not wait for a process to start (seconds: it imports torch)."""
        import tempfile

        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        folder = Path(tempfile.mkdtemp(prefix="dcp-writer-start-"))
        future = dcp.async_save(
            {"start": torch.zeros(1)},
            checkpoint_id=folder,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            **self._dist(),
        )
        self._warm_up = (future, folder)

    def _writer_started(self) -> None:
        """Before the first save (and at the end): the start-up save is finished."""
        if self._warm_up is None:
            return
        future, folder = self._warm_up
        self._warm_up = None
        try:
            future.result()
        except Exception as exc:
            self._fall_back("at the writer's start", exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    @property
    def in_flight(self) -> bool:
        """Whether this rank's last save is still being written."""
        return self._save is not None

    # --- saving (every rank) ---
    def save(self, folder: Path, dcp_name: str, t0: float) -> None:
        """Write this rank's model and optimizer part of the checkpoint in ``folder`` (DCP: in
        its folder ``dcp_name``; the meta, schedule and RNG files are written by the caller);
        ``t0``: when the save began."""
        self._writer_started()
        save = _Save(folder=Path(folder), rank=self.rank, t0=t0)
        path = save.folder / dcp_name
        if self.rank == 0 or self.per_node:
            self._unregistered.append(save.folder)
        if self.engine.kind == "deepspeed":
            CheckpointFolder(save.folder).deepspeed.mkdir(parents=True, exist_ok=True)
            tag = CheckpointFolder.DEEPSPEED
            self.engine.model.save_checkpoint(str(save.folder), tag=tag, save_latest=False)
        elif self.mode != "sync":
            try:
                self._start_async(save, path)
            except Exception as exc:  # e.g. host memory for the staging copy: save it in full
                self._failed(save, exc)
        if self.engine.kind != "deepspeed" and self.mode == "sync" and save.upload is None:
            import torch.distributed.checkpoint as dcp

            dcp.save(dcp_state(self.engine), checkpoint_id=path, **self._dist())
        save.block_s = save.call_s = time.perf_counter() - t0
        if save.upload is None:
            save.whole()
        else:
            self._save = save
            # Whole at once if the write finished already, else when it does.
            save.upload.add_done_callback(save.whole)

    def _start_async(self, save: _Save, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        if self.device.type == "cuda":
            # Whatever stream a stager copies on, the last step's updates are done first.
            torch.cuda.current_stream(self.device).synchronize()
        kind = AsyncCheckpointerType.PROCESS if self.mode == "process" else None
        writer = {}
        if self._delay_s:
            from trainables.checkpoint.delayed_writer import DelayedWriter

            writer["storage_writer"] = DelayedWriter(path, self._delay_s)
        response = dcp.async_save(
            dcp_state(self.engine),
            checkpoint_id=path,
            async_stager=self._staging(),
            **writer,
            **({"async_checkpointer_type": kind} if kind else {}),
            **self._dist(),
        )
        # A Future: the stager (CachedStager) copied the state before async_save returned.
        save.upload = getattr(response, "upload_completion", response)

    def prepare(self) -> bool:
        """Before the first step: the stager's host buffers for the state a save will have, so
        that neither the first save nor the steps pay for making them (start-up's
        ``checkpoint_buffers`` part). Before the optimizer's first step its state does not
        exist: DCP's state dict makes it (torch's ``_init_optim_state``: one step at lr 0 on
        zero gradients, which leaves the parameters as they were), and it is dropped again
        once the buffers are made, so the first real step starts from nothing as it would
        without this (Adam's step count included). A resumed run has its loaded state.
        Returns whether it made them."""
        if self.mode == "sync" or self.engine.kind == "deepspeed":
            return False
        optimizer = self.engine.optimizer
        made_here = not optimizer.state
        state = dcp_state(self.engine)
        if optimizer.state:  # else no layout to make them for: the first save makes them
            self._run_stager().prepare(state)
        del state
        if made_here:
            optimizer.state.clear()
        return self._run_stager().ready

    def _run_stager(self):
        """One stager per run, its host buffers reused by every save (trainables/checkpoint/
        asynchronous.py: make_stager)."""
        if self._stager is None:
            shared = self.mode == "process"
            self._stager = make_stager(self.device, pinned=self._pinned, shared=shared)
        return self._stager

    def _staging(self):
        return kept_open(self._run_stager())

    def _dist(self) -> dict[str, Any]:
        import torch.distributed as dist

        if not dist.is_initialized():
            return {"no_dist": True}
        if self._group is None:
            backend = dist.get_backend()
            # Made once, by every rank at its first save (a collective).
            self._group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
        return {"process_group": self._group}

    def _failed(self, save: _Save, exc: BaseException) -> None:
        """An asynchronous save that failed: its part stays incomplete (never resumed from)."""
        self._fall_back(f"at {save.folder.name}", exc)

    def _fall_back(self, where: str, exc: BaseException) -> None:
        """async_save failed: later saves are synchronous, and the manifest's checkpoint_mode
        says why."""
        self.mode = "sync"
        why = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
        self.engine.effective["checkpoint_mode"] = f"dcp sync: async_save failed {where} ({why})"
        print(f"checkpoint: async_save failed {where}: {why}", file=sys.stderr)

    def poll(self) -> None:
        """At a window: forget the save in flight once its write is done (or failed)."""
        if self._save is not None and self._save.upload.done():
            save, self._save = self._save, None
            if save.upload.exception() is not None:
                self._failed(save, save.upload.exception())

    def wait(self, *, at_end: bool = False) -> None:
        """Until the save in flight is written: the next save holds training for it
        (``block_s``), the run's end waits for it (``wait_s``)."""
        save, self._save = self._save, None
        if save is None:
            return
        t = time.perf_counter()
        try:
            save.upload.result()
        except Exception as exc:
            self._failed(save, exc)
        waited = time.perf_counter() - t
        save.held(**({"wait_s": waited} if at_end else {"block_s": waited}))

    # --- registering (rank 0) ---
    def registrable(self) -> Path | None:
        """Rank 0: the newest saved checkpoint that is now complete and not yet given to Ray
        Train. Older complete ones (an asynchronous save that finished in the same window as
        the run's last save) are superseded: see ``superseded_records``."""
        self.poll()
        for i in range(len(self._unregistered) - 1, -1, -1):
            if is_complete(self._unregistered[i])[0]:
                folder = self._unregistered[i]
                older = self._unregistered[:i]
                self._superseded += [(f, None) for f in older if is_complete(f)[0]]
                del self._unregistered[: i + 1]
                return folder
        return None

    def registrable_everywhere(self) -> Path | None:
        """Every rank, ``per_node``: the newest saved checkpoint whose part is written on every
        rank (one collective, only while a save is unregistered: the same on every rank), and
        that no rank's writer holds any more (its done file is never rewritten after Ray Train
        took, uploaded and deleted the node's folder)."""
        self.poll()
        if not self._unregistered:
            return None
        mine = [int(self._part_written(folder)) for folder in self._unregistered]
        everyone = gather_objects(mine, self.world_size)
        agreed = [min(flags) for flags in zip(*everyone, strict=True)]
        for i in range(len(agreed) - 1, -1, -1):
            if agreed[i]:
                folder = self._unregistered[i]
                older = [
                    f for f, whole in zip(self._unregistered[:i], agreed, strict=False) if whole
                ]
                del self._unregistered[: i + 1]
                self._superseded += [(f, self._gather_parts(f)) for f in older]
                self.registered_parts = self._gather_parts(folder)
                return folder
        return None

    def _gather_parts(self, folder: Path) -> list[dict[str, Any]]:
        """Every rank's done record of ``folder`` (a collective: rank 0's node holds only its
        own ranks' files)."""
        record = json.loads(CheckpointFolder(folder).done(self.rank).read_text())
        return gather_objects(record, self.world_size)

    def superseded_records(self, worst: float, local_rank: int) -> list[dict[str, Any]]:
        """The complete checkpoints a newer one overtook before Ray Train was given them: their
        report fields (rank 0; ``checkpoint_registered`` false), and their folders deleted, by
        rank 0 and, per_node, each node's first rank (Ray Train never saw them, so its
        keep_checkpoints would leave them on disk or on a node's scratch for good). Every
        rank calls it after ``registrable``/``registrable_everywhere``."""
        records = []
        for folder, parts in self._superseded:
            if self.rank == 0:
                fields = registered_fields(folder, read_meta(folder), worst, parts)
                records.append(fields | {"checkpoint_registered": False})
            if self.rank == 0 or (self.per_node and local_rank == 0):
                shutil.rmtree(folder, ignore_errors=True)
        self._superseded = []
        return records

    def _part_written(self, folder: Path) -> bool:
        if self._save is not None and self._save.folder == folder:
            return False
        return CheckpointFolder(folder).done(self.rank).is_file()

    def close(self) -> None:
        """The end of the run (or its failure): nothing may stay in flight; the stager's host
        buffers are freed."""
        try:
            self._writer_started()
            if self._save is not None:
                self._save.upload.result()
        except Exception:  # a failed write: its part stays incomplete, never resumed from
            pass
        finally:
            self._save = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None


def registered_fields(
    folder: Path,
    meta: dict[str, Any],
    worst: float,
    parts: list[dict[str, Any]] | None = None,
    shown: str = "",
) -> dict[str, Any]:
    """The report fields of a complete checkpoint (rank 0, from every rank's done file, or
    ``parts``: those gathered from the ranks): its step and score (Ray Train ranks it by
    checkpoint_score), the slowest rank's save and block times, the bytes of all ranks, and
    where it is (``shown``: its address in the bucket)."""
    parts = parts or part_records(folder)
    score = meta.get("score")
    return {
        "checkpoint_step": int(meta["step"]),
        "checkpoint_score": worst if score is None else score,
        "checkpoint_save_s": max(p.get("save_s", 0.0) for p in parts),
        "checkpoint_block_s": max(p.get("block_s", 0.0) for p in parts),
        "checkpoint_wait_s": max(p.get("wait_s", 0.0) for p in parts),
        "checkpoint_size_bytes": sum(sum(p["files"].values()) for p in parts),
        "checkpoint_path": shown or str(folder),
        "checkpoint_registered": True,
    }
