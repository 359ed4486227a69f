"""Distributed strategies behind one small interface: DDP or a DeepSpeed ZeRO engine.

The loop only calls ``engine(batch) -> (speech, text, scale)``, ``engine.backward(loss)`` and
``engine.step()``; precision (autocast, loss scaling) lives here too, because DDP and DeepSpeed
do it differently.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
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
    _cudagraphs: bool = False  # compile_mode reduce-overhead on a GPU: mark each new step

    def __call__(self, batch: dict[str, torch.Tensor]):
        if self._dtype is not None:
            batch = {k: v.to(self._dtype) if v.is_floating_point() else v for k, v in batch.items()}
        self._calls += 1
        if self._cudagraphs and self._to_eager is not None:
            # A new iteration: the CUDA graphs may overwrite the previous step's outputs.
            torch.compiler.cudagraph_mark_step_begin()
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

    def warm_up(self, cfg: TrialConfig) -> float:
        """compile_warmup: compile (and with reduce-overhead, record the CUDA graphs of) every
        static shape of the run before its first timed step, in a forward and backward pass of
        a made-up batch of each shape; no optimizer step, gradients cleared, RNG states put
        back (dropout masks of the real steps are unchanged). Returns the seconds it took
        (compile_s; 0 when nothing was compiled ahead). DDP only: DeepSpeed counts its
        micro-steps and would take the pass as one."""
        shapes = cfg.static_shapes
        if not (
            cfg.compile_warmup and shapes and self._to_eager is not None and self.kind == "ddp"
        ):
            return 0.0
        from trainables.model import contrastive_loss

        device = next(self.bare.parameters()).device
        passes = 3 if self._cudagraphs else 1  # cudagraph trees: warm-up runs, then recording
        t0 = time.perf_counter()
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            for audio_n, text_n in shapes:
                for _ in range(passes):
                    batch = shape_batch(cfg.micro_batch, audio_n, text_n, device)
                    try:
                        speech, text, scale = self(batch)
                        if self._to_eager is None:  # fell back to eager: nothing to warm up
                            break
                        loss = contrastive_loss(
                            speech.float(), text.float(), scale.float(), scope=cfg.contrastive_scope
                        )
                        self.backward(loss)  # the backward graph compiles at its first call
                    except self._compile_errors as exc:
                        self._fall_back(exc)
                    self.bare.zero_grad(set_to_none=True)
                    if self._to_eager is None:
                        break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

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


def shape_batch(
    rows: int, audio_n: int, text_n: int, device, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """A made-up batch of one shape, as the loader gives it (silent audio, unpadded): for
    counting FLOPs and for the compile warm-up, where only shapes and dtypes matter."""
    return {
        "audio": torch.zeros(rows, audio_n, device=device, dtype=dtype),
        "audio_mask": torch.ones(rows, audio_n, dtype=torch.long, device=device),
        "input_ids": torch.full((rows, text_n), 5, dtype=torch.long, device=device),
        "text_mask": torch.ones(rows, text_n, dtype=torch.long, device=device),
    }


def probe_shape(cfg: TrialConfig) -> tuple[int, int]:
    """(audio samples, text tokens) of the run's mean crop length and longest transcripts."""
    if cfg.dataset == "synthetic":
        seconds = cfg.audio_s
    elif cfg.crop_policy == "fixed_slice":
        seconds = cfg.fixed_slice_s
    else:
        seconds = (cfg.min_audio_s + cfg.max_audio_s) / 2
    return int(seconds * 16_000), cfg.text_tokens


def probe_batch(
    cfg: TrialConfig, device: torch.device, samples: int = 2, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """A small batch of the run's probe shape, for counting."""
    return shape_batch(samples, *probe_shape(cfg), device, dtype)


def _optimizer(cfg: TrialConfig, params, on_gpu: bool):
    if cfg.optimizer == "deepspeed_fused_adam":
        if shutil.which("ninja") is None:
            raise RuntimeError(
                "optimizer deepspeed_fused_adam needs ninja to compile; ninja is missing"
            )
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_w_mode=True)
    # torch's fused AdamW (no CUDA extension is compiled at start-up), or its foreach path.
    if cfg.optimizer == "adamw_torch_foreach":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    return torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True if on_gpu else None
    )


def _compile_kwargs(cfg: TrialConfig) -> dict[str, Any]:
    dynamic = None if cfg.compile_dynamic == "auto" else cfg.compile_dynamic
    if cfg.compile_dynamic == "auto" and cfg.crop_buckets:
        dynamic = False  # a few known shapes: each compiled once, statically
    return {
        "backend": cfg.compile_backend,
        "mode": None if cfg.compile_mode == "default" else cfg.compile_mode,
        "dynamic": dynamic,
    }


def compile_regions(model: torch.nn.Module) -> list[torch.nn.Module]:
    """compile_scope layers: the modules compiled one by one (regional compilation): every
    transformer layer of both encoders and the wav2vec2 convolutional feature encoder. The
    layers of one encoder are instances of one class with one code object, so dynamo compiles
    their forward once per shape and reuses it for all of them."""
    speech, text = model.speech, model.text
    regions: list[torch.nn.Module] = [speech.feature_extractor]
    regions += list(speech.encoder.layers)
    regions += list(text.encoder.layer)
    return regions


def _compile_layers(model: torch.nn.Module, kwargs: dict[str, Any], wrapper: torch.nn.Module):
    """Compile each region of ``model`` in place (nn.Module.compile); returns the engine's
    ``_to_eager``: undo it and run ``wrapper`` (DDP or the DeepSpeed engine) as it is."""
    regions = compile_regions(model)
    for region in regions:
        region.compile(**kwargs)

    def to_eager() -> torch.nn.Module:
        for region in regions:
            region._compiled_call_impl = None
        return wrapper

    return to_eager


def _allow_recompiles(cfg: TrialConfig) -> None:
    """Dynamo gives up recompiling a frame after 8 shapes and runs it eagerly from then on; a
    run with more static shapes than that keeps every one compiled."""
    import torch._dynamo.config as dynamo_config

    shapes = len(cfg.static_shapes or ())
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), 2 * shapes + 8))
            break


def _compile_errors() -> tuple[type[BaseException], ...]:
    # Every dynamo and inductor failure (BackendCompilerFailed, InductorError, ...) derives from
    # TorchDynamoException; errors of the model itself (shapes, out of memory) do not.
    import torch._dynamo.exc

    return (torch._dynamo.exc.TorchDynamoException,)


def _lap(clock, name: str) -> None:
    if clock is not None:
        clock.lap(name)


def _flops(cfg, model, device, load_dtype: str, attention: dict, cache: Path | None) -> float:
    """FLOPs per sample of the run's model shape: from ``cache`` when a run of the same shape
    counted them, else counted; rank 0 only, sent to the others (no rank counts twice)."""
    import hashlib
    import json

    import transformers

    audio_n, text_n = probe_shape(cfg)
    key = json.dumps(
        [
            cfg.model_size,
            cfg.proj_dim,
            cfg.speech_pretrained_path,
            cfg.text_pretrained_path,
            load_dtype,
            attention.get("speech_attention_effective"),
            attention.get("text_attention_effective"),
            [2, audio_n],
            [2, text_n],
            torch.__version__,
            transformers.__version__,
        ]
    )
    path = None
    if cache is not None:
        path = Path(cache) / f"flops-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    value = [math.nan]
    if rank == 0:
        try:
            value[0] = float(json.loads(path.read_text())["flops_per_sample"]) if path else None
        except (OSError, ValueError, KeyError):
            value[0] = None
        if value[0] is None:
            # Its forward draws dropout masks: the RNG goes on as if it had not run.
            devices = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                value[0] = flops_per_sample(
                    model, probe_batch(cfg, device, dtype=_DTYPES[load_dtype])
                )
            if path is not None:
                from stage1_common.fileio import write_json

                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_json(path, {"key": key, "flops_per_sample": value[0]})
                except OSError:
                    pass  # a read-only output root: count again next time
    if distributed and torch.distributed.get_world_size() > 1:
        torch.distributed.broadcast_object_list(value, src=0)
    return float(value[0])


def build_engine(
    cfg: TrialConfig, device: torch.device, *, clock=None, flops_cache: Path | None = None
) -> Engine:
    """The run's model, optimizer and wrapper. ``clock`` (a loop.StartupClock) times the
    parts; ``flops_cache``: a folder where FLOPs per sample are kept per model shape, so each
    shape is counted once, not in every run (rank 0 counts or reads, the others are sent it)."""
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    precision = resolve_precision(cfg.precision, device)
    load_dtype = resolve_load_dtype(cfg.model_load_dtype, cfg.strategy, precision)
    on_gpu = device.type == "cuda"
    torch.manual_seed(cfg.seed)  # identical init on every rank
    # Weights made from configs are built (and initialised) on the device itself: no CPU
    # init followed by a copy. Checkpoints load on the CPU, then move.
    on_device = not (cfg.speech_pretrained_path or cfg.text_pretrained_path)
    with torch.device(device) if on_device else contextlib.nullcontext():
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
    _lap(clock, "model_build")
    model = model.to(device)
    _lap(clock, "to_device")
    # The forward clamps the temperature too (the only clamp under DeepSpeed, whose master
    # weights live in its optimizer).
    model.logit_scale_max = cfg.logit_scale_max
    # Counted on the bare model, before DDP or DeepSpeed wrap (and ZeRO-3 partitions) it.
    flops = _flops(cfg, model, device, load_dtype, attention, flops_cache)
    _lap(clock, "flops")
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
        _allow_recompiles(cfg)
        effective["compile_effective"] = f"{cfg.compile_backend}/{cfg.compile_mode}"
        if cfg.compile_scope == "layers":
            effective["compile_effective"] += "/layers"
        compiled["_compile_errors"] = _compile_errors()
        compiled["_cudagraphs"] = cfg.compile_mode == "reduce-overhead" and on_gpu
        if cfg.compile_mode == "reduce-overhead" and not on_gpu:
            note = "compile: reduce-overhead: no CUDA graphs off a GPU"
            effective["fallbacks"] = "; ".join(filter(None, [effective["fallbacks"], note]))
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
        if cfg.torch_compile and cfg.compile_scope == "layers":
            compiled["_to_eager"] = _compile_layers(engine.module, kwargs, engine)
        elif cfg.torch_compile:
            backend = kwargs.pop("backend")
            engine.compile(backend=backend, compile_kwargs=kwargs)

            def to_eager():
                # engine.compile is nn.Module.compile of the wrapped module, which keeps the
                # compiled call in _compiled_call_impl; without it the module runs eagerly.
                engine.module._compiled_call_impl = None
                return engine

            compiled["_to_eager"] = to_eager
        _lap(clock, "wrap")
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
    if cfg.torch_compile and cfg.compile_scope == "layers":
        compiled["_to_eager"] = _compile_layers(model, kwargs, ddp)
    elif cfg.torch_compile:
        # The DDP module, not the inner one: dynamo's DDPOptimizer then splits the graph at
        # bucket boundaries, so gradient all-reduce still overlaps the backward pass.
        wrapped = torch.compile(ddp, **kwargs)
        compiled["_to_eager"] = lambda: ddp
    _lap(clock, "wrap")
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
