"""The engine the loop drives, whatever the strategy: ``engine(batch) -> (speech, text,
scale)``, ``engine.backward(loss)``, ``engine.step(last)``. DDP, FSDP2 and DeepSpeed
(engine.ddp, engine.fsdp2, engine.deepspeed_engine) fill it, through ``assemble_engine``, with
their own backward, step and precision handling; a compile error at any call falls back to
eager here, recorded in ``effective``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainables.config import TrialConfig
from trainables.engine.compile import CompileTime, warm_up
from trainables.engine.precision import DTYPES

__all__ = ["Engine", "EngineParts", "assemble_engine"]


@dataclass(kw_only=True)
class Engine:
    """What the loop drives. ``effective`` records what was actually used."""

    model: torch.nn.Module
    optimizer: Any
    effective: dict[str, str]
    kind: str = "ddp"  # ddp, fsdp2 or deepspeed
    bare: torch.nn.Module | None = None  # the unwrapped Stage1Model (state, export)
    scheduler: Any = None
    scaler: Any = None
    _no_sync: Any = None  # DDP's no_sync: accumulation micro-batches skip the all-reduce
    flops_per_sample: float = math.nan
    # batching duration: FLOPs per sample, per audio second and per squared audio second
    # (engine.mfu.flops_terms), for steps of varying count and lengths; None otherwise.
    flops_terms: tuple[float, float, float] | None = None
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
            self.fall_back(exc)
        with self._autocast():
            return self.model(**batch)

    @property
    def compiling(self) -> bool:
        """Whether a compiled module runs (torch_compile on, no fallback to eager yet)."""
        return self._to_eager is not None

    @property
    def compile_errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions that mean compilation failed (empty without torch_compile)."""
        return self._compile_errors

    @property
    def cudagraphs(self) -> bool:
        """Whether each step runs CUDA graphs (compile_mode reduce-overhead on a GPU)."""
        return self._cudagraphs

    def fall_back(self, exc: BaseException) -> None:
        """Run eagerly from now on after the compile error ``exc``, noted in ``effective``."""
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
        note = (
            f"compile: {type(exc).__name__}: {first.strip()[:160]}; eager from step {self._calls}"
        )
        self.model = self._to_eager()
        self._to_eager = None
        self.effective["compile_effective"] = "eager (fallback)"
        self.effective["fallbacks"] = "; ".join(filter(None, [self.effective["fallbacks"], note]))

    def warm_up(
        self, cfg: TrialConfig, shapes: list[tuple[int, int, int]] | None = None
    ) -> CompileTime:
        """compile_warmup: every static shape compiled before the first timed step (see
        engine.compile.warm_up; ``shapes``: the loader's, when the config alone does not know
        them); returns the seconds it took (compile_s) and where they went (compile_parts)."""
        return warm_up(self, cfg, shapes)

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


@dataclass(kw_only=True)
class EngineParts:
    """What build_engine made before a strategy wraps it (engine.ddp, engine.deepspeed_engine)."""

    model: torch.nn.Module  # the bare Stage1Model, on its device
    optimizer: Any
    device: torch.device
    precision: str  # resolved: fp32, bf16 or fp16
    load_dtype: str  # resolved: the dtype the weights were built in
    effective: dict[str, str]
    flops_per_sample: float
    peak_tflops: float
    compile_kwargs: dict[str, Any]  # torch.compile's arguments (empty without torch_compile)
    compiled: dict[str, Any]  # the Engine fields of torch_compile (engine.compile.setup_compile)
    flops_terms: tuple[float, float, float] | None = None  # batching duration (Engine's)


def assemble_engine(
    parts: EngineParts,
    *,
    kind: str,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    backward: Callable[[torch.Tensor], None],
    step: Callable[[bool], None],
    inputs_dtype: str,
    compiled: dict[str, Any],
    bare: torch.nn.Module | None = None,
    scaler: Any = None,
    no_sync: Any = None,
    autocast: Any = contextlib.nullcontext,
) -> Engine:
    """The Engine of a strategy: what build_engine made (``parts``: the effective settings,
    FLOPs per sample, peak) and what the strategy made of it. ``model`` is what the loop calls
    (``bare`` the unwrapped Stage1Model, ``model`` itself by default); ``inputs_dtype`` the
    precision name floating inputs are cast to (fp32: left as they are); ``compiled`` the Engine
    fields of torch_compile (engine.compile)."""
    return Engine(
        model=model,
        optimizer=optimizer,
        effective=parts.effective,
        kind=kind,
        bare=model if bare is None else bare,
        scheduler=scheduler,
        scaler=scaler,
        _no_sync=no_sync,
        flops_per_sample=parts.flops_per_sample,
        flops_terms=parts.flops_terms,
        peak_tflops=parts.peak_tflops,
        _backward=backward,
        _step=step,
        _autocast=autocast,
        _dtype=None if inputs_dtype == "fp32" else DTYPES[inputs_dtype],
        **compiled,
    )
