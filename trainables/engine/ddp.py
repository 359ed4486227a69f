"""The DDP engine: torch DistributedDataParallel with its knobs (buckets, static graph,
gradient views, compression hooks), autocast and a GradScaler for low precision, gradient
clipping, and the temperature clamp after each optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from trainables.config import TrialConfig
from trainables.engine.compile import compile_ddp
from trainables.engine.core import Engine, EngineParts, assemble_engine
from trainables.engine.optim import build_scheduler
from trainables.engine.precision import autocast_for

__all__ = ["optimizer_step", "scaled_backward", "wrap_ddp"]


def _ddp(cfg: TrialConfig, model: torch.nn.Module, device: torch.device):
    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=cfg.bucket_mb,
        static_graph=cfg.ddp_static_graph,
        find_unused_parameters=cfg.ddp_find_unused_parameters,
        gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view,
    )
    if cfg.ddp_comm_hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
        ddp.register_comm_hook(None, hook[cfg.ddp_comm_hook])
    return ddp


def scaled_backward(cfg: TrialConfig, scaler) -> Callable:
    """The engine's ``backward(loss)`` through a gradient scaler. The mean over the accumulated
    micro-batches: each contributes 1/grad_accum_steps."""
    return lambda loss: scaler.scale(loss / cfg.grad_accum_steps).backward()


def optimizer_step(cfg: TrialConfig, model, optimizer, scaler, scheduler) -> Callable:
    """The engine's ``step(last)``: the optimizer steps after the last micro-batch only."""
    max_log_scale = math.log(cfg.logit_scale_max)

    def step(last: bool):
        if not last:
            return
        if cfg.grad_clip:
            scaler.unscale_(optimizer)  # clip the true gradients, not the loss-scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        with torch.no_grad():  # CLIP's temperature clamp, on the parameter itself
            model.logit_scale.clamp_(min=0.0, max=max_log_scale)

    return step


def wrap_ddp(cfg: TrialConfig, parts: EngineParts, lap: Callable[[str], object]) -> Engine:
    """``parts`` wrapped in DDP (and compiled, with torch_compile); ``lap("wrap")`` when done."""
    model, optimizer, device = parts.model, parts.optimizer, parts.device
    ddp = _ddp(cfg, model, device)
    compiled = dict(parts.compiled)
    wrapped = compile_ddp(cfg, model, ddp, parts.compile_kwargs, compiled)
    lap("wrap")
    scaler = torch.amp.GradScaler(device.type, enabled=parts.precision == "fp16")
    scheduler = build_scheduler(optimizer, cfg)
    return assemble_engine(
        parts,
        kind="ddp",
        model=wrapped,
        bare=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        no_sync=ddp.no_sync,
        backward=scaled_backward(cfg, scaler),
        step=optimizer_step(cfg, model, optimizer, scaler, scheduler),
        autocast=autocast_for(parts.precision, device),
        # Low-precision weights take inputs of their dtype (autocast does not cast the conv
        # front end's input when there is no autocast, e.g. bf16 weights at precision fp32).
        inputs_dtype=parts.load_dtype,
        compiled=compiled,
    )
