"""The per-worker training loop: build, wrap, train ``max_steps`` steps, report one window per
``log_every`` steps. It computes and reports; everything that records or prints observes in the
driver (platform/record/recorder.py). The same under Ray Train (trainables/ray_worker.py sets a
Ray Train worker up around it) and under torchrun (trainables/torchrun_main.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stage1_common.machine_cache import machine_cache
from stage1_common.output_root import RunFolder
from trainables.checkpoint.files import read_meta
from trainables.checkpoint.state import CheckpointWriter, registered_fields
from trainables.config import TrialConfig
from trainables.data.loader import build_loader, collate_for, compile_shapes, epochs
from trainables.distributed import gather_placement, placement_fields
from trainables.engine import build_engine
from trainables.engine.compile import cache_counts, use_compile_cache
from trainables.engine.compile_watch import CompileWatch
from trainables.faults import NoFaults, build_faults
from trainables.host_settings import apply_host_settings
from trainables.model.export import export_model
from trainables.model.stage1 import contrastive_loss
from trainables.observe.gc_control import CollectorClock
from trainables.observe.profiling import StepProfiler
from trainables.observe.startup import DeviceWarmUp, StartupClock, import_model_code, process_start
from trainables.observe.telemetry import collect_env, start_telemetry
from trainables.observe.watchdog import StallWatchdog, resident_end_after
from trainables.observe.window_metrics import Window, WindowMetrics, gathered_extras
from trainables.run_folder.place import InBucket, InFolder
from trainables.run_folder.run_files import RunFiles
from trainables.run_folder.run_state import RunState, load_checkpoint, resume, resume_position, save
from trainables.validation import build_val_dataset, evaluate

__all__ = ["WorkerContext", "run_training"]


@dataclass(frozen=True)
class WorkerContext:
    """Where the loop runs: its rank, the world, its device, and how a window is reported."""

    rank: int
    world_size: int
    device: torch.device
    # report(metrics, checkpoint=(folder, name) or None): one window, with this rank's part of
    # a checkpoint when one was saved
    report: Callable[..., None]
    start_ts: float  # when the run started (startup_s is measured from here)
    local_rank: int = 0
    run_dir: Path | None = None  # stack dumps, checkpoints (Ray Train's storage), the export
    # Where this rank runs: Ray's node IP and node id (outside Ray: the hostname and "").
    node: str = ""
    node_id: str = ""
    entry_ts: float = 0.0  # when this worker entered the loop function (0: at run_training)
    # When this worker's process started (0: it served earlier runs, a resident group's).
    process_ts: float = field(default_factory=process_start)
    resident: bool = False  # a resident group's worker (trainables/resident/serve.py)
    # Seconds this worker spent importing the model code before the run (a resident group's
    # first run: the group imports it when it starts), counted as the run's "imports" part.
    imports_s: float = 0.0
    # The run's folder and its place: the folder every node mounts, or this node's copy of it
    # uploaded to the bucket (trainables/run_folder/place.py).
    files: RunFiles | None = None

    @property
    def checkpoints(self) -> InFolder | InBucket:
        """Where the run's checkpoints live (its files' place; no files: the run's folder)."""
        return self.files.place if self.files is not None else InFolder(self.run_dir)


def run_training(cfg: TrialConfig, worker: WorkerContext) -> None:
    """The stage-1 loop, the same under Ray Train and under torchrun."""
    clock = StartupClock(worker.start_ts, worker.entry_ts or time.time(), worker.process_ts)
    if worker.device.type == "cuda":
        torch.cuda.set_device(worker.device)  # DeepSpeed places its state on the current device
    host = apply_host_settings(cfg, worker.device)  # intra-op threads, before any CPU op
    # The loader first: its workers start (and prefetch) while the model is built.
    loader = build_loader(
        cfg, rank=worker.rank, world_size=worker.world_size, pin_memory=worker.device.type == "cuda"
    )
    batches = epochs(loader, cfg.micro_batch)
    state, resume_from, meta = resume_position(cfg, worker)
    batches.start(int(meta["epoch"]), int(meta["offset"])) if meta else batches.start()
    clock.lap("loader_start")
    warm = DeviceWarmUp(worker.device, cfg.precision)  # beside the imports (nothing on a CPU)
    import_model_code()
    clock.lap("imports")
    if warm.join() > 0.05:
        clock.lap("device_warm_up")  # what the GPU's first uses took beyond the imports
    if worker.imports_s:  # done by the resident group while the run waited for its workers
        clock.add("imports", worker.imports_s, out_of="ray_workers")
    cache = machine_cache(cfg.compile_cache_dir)  # compiled code, FLOPs per model shape
    if cfg.torch_compile:
        use_compile_cache(cache, explicit=bool(cfg.compile_cache_dir))
    engine = build_engine(cfg, worker.device, clock=clock, flops_cache=cache / "flops")
    val_data = build_val_dataset(cfg)
    if resume_from is not None:
        resume(engine, state, resume_from, rank=worker.rank, device=worker.device)
        clock.lap("resume")
    telemetry, notes = _start_observing(cfg, worker, loader)
    notes.update(host)
    env_facts = collect_env(worker.device) if worker.rank == 0 else None
    clock.lap("val_placement_telemetry")
    end_after = (
        resident_end_after(cfg.stall_timeout_s, cfg.pg_timeout_s, worker.world_size)
        if worker.resident
        else 0.0
    )
    watchdog = StallWatchdog(
        cfg.stall_timeout_s,
        worker.run_dir,
        worker.rank,
        end_after,
        on_dump=worker.files.publish if worker.files is not None else None,
    ).start()
    writer = None
    if cfg.checkpoint_every and worker.run_dir is not None:
        writer = CheckpointWriter(
            cfg,
            engine,
            rank=worker.rank,
            world_size=worker.world_size,
            device=worker.device,
            per_node=worker.checkpoints.per_node,
        )
    # From here on, what torch's compiler does (the warm-up's compiles and recordings aside).
    watch = CompileWatch(enabled=cfg.torch_compile, cudagraphs=engine.cudagraphs).start()
    try:
        # Compiling every known shape ahead: the watchdog covers it (it can take minutes).
        compiled = engine.warm_up(cfg, compile_shapes(cfg, loader))
        watch.forget(skips=False)  # its skips hold for the steps
        notes["compile_s"], notes["compile_parts"] = compiled.seconds, compiled.parts
        clock.lap("compile")
        if writer is not None and writer.prepare():  # its asynchronous saves' host buffers
            clock.lap("checkpoint_buffers")
        run = _Run(
            cfg=cfg,
            worker=worker,
            engine=engine,
            batches=batches,
            state=state,
            telemetry=telemetry,
            watchdog=watchdog,
            clock=clock,
            notes=notes,
            metrics=WindowMetrics(cfg, worker, engine, notes, env_facts, watch),
            val_data=val_data,
            val_collate=None if val_data is None else collate_for(cfg, val_data.pad_id),
            faults=build_faults(cfg, worker.rank, worker.run_dir),
            profiler=StepProfiler(cfg.profile_steps, cfg.log_every, _profile_trace(worker)),
            writer=writer,
        )
        try:
            _train(run)
        finally:
            run.profiler.close()
        if cfg.export_model != "none" and worker.run_dir is not None:
            _export(cfg, worker, engine, state)
    finally:
        watch.close()
        if writer is not None:
            writer.close()
        watchdog.stop()
        if telemetry is not None:
            telemetry.stop()


def _profile_trace(worker: WorkerContext) -> Path | None:
    """Where rank 0 writes its profiler trace (profile_steps); None on the other ranks."""
    if worker.rank != 0 or worker.run_dir is None:
        return None
    return RunFolder(worker.run_dir).profile(worker.rank)


def _start_observing(cfg: TrialConfig, worker: WorkerContext, loader) -> tuple[Any, dict]:
    """Where every rank runs (one gather), this node's telemetry, and the run's notes for the
    manifest: the telemetry note, the missing audio files, the placement."""
    placement = gather_placement(worker.node_id, worker.node, worker.world_size)
    mine = placement[worker.rank][0]
    telemetry, telemetry_note = start_telemetry(
        cfg,
        rank=worker.rank,
        local_rank=worker.local_rank,
        device=worker.device,
        trainer_pids=[pid for node, _, pid in placement if node == mine],
        node=placement[worker.rank][1],
        node_id=worker.node_id,
    )
    notes = {
        "telemetry_effective": telemetry_note,
        # Manifest rows skipped because their audio file is missing (max_missing_files_fraction).
        "missing_files": getattr(loader.dataset, "missing_files", 0),
        **placement_fields(placement),
    }
    return telemetry, notes


@dataclass(kw_only=True)
class _Run:
    """What the steps work with, built once by run_training."""

    cfg: TrialConfig
    worker: WorkerContext
    engine: Any
    batches: Any  # data.EpochIterator
    state: RunState
    telemetry: Any
    watchdog: StallWatchdog
    clock: StartupClock
    notes: dict[str, Any]  # the run's notes for the manifest (startup_breakdown, compile_s, ...)
    metrics: WindowMetrics
    val_data: Any
    val_collate: Any
    faults: NoFaults
    profiler: StepProfiler
    writer: CheckpointWriter | None = None  # with checkpoint_every


def _train(run: _Run) -> None:
    """Steps up to max_steps; a report at the end of every window."""
    cfg, state, device = run.cfg, run.state, run.worker.device
    window = Window.on(device)
    first_step_ts: float | None = None
    loop_start = prev_end = time.perf_counter()
    with CollectorClock() as collector:
        while state.step < cfg.max_steps:
            state.step = step = state.step + 1
            run.profiler.before_step(step)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            data_s = _step(run, window)
            run.faults.after_step(step)  # fault injection (tests); a no-op object otherwise
            if cfg.cuda_sync_timing and device.type == "cuda":
                torch.cuda.synchronize()  # note: a CPU-GPU sync point, only when asked for
            t2 = time.perf_counter()
            window.cpu_s += time.thread_time() - cpu0
            run.watchdog.beat(step)
            # iter_ms runs from the end of the previous step, so it also holds the previous
            # window's report (a barrier) and anything else the loop does between steps.
            window.timer.add(
                data_ms=data_s * 1e3,
                step_ms=(t2 - t0 - data_s) * 1e3,
                iter_ms=(t2 - prev_end) * 1e3,
            )
            prev_end = t2
            if run.profiler.after_step(step):  # profile_steps: its sync and trace, untimed
                prev_end = time.perf_counter()
            if first_step_ts is None:
                first_step_ts = time.time()
                run.clock.lap("first_step")
                run.clock.add("first_batch", data_s, out_of="first_step")
                run.notes["startup_breakdown"] = run.clock.breakdown()
                run.notes["compile_cache"] = cache_counts() if cfg.torch_compile else ""
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                metrics = run.metrics.build(
                    window,
                    state,
                    epoch=run.batches.epoch,
                    first_step_ts=first_step_ts,
                    loop_start=loop_start,
                )
                metrics.update(collector.take())
                if _report(run, window, metrics):
                    prev_end = time.perf_counter()  # kept out of the next window's times
                window.next()


def _step(run: _Run, window: Window) -> float:
    """One optimizer step over grad_accum_steps micro-batches; returns the seconds spent
    waiting for data."""
    cfg, engine, device = run.cfg, run.engine, run.worker.device
    accum = cfg.grad_accum_steps
    data_s = 0.0
    for micro in range(accum):
        last = micro == accum - 1
        td = time.perf_counter()
        cpu_batch = next(run.batches)
        # batching duration: every rank's rows of this step, from the sampler's plan; else None
        step = run.batches.step
        batch = {k: v.to(device, non_blocking=True) for k, v in cpu_batch.items()}
        data_s += time.perf_counter() - td
        window.add_audio(batch)
        window.add_step(step)
        phase = run.profiler.phase  # the profiler's marks (profile_steps), else no-ops
        with engine.accumulating(last):
            with phase("forward"):
                speech_emb, text_emb, logit_scale = engine(batch)
                # The loss in fp32 whatever the compute precision: softmax over the global batch.
                loss = contrastive_loss(
                    speech_emb.float(),
                    text_emb.float(),
                    logit_scale.float(),
                    scope=cfg.contrastive_scope,
                    rows=None if step is None else step.rows,
                )
            with phase("backward"):
                engine.backward(loss)
        with phase("optimizer"):
            engine.step(last)
        window.loss_sum += _rank_mean(loss.detach(), step, run.worker.rank) / accum
    return data_s


def _rank_mean(loss, step, rank: int):
    """The loss as this rank's mean over its rows, the figure a count run reports: under
    batching duration the loss is that mean scaled to this rank's share of the step's rows
    (trainables/model/stage1.py: contrastive_loss), which would make the reported figure move
    with how the step's rows fell on the ranks."""
    if step is None:
        return loss
    rows = step.rows
    return loss * sum(rows) / (max(rows[rank], 1) * len(rows))


def _report(run: _Run, window: Window, metrics: dict[str, Any]) -> bool:
    """The window's validation and checkpoint when due, one gather for rank 0, and the report;
    returns whether validation or a checkpoint paused the steps."""
    cfg, worker, state, step = run.cfg, run.worker, run.state, run.state.step
    paused = False
    if cfg.val_every and (step % cfg.val_every == 0 or step == cfg.max_steps):
        val = evaluate(
            run.engine,
            run.val_data,
            run.val_collate,
            cfg,
            rank=worker.rank,
            world_size=worker.world_size,
            device=worker.device,
        )
        if worker.rank == 0:
            state.last_val = val | {"val_step": step}
            metrics.update(state.last_val)
        run.metrics.watch.forget()  # its compiles (eval mode, its shapes) are not the steps'
        paused = True
    if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.max_steps):
        save(cfg, worker, run.writer, run.batches, state)
        paused = True
    # A checkpoint complete on every rank by now, for Ray Train (rank 0 knows it from the shared
    # folder; a root on object storage: every rank, together), with its fields.
    registered = None
    if run.writer is not None and run.writer.per_node:
        registered = run.writer.registrable_everywhere()
    elif run.writer is not None and worker.rank == 0:
        registered = run.writer.registrable()
    worst = math.inf if cfg.checkpoint_score_order == "min" else -math.inf
    if registered is not None and worker.rank == 0:
        parts = run.writer.registered_parts if run.writer.per_node else None
        shown = worker.checkpoints.shown(registered.name)
        meta = read_meta(registered)
        metrics.update(registered_fields(registered, meta, worst, parts, shown))
    if run.writer is not None:
        superseded = run.writer.superseded_records(worst, worker.local_rank)
        if superseded:  # recorded, then deleted: Ray Train never takes them
            metrics["checkpoints_superseded"] = superseded
    metrics.update(gathered_extras(cfg, metrics, run.telemetry, worker.rank, worker.world_size))
    # Under Ray Train V2 a report is a barrier across workers, and it blocks while the previous
    # report is still queued, until the controller polls (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S);
    # report_ms of the next window shows it.
    t_report = time.perf_counter()
    if registered is not None:
        worker.report(metrics, checkpoint=(registered, registered.name))
    else:
        worker.report(metrics)
    window.report_ms = (time.perf_counter() - t_report) * 1e3
    return paused


def _best(cfg: TrialConfig, worker: WorkerContext) -> list:
    """[folder, score] of the best kept checkpoint, on every rank (from the bucket for a root
    on object storage: a complete copy on every node), or [None, None]."""
    return worker.checkpoints.best(worker, cfg.checkpoint_score_order)


def _export(cfg: TrialConfig, worker: WorkerContext, engine, state: RunState) -> None:
    """export_model: the final model, or the best kept checkpoint's (loaded on every rank)."""
    source = f"final (step {state.step})"
    if cfg.export_model == "best":
        folder, score = _best(cfg, worker)
        if folder is not None:
            meta = load_checkpoint(engine, Path(folder))
            source = f"best {cfg.best_metric} {score:.4f} (step {meta['step']})"
    export_model(engine, cfg, RunFolder(worker.run_dir).export, rank=worker.rank, source=source)
