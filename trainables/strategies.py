"""Distributed strategies behind one small interface: DDP or a DeepSpeed ZeRO engine.

The loop only calls ``engine(batch) -> (speech, text, scale)``, ``engine.backward(loss)`` and
``engine.step()``; precision (autocast, loss scaling) lives here too, because DDP and DeepSpeed
do it differently.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from trainables.config import TrialConfig
from trainables.mfu import flops_per_sample, peak_tflops
from trainables.model import build_model_with_attention

__all__ = [
    "Engine",
    "build_engine",
    "deepspeed_config",
    "lr_factor",
    "resolve_load_dtype",
    "resolve_precision",
]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(requested: str, device: torch.device) -> str:
    """``auto``: bf16 on compute capability >= 8.0, fp16 below, fp32 on CPU."""
    if requested != "auto":
        return requested
    if device.type != "cuda":
        return "fp32"
    major, _ = torch.cuda.get_device_capability(device)
    return "bf16" if major >= 8 else "fp16"


def resolve_load_dtype(requested: str, strategy: str, precision: str) -> str:
    """``auto``: the precision's dtype under DeepSpeed (it casts the weights to it anyway and
    keeps fp32 master copies in its optimizer), fp32 under DDP (autocast computes in low
    precision from fp32 master weights)."""
    if requested == "auto":
        return precision if strategy == "deepspeed" else "fp32"
    if requested != "fp32" and requested != precision:
        raise ValueError(
            f"model_load_dtype: {requested} weights, but precision resolved to {precision} on "
            f"this device; set precision={requested}, or model_load_dtype auto or fp32"
        )
    return requested


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


def lr_factor(step: int, cfg: TrialConfig) -> float:
    """Learning-rate multiplier after ``step`` optimizer steps: linear warm-up over
    warmup_steps, then constant or a cosine decay to min_lr_ratio at max_steps."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class _LrFactor:
    """``lr_factor`` bound to a config: a picklable object, so LambdaLR's state_dict keeps it."""

    def __init__(self, cfg: TrialConfig):
        self.cfg = cfg

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.cfg)


def _scheduler(optimizer, cfg: TrialConfig):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _LrFactor(cfg))


@dataclass(kw_only=True)
class Engine:
    """What the loop drives. ``effective`` records what was actually used."""

    model: torch.nn.Module
    optimizer: Any
    effective: dict[str, str]
    kind: str = "ddp"  # ddp or deepspeed
    bare: torch.nn.Module | None = None  # the unwrapped Stage1Model (state, export)
    scheduler: Any = None
    scaler: Any = None
    _no_sync: Any = None  # DDP's no_sync: accumulation micro-batches skip the all-reduce
    flops_per_sample: float = math.nan
    peak_tflops: float = math.nan
    _backward: Any = None
    _step: Any = None
    _autocast: Any = contextlib.nullcontext
    _dtype: torch.dtype | None = None  # cast floating inputs to this (low-precision weights)
    # With torch_compile: the exceptions that mean "compilation failed", and a function that
    # returns the eager module to use instead.
    _compile_errors: tuple[type[BaseException], ...] = ()
    _to_eager: Any = None
    _calls: int = 0

    def __call__(self, batch: dict[str, torch.Tensor]):
        if self._dtype is not None:
            batch = {k: v.to(self._dtype) if v.is_floating_point() else v for k, v in batch.items()}
        self._calls += 1
        if self._to_eager is None:
            with self._autocast():
                return self.model(**batch)
        try:
            # Compilation is lazy: it happens here, at the first call and at every recompile
            # (a new input shape), so a compile error can come at any step.
            with self._autocast():
                return self.model(**batch)
        except self._compile_errors as exc:
            self._fall_back(exc)
        with self._autocast():
            return self.model(**batch)

    def _fall_back(self, exc: BaseException) -> None:
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
        note = (
            f"compile: {type(exc).__name__}: {first.strip()[:160]}; eager from step {self._calls}"
        )
        self.model = self._to_eager()
        self._to_eager = None
        self.effective["compile_effective"] = "eager (fallback)"
        self.effective["fallbacks"] = "; ".join(filter(None, [self.effective["fallbacks"], note]))

    def accumulating(self, last: bool):
        """Around the forward and backward of one micro-batch: all but the last micro-batch of
        an optimizer step skip DDP's gradient all-reduce (DeepSpeed decides this itself)."""
        if last or self._no_sync is None:
            return contextlib.nullcontext()
        return self._no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        self._backward(loss)

    def step(self, last: bool = True) -> None:
        """After each micro-batch's backward; the optimizer steps on the last one (DeepSpeed
        counts micro-batches itself and steps at its accumulation boundary)."""
        self._step(last)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0]) if self.scheduler is not None else math.nan

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)


def probe_batch(
    cfg: TrialConfig, device: torch.device, samples: int = 2, dtype: torch.dtype = torch.float32
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
        "audio": torch.zeros(samples, n, device=device, dtype=dtype),
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


def _compile_kwargs(cfg: TrialConfig) -> dict[str, Any]:
    return {
        "backend": cfg.compile_backend,
        "mode": None if cfg.compile_mode == "default" else cfg.compile_mode,
        "dynamic": None if cfg.compile_dynamic == "auto" else cfg.compile_dynamic,
    }


def _compile_errors() -> tuple[type[BaseException], ...]:
    # Every dynamo and inductor failure (BackendCompilerFailed, InductorError, ...) derives from
    # TorchDynamoException; errors of the model itself (shapes, out of memory) do not.
    import torch._dynamo.exc

    return (torch._dynamo.exc.TorchDynamoException,)


def build_engine(cfg: TrialConfig, device: torch.device) -> Engine:
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    precision = resolve_precision(cfg.precision, device)
    load_dtype = resolve_load_dtype(cfg.model_load_dtype, cfg.strategy, precision)
    on_gpu = device.type == "cuda"
    torch.manual_seed(cfg.seed)  # identical init on every rank
    model, attention = build_model_with_attention(
        cfg.model_size,
        cfg.proj_dim,
        speech=cfg.speech_attention,
        text=cfg.text_attention,
        device=device,
        precision=precision,
        speech_path=cfg.speech_pretrained_path,
        text_path=cfg.text_pretrained_path,
        dtype=_DTYPES[load_dtype],
    )
    model = model.to(device)
    # The forward clamps the temperature too (the only clamp under DeepSpeed, whose master
    # weights live in its optimizer).
    model.logit_scale_max = cfg.logit_scale_max
    # Counted on the bare model, before DDP or DeepSpeed wrap (and ZeRO-3 partitions) it.
    flops = flops_per_sample(model, probe_batch(cfg, device, dtype=_DTYPES[load_dtype]))
    peak = peak_tflops(device, precision)
    optimizer = _optimizer(cfg, model.parameters(), on_gpu)
    effective = {
        "precision_effective": precision,
        "strategy_effective": cfg.strategy,
        "model_load_dtype_effective": load_dtype,
        "compile_effective": "off",
        **attention,
    }
    compiled: dict[str, Any] = {}
    if cfg.torch_compile:
        # transformers calls an lru_cache'd helper inside forward; dynamo warns once per process
        # that it traces through the cache, which is harmless here.
        warnings.filterwarnings(
            "ignore", message="Dynamo detected a call to a `functools.lru_cache`"
        )
        kwargs = _compile_kwargs(cfg)
        effective["compile_effective"] = f"{cfg.compile_backend}/{cfg.compile_mode}"
        compiled["_compile_errors"] = _compile_errors()
    if cfg.strategy == "deepspeed":
        import deepspeed

        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=deepspeed_config(cfg, precision),
            # DeepSpeed steps it at each accumulation boundary and saves it in its checkpoints.
            lr_scheduler=lambda opt: _scheduler(opt, cfg),
            dist_init_required=False,  # Ray Train already set up the process group
        )
        if cfg.torch_compile:
            backend = kwargs.pop("backend")
            engine.compile(backend=backend, compile_kwargs=kwargs)

            def to_eager():
                # engine.compile is nn.Module.compile of the wrapped module, which keeps the
                # compiled call in _compiled_call_impl; without it the module runs eagerly.
                engine.module._compiled_call_impl = None
                return engine

            compiled["_to_eager"] = to_eager
        # DeepSpeed's bf16/fp16 modes cast the weights, not the inputs.
        dtype = None if precision == "fp32" else _DTYPES[precision]
        return Engine(
            model=engine,
            optimizer=optimizer,
            effective=effective,
            kind="deepspeed",
            bare=engine.module,
            scheduler=scheduler,
            flops_per_sample=flops,
            peak_tflops=peak,
            _backward=engine.backward,
            _step=lambda last: engine.step(),
            _dtype=dtype,
            **compiled,
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
    wrapped: torch.nn.Module = ddp
    if cfg.torch_compile:
        # The DDP module, not the inner one: dynamo's DDPOptimizer then splits the graph at
        # bucket boundaries, so gradient all-reduce still overlaps the backward pass.
        wrapped = torch.compile(ddp, **kwargs)
        compiled["_to_eager"] = lambda: ddp
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    scheduler = _scheduler(optimizer, cfg)
    dtype = _DTYPES[precision]
    max_log_scale = math.log(cfg.logit_scale_max)

    def autocast():
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

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

    return Engine(
        model=wrapped,
        optimizer=optimizer,
        effective=effective,
        flops_per_sample=flops,
        peak_tflops=peak,
        kind="ddp",
        bare=model,
        scheduler=scheduler,
        scaler=scaler,
        _no_sync=ddp.no_sync,
        # The mean over the accumulated micro-batches: each contributes 1/grad_accum_steps.
        _backward=lambda loss: scaler.scale(loss / cfg.grad_accum_steps).backward(),
        _step=step,
        _autocast=autocast,
        # Low-precision weights take inputs of their dtype (autocast does not cast the conv
        # front end's input when there is no autocast, e.g. bf16 weights at precision fp32).
        _dtype=None if load_dtype == "fp32" else _DTYPES[load_dtype],
        **compiled,
    )
