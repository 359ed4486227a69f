"""build_engine: the run's model, its FLOPs count, optimizer and compile settings, wrapped by
the strategy (DDP, FSDP2 or DeepSpeed) into the Engine the loop drives."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from trainables.config import TrialConfig
from trainables.engine.compile import setup_compile
from trainables.engine.core import Engine, EngineParts
from trainables.engine.ddp import wrap_ddp
from trainables.engine.deepspeed_engine import wrap_deepspeed
from trainables.engine.fsdp2 import wrap_fsdp2
from trainables.engine.mfu import cached_flops_per_sample, flops_terms, peak_tflops
from trainables.engine.optim import build_optimizer
from trainables.engine.precision import DTYPES, resolve_load_dtype, resolve_precision
from trainables.model.extractor import use_extractor_layout
from trainables.model.pos_conv import use_pos_conv
from trainables.model.residual import residual_dtype_effective, use_residual_dtype
from trainables.model.stage1 import build_model_with_attention

__all__ = ["build_engine"]


def _set_matmul_flags(cfg: TrialConfig) -> None:
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.set_float32_matmul_precision(cfg.matmul_precision)


def _build_model(cfg: TrialConfig, device: torch.device, precision: str, load_dtype: str):
    """The bare model and its attention notes. Weights made from configs are built (and
    initialised) on the device itself: no CPU init followed by a copy. Checkpoints load on the
    CPU, then move (by the caller)."""
    on_device = not (cfg.speech_pretrained_path or cfg.text_pretrained_path)
    with torch.device(device) if on_device else contextlib.nullcontext():
        return build_model_with_attention(
            cfg.model_size,
            cfg.proj_dim,
            speech=cfg.speech_attention,
            text=cfg.text_attention,
            device=device,
            precision=precision,
            speech_path=cfg.speech_pretrained_path,
            text_path=cfg.text_pretrained_path,
            dtype=DTYPES[load_dtype],
            dropout=cfg.dropout_rate,
        )


def build_engine(
    cfg: TrialConfig, device: torch.device, *, clock=None, flops_cache: Path | None = None
) -> Engine:
    """The run's model, optimizer and wrapper. ``clock`` (a startup.StartupClock) times the
    parts; ``flops_cache``: a folder where FLOPs per sample are kept per model shape, so each
    shape is counted once, not in every run (rank 0 counts or reads, the others are sent it)."""

    def lap(name: str) -> None:
        if clock is not None:
            clock.lap(name)

    _set_matmul_flags(cfg)
    precision = resolve_precision(cfg.precision, device)
    load_dtype = resolve_load_dtype(cfg.model_load_dtype, cfg.strategy, precision)
    on_gpu = device.type == "cuda"
    torch.manual_seed(cfg.seed)  # identical init on every rank
    model, attention = _build_model(cfg, device, precision, load_dtype)
    lap("model_build")
    model = model.to(device)
    lap("to_device")
    # The forward clamps the temperature too (the only clamp under DeepSpeed, whose master
    # weights live in its optimizer).
    model.logit_scale_max = cfg.logit_scale_max
    model.sync_free_masks = cfg.padding_masks == "sync_free"
    # Counted on the bare model, before DDP or DeepSpeed wrap (and ZeRO-3 partitions) it.
    flops = cached_flops_per_sample(cfg, model, device, load_dtype, attention, flops_cache)
    terms = None
    if cfg.batching == "duration":  # steps of varying count and lengths
        terms = flops_terms(cfg, model, device, load_dtype, attention, flops_cache)
    lap("flops")
    # After the count: FLOPs are the convolutions' whatever computes them (the documented
    # formula), and the parameters the same either way.
    use_pos_conv(model.speech, cfg.pos_conv)
    extractor_norm = use_extractor_layout(model.speech, cfg.extractor_layout, cfg.extractor_norm)
    residual = residual_dtype_effective(cfg.residual_dtype, precision, cfg.strategy, load_dtype)
    if cfg.strategy == "ddp" and load_dtype == "fp32" and precision != "fp32":  # autocast
        use_residual_dtype(model, residual, device.type)
    peak = peak_tflops(device, precision)
    optimizer = build_optimizer(cfg, model.parameters(), on_gpu)
    effective = {
        "precision_effective": precision,
        "strategy_effective": cfg.strategy,
        "model_load_dtype_effective": load_dtype,
        "compile_effective": "off",
        "extractor_norm_effective": extractor_norm,
        "residual_dtype_effective": residual,
        **attention,
    }
    if cfg.residual_dtype == "bf16" and residual != "bf16":
        note = f"residual_dtype: bf16 needs precision bf16 (resolved {precision}), ran {residual}"
        effective["fallbacks"] = "; ".join(filter(None, (effective["fallbacks"], note)))
    compile_kwargs, compiled = setup_compile(cfg, on_gpu, effective)
    parts = EngineParts(
        model=model,
        optimizer=optimizer,
        device=device,
        precision=precision,
        load_dtype=load_dtype,
        effective=effective,
        flops_per_sample=flops,
        flops_terms=terms,
        peak_tflops=peak,
        compile_kwargs=compile_kwargs,
        compiled=compiled,
    )
    wraps = {"deepspeed": wrap_deepspeed, "fsdp2": wrap_fsdp2}
    return wraps.get(cfg.strategy, wrap_ddp)(cfg, parts, lap)
