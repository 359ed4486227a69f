"""Distributed strategies behind one small interface: DDP or a DeepSpeed ZeRO engine.

The loop only calls ``engine(batch) -> (speech, text, scale)``, ``engine.backward(loss)`` and
``engine.step()``; precision (autocast, loss scaling) lives here too, because DDP and DeepSpeed
do it differently.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from trainables.config import TrialConfig
from trainables.mfu import flops_per_sample, peak_tflops
from trainables.model import build_model_with_attention

__all__ = ["Engine", "build_engine", "deepspeed_config", "resolve_precision"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(requested: str, device: torch.device) -> str:
    """``auto``: bf16 on compute capability >= 8.0, fp16 below, fp32 on CPU."""
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "fp32"
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"


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
        "steps_per_print": 1 << 30,  # the platform reports timing itself
        "wall_clock_breakdown": False,
    }


@dataclass(kw_only=True)
class Engine:
    """What the loop drives. ``effective`` records what was actually used."""

    model: torch.nn.Module
    optimizer: Any
    effective: dict[str, str]
    flops_per_sample: float = math.nan
    peak_tflops: float = math.nan
    _backward: Any = None
    _step: Any = None
    _autocast: Any = contextlib.nullcontext
    _dtype: torch.dtype | None = None  # cast floating inputs to this (DeepSpeed bf16/fp16)

    def __call__(self, batch: dict[str, torch.Tensor]):
        if self._dtype is not None:
            batch = {k: v.to(self._dtype) if v.is_floating_point() else v for k, v in batch.items()}
        with self._autocast():
            return self.model(**batch)

    def backward(self, loss: torch.Tensor) -> None:
        self._backward(loss)

    def step(self) -> None:
        self._step()


def probe_batch(
    cfg: TrialConfig, device: torch.device, samples: int = 2
) -> dict[str, torch.Tensor]:
    """A small batch of the run's mean crop length and its longest transcripts, for counting."""
    if cfg.dataset == "synthetic":
        seconds = cfg.audio_s
    elif cfg.crop_policy == "fixed_slice":
        seconds = cfg.fixed_slice_s
    else:
        seconds = (cfg.min_audio_s + cfg.max_audio_s) / 2
    n = int(seconds * 16_000)
    return {
        "audio": torch.zeros(samples, n, device=device),
        "audio_mask": torch.ones(samples, n, dtype=torch.long, device=device),
        "input_ids": torch.full((samples, cfg.text_tokens), 5, dtype=torch.long, device=device),
        "text_mask": torch.ones(samples, cfg.text_tokens, dtype=torch.long, device=device),
    }


def _optimizer(cfg: TrialConfig, params, on_gpu: bool):
    if cfg.optimizer == "deepspeed_fused_adam":
        if shutil.which("ninja") is None:
            raise RuntimeError(
                "optimizer deepspeed_fused_adam needs ninja to compile; ninja is missing"
            )
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_w_mode=True)
    # torch's fused AdamW: no CUDA extension is compiled at start-up.
    return torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True if on_gpu else None
    )


def build_engine(cfg: TrialConfig, device: torch.device) -> Engine:
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    precision = resolve_precision(cfg.precision, device)
    on_gpu = device.type == "cuda"
    torch.manual_seed(cfg.seed)  # identical init on every rank
    model, attention = build_model_with_attention(
        cfg.model_size,
        cfg.proj_dim,
        speech=cfg.speech_attention,
        text=cfg.text_attention,
        device=device,
        precision=precision,
    )
    model = model.to(device)
    # Counted on the bare model, before DDP or DeepSpeed wrap (and ZeRO-3 partitions) it.
    flops = flops_per_sample(model, probe_batch(cfg, device))
    peak = peak_tflops(device, precision)
    optimizer = _optimizer(cfg, model.parameters(), on_gpu)
    effective = {"precision_effective": precision, "strategy_effective": cfg.strategy, **attention}
    if cfg.strategy == "deepspeed":
        import deepspeed

        engine, optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=deepspeed_config(cfg, precision),
            dist_init_required=False,  # Ray Train already set up the process group
        )
        # DeepSpeed's bf16/fp16 modes cast the weights, not the inputs.
        dtype = None if precision == "fp32" else _DTYPES[precision]
        return Engine(
            model=engine,
            optimizer=optimizer,
            effective=effective,
            flops_per_sample=flops,
            peak_tflops=peak,
            _backward=engine.backward,
            _step=engine.step,
            _dtype=dtype,
        )

    ddp = DistributedDataParallel(
        model,
        device_ids=[device.index] if on_gpu else None,
        bucket_cap_mb=cfg.bucket_mb,
        static_graph=cfg.ddp_static_graph,
        find_unused_parameters=cfg.ddp_find_unused_parameters,
        gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view,
    )
    if cfg.ddp_comm_hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
        ddp.register_comm_hook(None, hook[cfg.ddp_comm_hook])
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    dtype = _DTYPES[precision]

    def autocast():
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    def step():
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return Engine(
        model=ddp,
        optimizer=optimizer,
        effective=effective,
        flops_per_sample=flops,
        peak_tflops=peak,
        _backward=lambda loss: scaler.scale(loss).backward(),
        _step=step,
        _autocast=autocast,
    )
