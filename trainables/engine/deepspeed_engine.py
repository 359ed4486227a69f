"""The DeepSpeed engine: ZeRO stages 0-3 from the trial's config; DeepSpeed does its own
precision (bf16/fp16 modes with dynamic loss scaling), accumulation, clipping and schedule
stepping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainables.config import TrialConfig
from trainables.engine.compile import compile_deepspeed
from trainables.engine.core import Engine, EngineParts, assemble_engine
from trainables.engine.optim import build_scheduler

__all__ = ["deepspeed_config", "wrap_deepspeed"]


def deepspeed_config(cfg: TrialConfig, precision: str) -> dict[str, Any]:
    """The DeepSpeed config of a trial. ``bucket_mb`` sets ZeRO's reduce and all-gather bucket
    sizes (DeepSpeed counts them in elements: MB / 4 bytes)."""
    bucket_elements = int(cfg.bucket_mb * 1e6 / 4)
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage > 0:
        zero.update(
            reduce_bucket_size=bucket_elements,
            allgather_bucket_size=bucket_elements,
            overlap_comm=True,
            contiguous_gradients=True,
        )
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum_steps,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        # loss_scale 0: dynamic loss scaling.
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "gradient_clipping": cfg.grad_clip,
        "steps_per_print": 1 << 30,  # the platform reports timing itself
        "wall_clock_breakdown": False,
    }


def wrap_deepspeed(cfg: TrialConfig, parts: EngineParts, lap: Callable[[str], object]) -> Engine:
    """``parts`` in a DeepSpeed engine (and compiled, with torch_compile); ``lap("wrap")`` when
    done."""
    import deepspeed

    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=parts.model,
        optimizer=parts.optimizer,
        config=deepspeed_config(cfg, parts.precision),
        # DeepSpeed steps it at each accumulation boundary and saves it in its checkpoints.
        lr_scheduler=lambda opt: build_scheduler(opt, cfg),
        dist_init_required=False,  # Ray Train already set up the process group
    )
    compiled = dict(parts.compiled)
    compile_deepspeed(cfg, engine, dict(parts.compile_kwargs), compiled)
    lap("wrap")
    return assemble_engine(
        parts,
        kind="deepspeed",
        model=engine,
        bare=engine.module,
        optimizer=optimizer,
        scheduler=scheduler,
        backward=engine.backward,
        step=lambda last: engine.step(),
        # DeepSpeed's bf16/fp16 modes cast the weights, not the inputs.
        inputs_dtype=parts.precision,
        compiled=compiled,
    )
