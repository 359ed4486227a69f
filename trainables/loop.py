"""The per-worker training loop: build, wrap, train ``max_steps`` steps, report one window per
``log_every`` steps. It computes and reports; everything that records or prints observes in the
driver (platform/callbacks.py)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainables.config import TrialConfig
from trainables.data import build_loader, epochs
from trainables.model import contrastive_loss
from trainables.strategies import build_engine
from trainables.timing import WindowTimer

__all__ = ["WorkerContext", "gather_rank_windows", "run_training", "train_loop_per_worker"]


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
    report: Callable[[dict[str, Any]], None]
    start_ts: float  # when the run started (startup_s is measured from here)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point: one call per worker."""
    import ray.train
    import ray.train.torch

    _quiet_report_log()
    ctx = ray.train.get_context()
    run_training(
        TrialConfig.from_dict(loop_config["config"]),
        WorkerContext(
            rank=ctx.get_world_rank(),
            world_size=ctx.get_world_size(),
            device=ray.train.torch.get_device(),
            # In Ray Train V2 every report is a barrier across workers: once per window only.
            report=ray.train.report,
            start_ts=loop_config["run"]["trial_start_ts"],
        ),
    )


def gather_rank_windows(metrics: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """Every rank's window figures, gathered to rank 0 (timing_ranks: all). Rank 0 gets the other
    ranks' windows as ``rank_windows`` and ``rank_skew``, the max over min iter_ms_p50 across
    ranks; the other ranks get nothing (only rank 0's report reaches the driver)."""
    import torch.distributed as dist

    mine = {k: v for k, v in metrics.items() if not isinstance(v, str)}
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    # note: a collective (pickled objects, a CPU-GPU sync), once per window and only when asked
    dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return {}
    iters = [w["iter_ms_p50"] for w in gathered]
    return {"rank_windows": gathered[1:], "rank_skew": max(iters) / max(min(iters), 1e-9)}


def run_training(cfg: TrialConfig, worker: WorkerContext) -> None:
    """The stage-1 loop, the same under Ray Train and under torchrun."""
    rank, world_size, device = worker.rank, worker.world_size, worker.device
    on_gpu = device.type == "cuda"

    if on_gpu:
        torch.cuda.set_device(device)  # DeepSpeed places its state on the current device
    engine = build_engine(cfg, device)
    loader = build_loader(cfg, rank=rank, world_size=world_size, pin_memory=on_gpu)
    batches = epochs(loader)

    global_batch = cfg.micro_batch * world_size
    timer = WindowTimer()
    loss_sum = torch.zeros((), device=device)
    window = 0
    first_step_ts: float | None = None
    report_ms = 0.0
    audio_valid = audio_total = 0
    loop_start = prev_end = time.perf_counter()
    for step in range(1, cfg.max_steps + 1):
        t0 = time.perf_counter()
        cpu_batch = next(batches)
        batch = {k: v.to(device, non_blocking=True) for k, v in cpu_batch.items()}
        t1 = time.perf_counter()
        # From the CPU-side mask: no device sync. Summed over the window, scaled at report.
        audio_valid += int(cpu_batch["audio_mask"].sum())
        audio_total += cpu_batch["audio_mask"].numel()
        speech_emb, text_emb, logit_scale = engine(batch)
        # The loss in fp32 whatever the compute precision: softmax over the global batch.
        loss = contrastive_loss(
            speech_emb.float(), text_emb.float(), logit_scale.float(), scope=cfg.contrastive_scope
        )
        engine.backward(loss)
        engine.step()
        loss_sum += loss.detach()
        if cfg.cuda_sync_timing and on_gpu:
            torch.cuda.synchronize()  # note: a CPU-GPU sync point, only when asked for
        t2 = time.perf_counter()
        # iter_ms runs from the end of the previous step, so it also holds the previous
        # window's report (a barrier) and anything else the loop does between steps.
        timer.add(data_ms=(t1 - t0) * 1e3, step_ms=(t2 - t1) * 1e3, iter_ms=(t2 - prev_end) * 1e3)
        prev_end = t2
        if first_step_ts is None:
            first_step_ts = time.time()

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
                rank=rank,
                world_size=world_size,
                global_batch=global_batch,
                startup_s=first_step_ts - worker.start_ts,
                elapsed_s=time.perf_counter() - loop_start,
                window_end_ts=time.time(),
                report_ms=report_ms,
                **engine.effective,
            )
            if cfg.timing_ranks == "all" and world_size > 1:
                metrics.update(gather_rank_windows(metrics, rank, world_size))
            # Under Ray Train V2 a report is a barrier across workers, and it blocks while the
            # previous report is still queued, until the controller polls
            # (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S); report_ms of the next window shows it.
            t_report = time.perf_counter()
            worker.report(metrics)
            report_ms = (time.perf_counter() - t_report) * 1e3
            timer.reset()
            loss_sum.zero_()
            audio_valid = audio_total = 0
            window += 1
