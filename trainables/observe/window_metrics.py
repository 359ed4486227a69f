"""One timing window's metrics: what the loop accumulates between two reports (Window), the
metrics dict rank 0 reports for it (WindowMetrics), and what rank 0 gathers from every rank
for it (their windows, telemetry samples and checkpoint parts)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trainables.config import TrialConfig, global_batch
from trainables.data.crops import SAMPLE_RATE
from trainables.data.durations import StepFacts
from trainables.distributed import gather_to_rank0
from trainables.engine.compile_watch import CompileWatch
from trainables.observe.timing import WindowTimer
from trainables.run_folder.run_state import RunState

__all__ = ["Window", "WindowMetrics", "gathered_extras", "rank_window_fields"]


@dataclass
class Window:
    """What the current window accumulates between two reports."""

    loss_sum: torch.Tensor  # on the device: summed without a sync, read once per window
    # The audio samples that are not padding, on the device likewise (an int64 count).
    audio_valid: torch.Tensor
    timer: WindowTimer = field(default_factory=WindowTimer)
    index: int = 0
    audio_total: int = 0
    # batching duration: what the window's micro-steps held on every rank, from the sampler's
    # plan (no collective): utterances, their audio samples and squared seconds (0: count
    # batching, where every step holds the config's global batch).
    samples: int = 0
    audio_samples: int = 0
    audio_sq_s: float = 0.0
    report_ms: float = 0.0  # how long the previous window's report took
    cpu_s: float = 0.0  # the training thread's CPU time in the steps (time.thread_time)

    @classmethod
    def on(cls, device: torch.device) -> Window:
        return cls(
            loss_sum=torch.zeros((), device=device),
            audio_valid=torch.zeros((), dtype=torch.int64, device=device),
        )

    def add_audio(self, batch: dict[str, torch.Tensor]) -> None:
        """The batch's audio mask on the run's device, counted there without a sync; read once
        per window (a batch without one has no padded row). Not the CPU-side mask: casting and
        summing its 4 M booleans (mb 128 of 2 s audio) held the loop's thread 7.4-20.6 ms per
        step on an H200 host."""
        audio_mask = batch.get("audio_mask")
        if audio_mask is None:
            self.audio_valid += batch["audio"].numel()
            self.audio_total += batch["audio"].numel()
            return
        device = self.audio_valid.device
        if audio_mask.device != device:  # a CPU mask's 0-dim sum would still add, on the host
            raise ValueError(f"audio_mask on {audio_mask.device}: pass the batch's mask on the "
                             f"run's device ({device}), after its copy")  # fmt: skip
        self.audio_valid += audio_mask.sum()
        self.audio_total += audio_mask.numel()

    def add_step(self, step: StepFacts | None) -> None:
        """What one micro-step held on every rank (batching duration; None: nothing to add)."""
        if step is None:
            return
        self.samples += step.samples
        self.audio_samples += step.audio_samples
        self.audio_sq_s += step.audio_sq_s

    def next(self) -> None:
        """Start the next window."""
        self.timer.reset()
        self.loss_sum.zero_()
        self.audio_valid.zero_()
        self.audio_total = 0
        self.samples = self.audio_samples = 0
        self.audio_sq_s = 0.0
        self.cpu_s = 0.0
        self.index += 1


class WindowMetrics:
    """Builds the metrics dict of each window from the run's fixed facts: the config, this
    worker (a loop.WorkerContext), the engine, the run's notes (filled as start-up goes on),
    rank 0's environment facts (sent with the first window) and what torch's compiler did in
    the window (``watch``: engine.compile_watch)."""

    def __init__(
        self,
        cfg: TrialConfig,
        worker,
        engine,
        notes: dict,
        env_facts: dict | None,
        watch: CompileWatch | None = None,
    ):
        self.cfg, self.worker, self.engine = cfg, worker, engine
        self.notes, self.env_facts = notes, env_facts
        self.watch = watch or CompileWatch(enabled=False)
        self.global_batch = global_batch(
            micro_batch=cfg.micro_batch,
            world_size=worker.world_size,
            grad_accum_steps=cfg.grad_accum_steps,
        )

    def step_batch(self, window: Window) -> float:
        """Samples per optimizer step of every rank: the config's global batch, or (batching
        duration) the mean of what the window's steps held."""
        if window.samples:
            return window.samples / len(window.timer)
        return float(self.global_batch)

    def _throughput(self, metrics: dict[str, Any], window: Window) -> dict[str, Any]:
        worker, engine = self.worker, self.engine
        window_s = metrics["iter_ms_mean"] * len(window.timer) / 1000.0
        valid = int(window.audio_valid)  # note: a CPU-GPU sync point; once per window
        # Rank 0's audio x world size: every rank reads the same crop distribution.
        audio_s = valid * worker.world_size / SAMPLE_RATE
        flops_per_sample = engine.flops_per_sample
        if window.samples:  # batching duration: every rank's audio and FLOPs, from the plan
            audio_s = window.audio_samples / SAMPLE_RATE
            if engine.flops_terms is not None:
                per_sample, per_s, per_sq_s = engine.flops_terms
                flops = per_sample * window.samples + per_s * audio_s + per_sq_s * window.audio_sq_s
                flops_per_sample = flops / window.samples
        tflops = flops_per_sample * metrics["samples_per_s"] / 1e12
        on_gpu = worker.device.type == "cuda"
        return {
            "model_tflops_per_s": tflops,
            "mfu": tflops / (engine.peak_tflops * worker.world_size),  # NaN: peak unknown
            "peak_mem_gib": torch.cuda.max_memory_allocated(worker.device) / 2**30
            if on_gpu
            else math.nan,
            "flops_per_sample": flops_per_sample,
            "audio_s_per_s": audio_s / window_s,
            # Rank 0's padding (batching duration: at most batch_max_pad, bins apart).
            "padding_ratio": 1.0 - valid / max(window.audio_total, 1),
        }

    def build(
        self,
        window: Window,
        state: RunState,
        *,
        epoch: int,
        first_step_ts: float,
        loop_start: float,
    ) -> dict[str, Any]:
        """The window ending at ``state.step``; validation, checkpoint and gathered fields are
        added by the loop."""
        cfg, worker, step = self.cfg, self.worker, state.step
        step_batch = self.step_batch(window)
        metrics: dict[str, Any] = window.timer.summary(step_batch)
        metrics.update(self._throughput(metrics, window))
        metrics.update(
            step=step,
            max_steps=cfg.max_steps,
            window=window.index,
            # note: .item() is a CPU-GPU sync point; once per window, never per step
            loss=float((window.loss_sum / len(window.timer)).item()),
            lr=self.engine.lr(),
            epoch=epoch,
            rank=worker.rank,
            node=worker.node,
            node_id=worker.node_id,
            world_size=worker.world_size,
            # batching duration: the window's mean, rounded (the steps' counts vary)
            global_batch=int(round(step_batch)),
            startup_s=first_step_ts - worker.start_ts,
            elapsed_s=time.perf_counter() - loop_start,
            window_end_ts=time.time(),
            report_ms=window.report_ms,
            # With step_ms: how much of a step the training thread computed on the CPU (a
            # host-bound step: most of it) rather than waited (for the GPU, the GIL, a core).
            cpu_ms_mean=window.cpu_s * 1e3 / len(window.timer),
            attempt_start_ts=state.attempt_start_ts,
            resumed_from_step=state.resumed_from_step,
            resume_notes=state.resume_notes,
            **self.engine.effective,
        )
        metrics["eta_s"] = (cfg.max_steps - step) * metrics["iter_ms_mean"] / 1000.0
        # Recompiles, CUDA graph re-recordings and skips, graph breaks: the cliffs torch reports.
        metrics.update(self.watch.take())
        # The run's compile seconds in its steps so far (the manifest keeps the last window's).
        metrics["compile_in_windows_s"] = round(self.watch.seconds, 3)
        metrics.update(self.notes)
        if window.index == 0 and self.env_facts is not None:
            metrics["env_facts"] = self.env_facts
        return metrics


def rank_window_fields(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """timing_ranks: all: the other ranks' windows and ``rank_skew``, the max over min
    iter_ms_p50 across ranks."""
    iters = [w["iter_ms_p50"] for w in windows]
    return {"rank_windows": windows[1:], "rank_skew": max(iters) / max(min(iters), 1e-9)}


def gathered_extras(cfg, metrics, telemetry, rank: int, world_size: int) -> dict[str, Any]:
    """One gather per window for what rank 0 reports on behalf of every rank: their windows
    (timing_ranks: all) and their telemetry samples."""
    share: dict[str, Any] = {}
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
    if "telemetry" in share:
        for kind in ("gpu", "host"):
            extras[f"{kind}_samples"] = [r for g in gathered for r in g["telemetry"].get(kind, [])]
    return extras
