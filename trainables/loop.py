"""The per-worker training loop: build, wrap, train ``max_steps`` steps, report one window per
``log_every`` steps. It computes and reports; everything that records or prints observes in the
driver (platform/callbacks.py)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainables.checkpoint import (
    best_checkpoint,
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
from trainables.data import build_loader, collate_for, epochs
from trainables.model import contrastive_loss
from trainables.strategies import build_engine
from trainables.telemetry import collect_env, start_telemetry
from trainables.timing import WindowTimer
from trainables.validation import build_val_dataset, evaluate
from trainables.watchdog import StallWatchdog
from trainables.worker_logs import register_worker

__all__ = [
    "WorkerContext",
    "gather_to_rank0",
    "rank_window_fields",
    "run_training",
    "train_loop_per_worker",
]


_LEAKED: list[bytes] = []  # inject_leak_mb_per_step keeps its allocations here


def _quiet_report_log() -> None:
    """Ray Train V2 logs every report of every rank at INFO, under a logger named after its
    source file (so RunConfig's LoggingConfig does not reach it); the driver prints progress."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # moved in another Ray version: the lines come back, nothing breaks
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


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
    cache_dir: Path | None = None  # shared by the runs of an output root (FLOPs per model shape)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: one call per worker."""
    entry_ts = time.time()
    import ray.train
    import ray.train.torch

    from trainables.telemetry import RayGauges

    _quiet_report_log()
    ctx = ray.train.get_context()
    cfg = TrialConfig.from_dict(loop_config["config"])
    run_dir = Path(loop_config["run"]["storage_path"]) / loop_config["run"]["name"]
    # First, before anything can fail: where this rank's log files are (fail_tail_lines).
    record = register_worker(run_dir, ctx.get_world_rank(), ctx.get_local_rank())
    gauges = RayGauges(loop_config["run"]["name"]) if cfg.telemetry else None

    def report(metrics: dict[str, Any], checkpoint: tuple[Path, str] | None = None) -> None:
        if gauges is not None and ctx.get_world_rank() == 0:
            gauges.update(metrics)
        # In Ray Train V2 every report is a barrier across workers: once per window only.
        if checkpoint is None:
            ray.train.report(metrics)
            return
        # Every rank wrote its part into runs/<run>/<name>/ already (the run's storage): nothing
        # to copy; Ray Train registers the checkpoint once every rank has reported.
        from ray.train import CheckpointUploadMode

        folder, name = checkpoint
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(str(folder)),
            checkpoint_dir_name=name,
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )

    run_training(
        cfg,
        WorkerContext(
            rank=ctx.get_world_rank(),
            world_size=ctx.get_world_size(),
            device=ray.train.torch.get_device(),
            report=report,
            start_ts=loop_config["run"]["trial_start_ts"],
            local_rank=ctx.get_local_rank(),
            run_dir=run_dir,
            node=record["node_ip"],
            node_id=record["node_id"],
            entry_ts=entry_ts,
            cache_dir=run_dir.parent.parent / "cache",
        ),
    )


def gather_to_rank0(payload: Any, rank: int, world_size: int) -> list[Any] | None:
    """Every rank's ``payload``, in rank order, on rank 0 (None elsewhere)."""
    if world_size == 1:
        return [payload]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    # note: a collective (pickled objects, a CPU-GPU sync), once per window, only when needed
    dist.gather_object(payload, gathered, dst=0)
    return gathered


def rank_window_fields(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """timing_ranks: all: the other ranks' windows and ``rank_skew``, the max over min
    iter_ms_p50 across ranks."""
    iters = [w["iter_ms_p50"] for w in windows]
    return {"rank_windows": windows[1:], "rank_skew": max(iters) / max(min(iters), 1e-9)}


def gather_placement(worker: WorkerContext) -> list[tuple[str, str, int]]:
    """(node id, node IP, pid) of every rank, in rank order: once, at start-up. Ranks on one
    node are told apart from other nodes by Ray's node id, never by the hostname (raylets of
    one machine, and containers on some clusters, share one)."""
    import os
    import socket

    me = (worker.node_id or socket.gethostname(), worker.node or socket.gethostname(), os.getpid())
    if worker.world_size == 1:
        return [me]
    import torch.distributed as dist

    everyone: list[Any] = [None] * worker.world_size
    dist.all_gather_object(everyone, me)
    return [tuple(e) for e in everyone]


def placement_fields(placement: list[tuple[str, str, int]]) -> dict[str, Any]:
    """The manifest's record of where each rank ran."""
    return {
        "rank_nodes": " ".join(f"{rank}={ip}" for rank, (_, ip, _) in enumerate(placement)),
        "nodes_used": len({node for node, _, _ in placement}),
    }


class StartupClock:
    """Where start-up time goes: laps of named parts, from the trial's start to the end of the
    first step. ``breakdown()`` is the manifest's ``startup_breakdown`` (seconds per part)."""

    def __init__(self, start_ts: float, entry_ts: float, process_ts: float = 0.0):
        self.parts: dict[str, float] = {}
        if start_ts and start_ts < process_ts < entry_ts:
            # Tune's trial actor and Ray Train's controller until this worker's process
            # started, then the worker process itself (Python, Ray, torch, the process group).
            self.parts["ray_controller"] = process_ts - start_ts
            self.parts["ray_worker"] = entry_ts - process_ts
        else:  # a process started before the trial (Ray's pool of idle workers), or no Ray
            self.parts["ray_workers"] = max(0.0, entry_ts - start_ts) if start_ts else 0.0
        self._last = entry_ts

    def lap(self, name: str) -> float:
        now = time.time()
        took = now - self._last
        self.parts[name] = self.parts.get(name, 0.0) + took
        self._last = now
        return took

    def add(self, name: str, seconds: float, out_of: str | None = None) -> None:
        """A part timed elsewhere; ``out_of``: the lap it was inside, which it is taken from."""
        self.parts[name] = self.parts.get(name, 0.0) + seconds
        if out_of is not None:
            self.parts[out_of] -= seconds

    def breakdown(self) -> str:
        return " ".join(f"{k}={v:.2f}" for k, v in self.parts.items())


def _process_start() -> float:
    """When this process started (its creation time), or 0 when it cannot be told."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - the breakdown then has one part less
        return 0.0


def _import_model_code() -> None:
    """The transformers model modules (a few seconds per process): timed as their own part."""
    import transformers.models.bert.modeling_bert  # noqa: F401
    import transformers.models.wav2vec2.modeling_wav2vec2  # noqa: F401


def run_training(cfg: TrialConfig, worker: WorkerContext) -> None:
    """The stage-1 loop, the same under Ray Train and under torchrun."""
    rank, world_size, device = worker.rank, worker.world_size, worker.device
    on_gpu = device.type == "cuda"
    clock = StartupClock(worker.start_ts, worker.entry_ts or time.time(), _process_start())

    if on_gpu:
        torch.cuda.set_device(device)  # DeepSpeed places its state on the current device
    # The loader first: its workers start (and prefetch) while the model is built.
    loader = build_loader(cfg, rank=rank, world_size=world_size, pin_memory=on_gpu)
    batches = epochs(loader)
    state, resume_from, meta = _resume_position(cfg, worker)
    batches.start(int(meta["epoch"]), int(meta["offset"])) if meta else batches.start()
    clock.lap("loader_start")
    _import_model_code()
    clock.lap("imports")
    engine = build_engine(cfg, device, clock=clock, flops_cache=worker.cache_dir)
    val_data = build_val_dataset(cfg)
    if resume_from is not None:
        _resume(cfg, worker, engine, state, resume_from)
        clock.lap("resume")
    placement = gather_placement(worker)
    mine = placement[rank][0]
    telemetry, telemetry_note = start_telemetry(
        cfg,
        rank=rank,
        local_rank=worker.local_rank,
        device=device,
        trainer_pids=[pid for node, _, pid in placement if node == mine],
        node=placement[rank][1],
        node_id=worker.node_id,
    )
    env_facts = collect_env(device) if rank == 0 else None
    notes = {
        "telemetry_effective": telemetry_note,
        # Manifest rows skipped because their audio file is missing (max_missing_files_fraction).
        "missing_files": getattr(loader.dataset, "missing_files", 0),
        **placement_fields(placement),
    }
    clock.lap("val_placement_telemetry")
    watchdog = StallWatchdog(cfg.stall_timeout_s, worker.run_dir, rank).start()
    try:
        # Compiling every known shape ahead: the watchdog covers it (it can take minutes).
        notes["compile_s"] = engine.warm_up(cfg)
        clock.lap("compile")
        _train(
            cfg,
            worker,
            engine,
            batches,
            telemetry,
            notes,
            env_facts,
            watchdog,
            state,
            val_data,
            clock,
        )
        if cfg.export_model != "none" and worker.run_dir is not None:
            _export(cfg, worker, engine, state)
    finally:
        watchdog.stop()
        if telemetry is not None:
            telemetry.stop()


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


def _resume_position(
    cfg: TrialConfig, worker: WorkerContext
) -> tuple[RunState, Path | None, dict[str, Any] | None]:
    """The newest complete checkpoint in the run's folder, if any (a worker-group restart, Ray
    Train's FailureConfig, or ``--resume`` after the driver died), and its meta: the loader
    starts at its data position before the model is built. Incomplete ones (a save or upload
    cut off) are skipped and named."""
    state = RunState(attempt_start_ts=time.time())
    folder, skipped = (None, [])
    if cfg.checkpoint_every and worker.run_dir is not None:
        folder, skipped = find_resume_checkpoint(worker.run_dir)
    state.resume_notes = "; ".join(skipped)
    if folder is None:
        return state, None, None
    meta = read_meta(folder)
    check_shape(meta, _shape(cfg, worker.world_size), folder)
    return state, folder, meta


def _resume(cfg: TrialConfig, worker: WorkerContext, engine, state: RunState, folder: Path) -> None:
    """Load the checkpoint's model, optimizer and schedule; its RNG states come back last. The
    loader's iterator was made before that, as it was made before the checkpoint in the run
    that saved it: the sample sequence and dropout masks go on the same."""
    meta = load_checkpoint(engine, folder, rank=worker.rank, device=worker.device)
    state.step = state.resumed_from_step = int(meta["step"])
    state.last_val = meta.get("last_val")
    restore_rng(folder, rank=worker.rank, device=worker.device)


def _save(cfg, worker, engine, batches, state: RunState) -> tuple[Path, dict[str, Any]]:
    """This rank's part of the checkpoint at ``state.step``, written into its folder in the
    run's storage (Ray Train registers it at the report); returns the folder and what rank 0
    records about it."""
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


def _gathered_extras(
    cfg, metrics, telemetry, rank: int, world_size: int, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One gather per window for what rank 0 reports on behalf of every rank: their windows
    (timing_ranks: all), their telemetry samples, and their checkpoint save times and sizes."""
    share: dict[str, Any] = {}
    if checkpoint:
        share["checkpoint"] = checkpoint
    if cfg.timing_ranks == "all" and world_size > 1:
        share["window"] = {
            k: v
            for k, v in metrics.items()
            if isinstance(v, (int, float)) or k in ("node", "node_id")
        }
    if cfg.telemetry:
        share["telemetry"] = telemetry.drain() if telemetry is not None else {}
    if not share:
        return {}
    gathered = gather_to_rank0(share, rank, world_size)
    if not gathered:
        return {}
    extras: dict[str, Any] = {}
    if "window" in share:
        extras.update(rank_window_fields([g["window"] for g in gathered]))
    if "checkpoint" in share:
        parts = [g["checkpoint"] for g in gathered]
        extras["checkpoint_save_s"] = max(p["save_s"] for p in parts)
        extras["checkpoint_size_bytes"] = sum(p["size_bytes"] for p in parts)
    if "telemetry" in share:
        for kind in ("gpu", "host"):
            extras[f"{kind}_samples"] = [r for g in gathered for r in g["telemetry"].get(kind, [])]
    return extras


def _train(
    cfg, worker, engine, batches, telemetry, notes, env_facts, watchdog, state, val_data, clock
) -> None:
    rank, world_size, device = worker.rank, worker.world_size, worker.device
    on_gpu = device.type == "cuda"

    accum = cfg.grad_accum_steps
    global_batch = cfg.micro_batch * world_size * accum
    timer = WindowTimer()
    loss_sum = torch.zeros((), device=device)
    window = 0
    first_step_ts: float | None = None
    report_ms = 0.0
    audio_valid = audio_total = 0
    val_collate = _collate_for(val_data, cfg)
    # score of best_metric for Ray Train's CheckpointConfig: the latest validation's value
    worst = math.inf if cfg.checkpoint_score_order == "min" else -math.inf
    loop_start = prev_end = time.perf_counter()
    while state.step < cfg.max_steps:
        state.step = step = state.step + 1
        t0 = time.perf_counter()
        data_s = 0.0
        for micro in range(accum):
            last = micro == accum - 1
            td = time.perf_counter()
            cpu_batch = next(batches)
            batch = {k: v.to(device, non_blocking=True) for k, v in cpu_batch.items()}
            data_s += time.perf_counter() - td
            # From the CPU-side mask: no device sync. Summed over the window, scaled at report.
            audio_valid += int(cpu_batch["audio_mask"].sum())
            audio_total += cpu_batch["audio_mask"].numel()
            with engine.accumulating(last):
                speech_emb, text_emb, logit_scale = engine(batch)
                # The loss in fp32 whatever the compute precision: softmax over the global batch.
                loss = contrastive_loss(
                    speech_emb.float(),
                    text_emb.float(),
                    logit_scale.float(),
                    scope=cfg.contrastive_scope,
                )
                engine.backward(loss)
            engine.step(last)
            loss_sum += loss.detach() / accum
        if (
            0 < cfg.inject_sleep_at_step <= step < cfg.inject_sleep_at_step + cfg.inject_sleep_steps
            and (step - cfg.inject_sleep_at_step) % cfg.inject_sleep_every == 0
            and cfg.inject_sleep_rank in (-1, rank)
        ):
            time.sleep(cfg.inject_sleep_s)  # fault injection (tests): a slow step on this rank
        if cfg.inject_leak_mb_per_step:  # fault injection (tests): memory that is never freed
            _LEAKED.append(b"\x01" * int(cfg.inject_leak_mb_per_step * 2**20))
        if step == cfg.inject_error_at_step and cfg.inject_error_rank in (-1, rank):
            raise RuntimeError(
                f"injected error at step {step} on rank {rank} (inject_error_at_step)"
            )
        if cfg.cuda_sync_timing and on_gpu:
            torch.cuda.synchronize()  # note: a CPU-GPU sync point, only when asked for
        t2 = time.perf_counter()
        watchdog.beat(step)
        # iter_ms runs from the end of the previous step, so it also holds the previous
        # window's report (a barrier) and anything else the loop does between steps.
        timer.add(
            data_ms=data_s * 1e3, step_ms=(t2 - t0 - data_s) * 1e3, iter_ms=(t2 - prev_end) * 1e3
        )
        prev_end = t2
        if first_step_ts is None:
            first_step_ts = time.time()
            clock.lap("first_step")
            clock.add("first_batch", data_s, out_of="first_step")
            notes["startup_breakdown"] = clock.breakdown()

        if step % cfg.log_every == 0 or step == cfg.max_steps:
            metrics = timer.summary(global_batch)
            window_s = metrics["iter_ms_mean"] * len(timer) / 1000.0
            tflops = engine.flops_per_sample * metrics["samples_per_s"] / 1e12
            metrics.update(
                model_tflops_per_s=tflops,
                mfu=tflops / (engine.peak_tflops * world_size),  # NaN where the peak is unknown
                peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30
                if on_gpu
                else math.nan,
                flops_per_sample=engine.flops_per_sample,
                # Rank 0's audio x world size: every rank reads the same crop distribution.
                audio_s_per_s=audio_valid * world_size / 16_000 / window_s,
                padding_ratio=1.0 - audio_valid / max(audio_total, 1),
                step=step,
                max_steps=cfg.max_steps,
                window=window,
                # note: .item() is a CPU-GPU sync point; once per window, never per step
                loss=float((loss_sum / len(timer)).item()),
                lr=engine.lr(),
                epoch=batches.epoch,
                rank=rank,
                node=worker.node,
                node_id=worker.node_id,
                world_size=world_size,
                global_batch=global_batch,
                startup_s=first_step_ts - worker.start_ts,
                elapsed_s=time.perf_counter() - loop_start,
                window_end_ts=time.time(),
                report_ms=report_ms,
                attempt_start_ts=state.attempt_start_ts,
                resumed_from_step=state.resumed_from_step,
                resume_notes=state.resume_notes,
                **engine.effective,
            )
            metrics["eta_s"] = (cfg.max_steps - step) * metrics["iter_ms_mean"] / 1000.0
            metrics.update(notes)
            if window == 0 and env_facts is not None:
                metrics["env_facts"] = env_facts
            paused = False  # validation or a checkpoint: kept out of the next window's times
            if cfg.val_every and (step % cfg.val_every == 0 or step == cfg.max_steps):
                val = evaluate(
                    engine,
                    val_data,
                    val_collate,
                    cfg,
                    rank=rank,
                    world_size=world_size,
                    device=device,
                )
                if rank == 0:
                    state.last_val = val | {"val_step": step}
                    metrics.update(state.last_val)
                paused = True
            ckpt_dir = None
            extras_local: dict[str, Any] = {}
            if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.max_steps):
                ckpt_dir, extras_local = _save(cfg, worker, engine, batches, state)
                metrics["checkpoint_score"] = (state.last_val or {}).get(cfg.best_metric, worst)
                metrics["checkpoint_step"] = step
                paused = True
            metrics.update(
                _gathered_extras(cfg, metrics, telemetry, rank, world_size, extras_local)
            )
            # Under Ray Train V2 a report is a barrier across workers, and it blocks while the
            # previous report is still queued, until the controller polls
            # (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S); report_ms of the next window shows it.
            t_report = time.perf_counter()
            if ckpt_dir is not None:
                worker.report(metrics, checkpoint=(ckpt_dir, checkpoint_name(step)))
            else:
                worker.report(metrics)
            report_ms = (time.perf_counter() - t_report) * 1e3
            if paused:
                prev_end = time.perf_counter()
            timer.reset()
            loss_sum.zero_()
            audio_valid = audio_total = 0
            window += 1


def _collate_for(dataset, cfg: TrialConfig):
    return None if dataset is None else collate_for(cfg, dataset.pad_id)


def _export(cfg: TrialConfig, worker: WorkerContext, engine, state: RunState) -> None:
    """export_model: the final model, or the best kept checkpoint's (loaded on every rank)."""
    from trainables.export import export_model

    source = f"final (step {state.step})"
    if cfg.export_model == "best":
        best = [None, None]
        if worker.rank == 0:
            best = best_checkpoint(worker.run_dir, cfg.checkpoint_score_order)
        if worker.world_size > 1:
            import torch.distributed as dist

            dist.broadcast_object_list(best, src=0)
        folder, score = best
        if folder is not None:
            meta = load_checkpoint(engine, Path(folder), rank=worker.rank, device=worker.device)
            source = f"best {cfg.best_metric} {score:.4f} (step {meta['step']})"
    export_model(engine, cfg, worker.run_dir / "export", rank=worker.rank, source=source)
