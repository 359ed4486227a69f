"""A resident worker group's train function (its trainer: trainables/resident/group_trainer.py):
the Ray Train workers of one resource shape stay alive across a sweep's runs and train each run
the group pool hands them (trainables/resident/pool.py), one after the other.

Per run, every rank asks the pool for it (no collective while the group is idle, so an idle
group never meets the process group's timeout), trains it with the same ``run_training`` a fresh
run uses, and sends each window to the pool instead of ``ray.train.report``; the pool's answer
to rank 0's send, read at the next window, says whether the trial was stopped (race, ASHA,
run_timeout_s, Ctrl-C), which every rank learns in one broadcast, so the run stops there.
Between runs, whatever a run built is freed and the state it changed is put back (``release``);
an exception leaves the train function, so Ray Train tears the group down and the pool fails the
run's trial and builds a new group.
"""

from __future__ import annotations

import gc
import os
import random
import time
from typing import Any

import numpy as np
import torch

from trainables.config import TrialConfig
from trainables.distributed import broadcast_from_rank0
from trainables.loop import WorkerContext, run_training
from trainables.observe.startup import DeviceWarmUp, import_model_code
from trainables.ray_worker import quiet_report_log, ray_gauges, ray_worker_context
from trainables.resident.messages import Assignment, Outcome, Shutdown
from trainables.ticket import GroupTicket

__all__ = ["RunStopped", "memory_now", "release", "serve_loop_per_worker"]

POLL_S = 2.0  # how long one ask for the next run waits in the pool


class RunStopped(Exception):
    """The run's trial was stopped from outside (the pool said so at a window)."""


def serve_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point of a resident group: serve runs until the pool says stop."""
    import ray
    import ray.train
    import ray.train.torch

    quiet_report_log()
    mine = GroupTicket.decode(loop_config)
    pool, group = ray.get_actor(mine.pool), mine.group
    rank = ray.train.get_context().get_world_rank()
    torch_seed = torch.initial_seed()  # a new process's default seed, before any run
    # The model code first (the first run's "imports" part), with the GPU's first uses on a
    # thread beside it (DeviceWarmUp, in the device's own low precision: the group serves runs
    # of any precision), then every object alive is the process's own (torch,
    # transformers, Ray): frozen out of the collector, so no release and no collection inside
    # a run walks them again (the first release took 5.2 s on an H100, the later ones 1.2-1.5 s,
    # before this).
    t0 = time.monotonic()
    warm = DeviceWarmUp(ray.train.torch.get_device())
    import_model_code()
    warm.join()
    gc.collect()
    gc.freeze()
    imports_s = time.monotonic() - t0
    while True:
        job = ray.get(pool.next_job.remote(group, rank, POLL_S))
        if job is None:
            continue
        if isinstance(job, Shutdown):
            return
        before = memory_now()
        outcome = _serve_one(pool, job, rank, torch_seed, imports_s)
        imports_s = 0.0
        if rank == 0:  # the trial ends now: Tune starts the next one while this rank releases
            ray.get(pool.finished.remote(job.job_id, outcome, before))
        parts = release(job.ticket.config)
        gc.freeze()  # what a run left alive on purpose (modules it imported, caches)
        if rank == 0:
            after = dict(memory_now(), release_s=round(sum(parts.values()), 3))
            ray.get(pool.released.remote(job.job_id, dict(after, release_parts=parts)))


def _serve_one(pool, job: Assignment, rank: int, torch_seed: int, imports_s: float) -> Outcome:
    """Train one run of the pool; returns ``Outcome.OK`` or ``Outcome.STOPPED`` (an exception
    propagates). ``torch_seed``: the process's default seed; ``imports_s``: the group's imports,
    counted in its first run."""
    import ray

    entry_ts = time.time()
    ticket = job.ticket  # as its trial decoded it (Ray pickled the object: no parsing here)
    cfg = ticket.config
    gauges = ray_gauges(ticket.name) if cfg.telemetry else None
    # The RNG states a fresh process starts the run with: torch's default seed (what the loader
    # draws before build_engine seeds torch with cfg.seed), and fixed ones for Python and numpy.
    torch.manual_seed(torch_seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)

    sent: list[Any] = []  # rank 0: the window in flight to the pool (at most one)

    def report(metrics: dict[str, Any], checkpoint=None) -> None:
        if checkpoint is not None:  # refused by config_checks: checkpoints need fresh runs
            raise RuntimeError("a resident run cannot register checkpoints with Ray Train")
        stop = [False]
        if rank == 0:
            if gauges is not None:
                gauges.update(metrics)
            # The previous window's answer (it had a whole window to arrive: no wait), then
            # this window on its way without waiting: the round trip to the pool would sit in
            # the next window's first step (report_ms median 3.0-3.7 ms blocking, 0.8-0.9 ms
            # so, cpu_race on 2 cores). The windows keep their order (one in flight); a stop
            # lands one window later.
            stop = [bool(ray.get(sent.pop())) if sent else False]
            sent.append(pool.window.remote(job.job_id, dict(metrics, resident_group=job.label)))
        if broadcast_from_rank0(stop, worker.world_size)[0]:
            raise RunStopped(ticket.name)

    worker: WorkerContext = ray_worker_context(
        ticket, report, entry_ts, resident=True, imports_s=imports_s
    )
    finished = False
    try:
        run_training(cfg, worker)
        finished = True
    except RunStopped:
        finished = True
        return Outcome.STOPPED
    finally:
        ray.get(sent)  # the last window reaches the pool before the run's end does
        if worker.files is not None:  # a root on object storage
            worker.files.publish_at_end(worker.local_rank, finished=finished)
    return Outcome.OK


def release(cfg: TrialConfig) -> dict[str, float]:
    """Free what a finished run built and put back what it changed: its model, optimizer,
    engine, loader workers and CUDA graphs (unreachable once the run returned: collected here),
    compiled code and cudagraph trees (``torch._dynamo.reset``), the tensors NCCL keeps of the
    last collectives, the caching allocator's free blocks, cuBLAS's workspaces and cached pinned
    host memory, the peak-memory statistics, the heap's free pages (``malloc_trim``), the
    planted leak of fault drills, and the distributed state DeepSpeed set (its process groups;
    the default group stays). Returns the seconds each part took (``groups.json``'s
    ``release_parts``)."""
    from trainables import faults

    took: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        took[name] = round(took.get(name, 0.0) + now - t, 3)
        t = now

    faults.release()
    gc.collect()
    lap("collect")
    if cfg.torch_compile:  # an eager run compiled nothing (and the first reset imports 2-4 s)
        import torch._dynamo as dynamo

        dynamo.reset()
    lap("dynamo")
    _reset_deepspeed()
    _flush_collectives()
    lap("distributed")
    gc.collect()
    lap("collect")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        # cuBLAS's per-stream workspaces and the pinned host blocks the loaders' pin_memory
        # took stay cached otherwise (both are rebuilt on demand); private API: guarded.
        for name in ("_cuda_clearCublasWorkspaces", "_host_emptyCache"):
            if hasattr(torch._C, name):
                getattr(torch._C, name)()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        lap("cuda")
    _trim_heap()
    lap("trim")
    return took


def _flush_collectives() -> None:
    """One barrier on the default group (every rank releases, so every rank calls it): NCCL's
    process group keeps the tensors of the last collectives (DDP's gradient buckets, up to the
    size of all gradients) alive until a later collective; on the H100 probe 225-777 MB stayed
    allocated after a run without it, 0 MB with it (benchmarks/probes/resident_memory_probe.py)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc keeps them otherwise, and the
    process's resident set would hold every earlier run's peak)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _reset_deepspeed() -> None:
    """DeepSpeed keeps the process groups it made (a clone of the world for data parallelism,
    ZeRO's parameter groups) in module globals, and the next run's engine would make new ones
    beside them: destroyed here (their communicators hold memory), the globals emptied."""
    import sys

    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    import torch.distributed as dist

    for name, value in list(vars(groups).items()):
        if not name.endswith("_GROUP") or callable(value):
            continue
        made = value.values() if isinstance(value, dict) else [value]
        for group in made:
            if isinstance(group, dist.ProcessGroup) and group is not dist.group.WORLD:
                dist.destroy_process_group(group)
        setattr(groups, name, {} if isinstance(value, dict) else None)


def memory_now() -> dict[str, float]:
    """This process's resident set, and the GPU memory its tensors hold (allocated) and the
    caching allocator keeps (reserved), in MB; its threads and child processes (a run's loader
    workers and pin-memory thread must not outlive it)."""
    import threading

    import psutil

    me = psutil.Process(os.getpid())
    out: dict[str, Any] = {
        "rss_mb": me.memory_info().rss / 2**20,
        "threads": threading.active_count(),  # Python's
        "os_threads": me.num_threads(),  # with the native ones (Ray, NCCL, OpenMP)
        "children": len(me.children(recursive=True)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["gpu_allocated_mb"] = torch.cuda.memory_allocated() / 2**20
        out["gpu_reserved_mb"] = torch.cuda.memory_reserved() / 2**20
        if out["gpu_allocated_mb"] > 1:
            out["gpu_leftover"] = leftover_tensors()
    return out


def leftover_tensors(top: int = 4) -> str:
    """What still holds GPU memory once a run was released: the live CUDA tensors the garbage
    collector sees, their total, and the largest with the types of what refers to them."""
    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                found.append(obj)
        except Exception:  # noqa: BLE001 - objects that fail isinstance (lazy proxies)
            continue
    total = sum(t.untyped_storage().nbytes() for t in found) / 2**20
    found.sort(key=lambda t: t.untyped_storage().nbytes(), reverse=True)
    parts = []
    for t in found[:top]:
        held_by = sorted({type(r).__name__ for r in gc.get_referrers(t) if r is not found})
        parts.append(f"{tuple(t.shape)} {t.dtype} held by {','.join(held_by[:4])}")
    return f"{len(found)} tensors {total:.0f} MB; " + "; ".join(parts)
