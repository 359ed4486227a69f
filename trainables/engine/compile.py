"""torch.compile of a run: the whole wrapped model or its regions (each encoder layer and the
wav2vec2 feature encoder), the settings that go with it, and the warm-up that compiles every
known shape before the first timed step. A compile error falls back to eager (engine.core)."""

from __future__ import annotations

import gc
import itertools
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import torch

from trainables.config import TrialConfig
from trainables.data.durations import duration_bins
from trainables.engine.shapes import shape_batch
from trainables.model.padding import padding_changes_code
from trainables.model.stage1 import contrastive_loss
from trainables.observe.gc_control import collector_paused

__all__ = [
    "CompileTime",
    "cache_counts",
    "compile_ddp",
    "compile_deepspeed",
    "compile_regions",
    "setup_compile",
    "use_compile_cache",
    "warm_up",
]


# A user's own cache variables, as the process started (before inductor sets its default).
_USER_CACHE_VARS = {
    v: os.environ.get(v, "") for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
}


def use_compile_cache(cache_dir: Path | None, *, explicit: bool = False) -> None:
    """Inductor's FX-graph and AOTAutograd caches and Triton's kernels under the machine's
    cache folder (stage1_common/machine_cache.py: ``inductor/``, ``triton/``), shared by every
    run, resident group, sweep and final training on the machine: a shape compiled once is not
    compiled cold again. Set for each run (a resident worker serves runs of other folders). A
    user's own TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR wins over the default folder, not
    over the ``compile_cache_dir`` key (``explicit``): a process whose inductor set its own
    default before (it writes the variable when first asked) cannot move a folder asked for
    by name. The counters of ``cache_counts`` start from zero."""
    from torch._dynamo.utils import counters

    if cache_dir is not None:
        for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
            if explicit or not _USER_CACHE_VARS[var]:
                os.environ[var] = str(Path(cache_dir) / sub)
    for group in ("inductor", "aot_autograd"):
        counters[group].clear()
    _BYPASS.install()
    _BYPASS.reasons.clear()


class _BypassReasons(logging.Filter):
    """Why AOTAutograd's cache kept a graph out (its INFO line "Bypassing autograd cache due
    to: ..."), for the manifest's ``compile_cache``. A filter of that logger, asked for its
    INFO lines: it keeps the reasons and lets through only what the logger passed before, so
    nothing new reaches the console."""

    LOGGER = "torch._functorch._aot_autograd.autograd_cache"

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []
        self.level: int | None = None  # the logger's own, before install

    def install(self) -> None:
        if self.level is not None:
            return
        logger = logging.getLogger(self.LOGGER)
        self.level = logger.getEffectiveLevel()
        logger.setLevel(min(self.level, logging.INFO))
        logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Bypassing autograd cache due to:"):
            self.reasons.append(message.split(":", 1)[1].strip().splitlines()[0])
        return record.levelno >= (self.level or 0)


_BYPASS = _BypassReasons()


def cache_counts() -> str:
    """What the compile caches saved since ``use_compile_cache``: graphs found in (hit) and
    compiled anew for (miss) inductor's FX-graph cache, and those found in, compiled anew for
    and kept out of (bypass: a graph AOTAutograd cannot cache, traced again in every process;
    the first reason in brackets) the AOTAutograd cache (the manifest's ``compile_cache``); ''
    when nothing was compiled."""
    from torch._dynamo.utils import counters

    fx, aot = counters["inductor"], counters["aot_autograd"]
    seen = (
        fx["fxgraph_cache_hit"],
        fx["fxgraph_cache_miss"],
        aot["autograd_cache_hit"],
        aot["autograd_cache_miss"],
        aot["autograd_cache_bypass"],
    )
    if not any(seen):
        return ""
    text = "fxgraph hit={} miss={} aot_autograd hit={} miss={} bypass={}".format(*seen)
    if _BYPASS.reasons:  # the first reason; the others are most often the same
        text += f" ({_BYPASS.reasons[0][:160]})"
    return text


def _compile_kwargs(cfg: TrialConfig) -> dict[str, Any]:
    dynamic = None if cfg.compile_dynamic == "auto" else cfg.compile_dynamic
    if cfg.compile_dynamic == "auto" and (cfg.crop_buckets or cfg.batching == "duration"):
        dynamic = False  # a few known shapes: each compiled once, statically
    return {
        "backend": cfg.compile_backend,
        "mode": None if cfg.compile_mode == "default" else cfg.compile_mode,
        "dynamic": dynamic,
    }


def _allow_recompiles(cfg: TrialConfig) -> None:
    """Dynamo gives up recompiling a frame after 8 shapes and runs it eagerly from then on; a
    run with more static shapes than that keeps every one compiled."""
    import torch._dynamo.config as dynamo_config

    shapes = len(cfg.static_shapes or ())
    if cfg.batching == "duration":  # one or two row counts per duration bin
        shapes = 2 * len(duration_bins(cfg).edges)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), 2 * shapes + 8))
            break


def _compile_errors() -> tuple[type[BaseException], ...]:
    # Every dynamo and inductor failure (BackendCompilerFailed, InductorError, ...) derives from
    # TorchDynamoException; errors of the model itself (shapes, out of memory) do not.
    import torch._dynamo.exc

    return (torch._dynamo.exc.TorchDynamoException,)


def setup_compile(
    cfg: TrialConfig, on_gpu: bool, effective: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """With torch_compile: the torch.compile arguments and the Engine fields that go with
    them (its compile errors, CUDA graphs), and ``compile_effective`` (and a fallback note) in
    ``effective``. Without: two empty dicts."""
    if not cfg.torch_compile:
        return {}, {}
    # transformers calls an lru_cache'd helper inside forward; dynamo warns once per process
    # that it traces through the cache, which is harmless here.
    warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
    kwargs = _compile_kwargs(cfg)
    _allow_recompiles(cfg)
    effective["compile_effective"] = f"{cfg.compile_backend}/{cfg.compile_mode}"
    if cfg.compile_scope == "layers":
        effective["compile_effective"] += "/layers"
    from trainables.engine.linear_fusion import set_linear_fusion  # imports inductor's config

    set_linear_fusion(cfg.compile_fuse_linears)
    compiled: dict[str, Any] = {
        "_compile_errors": _compile_errors(),
        "_cudagraphs": cfg.compile_mode == "reduce-overhead" and on_gpu,
    }
    if cfg.compile_mode == "reduce-overhead" and not on_gpu:
        note = "compile: reduce-overhead: no CUDA graphs off a GPU"
        effective["fallbacks"] = "; ".join(filter(None, [effective["fallbacks"], note]))
    return kwargs, compiled


def compile_regions(model: torch.nn.Module, pos_conv: bool = False) -> list[torch.nn.Module]:
    """compile_scope layers: the modules compiled one by one (regional compilation): every
    transformer layer of both encoders and the wav2vec2 convolutional feature encoder, and
    with ``pos_conv`` (the compile_pos_conv key) its positional convolution. The layers of one
    encoder are instances of one class with one code object, so dynamo compiles their forward
    once per shape and reuses it for all of them."""
    speech, text = model.speech, model.text
    regions: list[torch.nn.Module] = [speech.feature_extractor]
    if pos_conv:
        regions.append(speech.encoder.pos_conv_embed)
    regions += list(speech.encoder.layers)
    regions += list(text.encoder.layer)
    return regions


def _compile_layers(
    cfg: TrialConfig, model: torch.nn.Module, kwargs: dict[str, Any], wrapper: torch.nn.Module
):
    """Compile each region of ``model`` in place (nn.Module.compile); returns the engine's
    ``_to_eager``: undo it and run ``wrapper`` (DDP or the DeepSpeed engine) as it is."""
    regions = compile_regions(model, cfg.compile_pos_conv)
    for region in regions:
        region.compile(**kwargs)

    def to_eager() -> torch.nn.Module:
        for region in regions:
            region._compiled_call_impl = None
        return wrapper

    return to_eager


def compile_ddp(
    cfg: TrialConfig,
    model: torch.nn.Module,
    ddp: torch.nn.Module,
    kwargs: dict[str, Any],
    compiled: dict[str, Any],
) -> torch.nn.Module:
    """The module a DDP engine calls: ``ddp`` compiled whole, or with its model's regions
    compiled in place, or as it is; ``compiled["_to_eager"]`` undoes the compilation."""
    import torch._dynamo.config as dynamo_config

    # Dynamo's DDPOptimizer splits a graph traced under DDP at its gradient buckets, so that
    # all-reduce overlaps the backward of one graph: needed for the whole model, not for a
    # region (one layer: DDP's hooks already fire region by region). It also keeps every graph
    # it splits out of AOTAutograd's cache ("fakify_first_call"): on an H100, 24 of 24 regions,
    # traced and partitioned again by every new process. Set per run: a resident worker serves
    # runs of both scopes.
    dynamo_config.optimize_ddp = not (cfg.torch_compile and cfg.compile_scope == "layers")
    if cfg.torch_compile and cfg.compile_scope == "layers":
        compiled["_to_eager"] = _compile_layers(cfg, model, kwargs, ddp)
    elif cfg.torch_compile:
        # The DDP module, not the inner one: dynamo's DDPOptimizer then splits the graph at
        # bucket boundaries, so gradient all-reduce still overlaps the backward pass.
        compiled["_to_eager"] = lambda: ddp
        return torch.compile(ddp, **kwargs)
    return ddp


def compile_deepspeed(
    cfg: TrialConfig, engine: Any, kwargs: dict[str, Any], compiled: dict[str, Any]
) -> None:
    """Compile a DeepSpeed engine in place: its module's regions, or engine.compile of the
    whole; ``compiled["_to_eager"]`` undoes it."""
    if cfg.torch_compile and cfg.compile_scope == "layers":
        compiled["_to_eager"] = _compile_layers(cfg, engine.module, kwargs, engine)
    elif cfg.torch_compile:
        backend = kwargs.pop("backend")
        engine.compile(backend=backend, compile_kwargs=kwargs)

        def to_eager():
            # engine.compile is nn.Module.compile of the wrapped module, which keeps the
            # compiled call in _compiled_call_impl; without it the module runs eagerly.
            engine.module._compiled_call_impl = None
            return engine

        compiled["_to_eager"] = to_eager


class CompileTime(NamedTuple):
    """The compile warm-up's seconds (the manifest's compile_s) and where they went
    (compile_parts); ``passes``: the seconds of each pass, summed over the shapes (the first,
    then with reduce-overhead the CUDA graph recording and the first replay)."""

    seconds: float
    parts: str
    passes: tuple[float, ...] = ()


# Phases of dynamo's compile (torch._dynamo.utils.compilation_time_metrics, seconds per call):
# the whole compile of a frame, its Python tracing, its guards, and its backend (AOTAutograd
# and inductor, loads from their caches included).
# Passes of each shape in the warm-up with CUDA graphs (reduce-overhead): warm-up, recording,
# the first replay.
CUDAGRAPH_PASSES = 3

_PHASES = {
    "dynamo": "_compile.compile_inner",
    "trace": "bytecode_tracing",
    "guards": "build_guards",
    "backend": "OutputGraph.call_user_compiler",
}


def _phase_seconds() -> dict[str, float]:
    """Seconds this process has spent so far in each phase of _PHASES."""
    from torch._dynamo.utils import compilation_time_metrics

    return {name: sum(compilation_time_metrics.get(key, ())) for name, key in _PHASES.items()}


def compile_parts(before: dict[str, float], seconds: float, later: float, collect: float) -> str:
    """Where ``seconds`` of a warm-up went since ``before`` (_phase_seconds): dynamo's tracing,
    guards and backend (AOTAutograd and inductor, cache loads included), the rest of dynamo
    (dynamo_other), the rest of each shape's first pass (``first_passes``: running it, and the
    backward graphs compiled or loaded at their first call), the ``later`` passes (with
    reduce-overhead: CUDA graph warm-up and recording) and the closing garbage ``collect``ion.
    The parts sum to ``seconds``: 'trace=3.0 guards=0.8 backend=12.9 dynamo_other=0.3
    first_passes=20.2 cudagraph_passes=10.0 collect=0.1'."""
    now = _phase_seconds()
    spent = {name: max(0.0, now[name] - before.get(name, 0.0)) for name in now}
    parts = {name: spent[name] for name in ("trace", "guards", "backend")}
    parts["dynamo_other"] = max(0.0, spent["dynamo"] - sum(parts.values()))
    parts["first_passes"] = max(0.0, seconds - spent["dynamo"] - later - collect)
    parts["cudagraph_passes"] = later
    parts["collect"] = collect
    return " ".join(f"{name}={value:.1f}" for name, value in parts.items())


def _one_pass(engine, cfg: TrialConfig, batch: dict[str, torch.Tensor]) -> None:
    """A forward and backward pass of ``batch``, gradients cleared; a compile error falls back
    to eager (engine.fall_back)."""
    try:
        speech, text, scale = engine(batch)
        if engine.compiling:  # a forward that fell back to eager has nothing to warm up
            loss = contrastive_loss(
                speech.float(), text.float(), scale.float(), scope=cfg.contrastive_scope
            )
            engine.backward(loss)  # the backward graph compiles at its first call
    except engine.compile_errors as exc:
        engine.fall_back(exc)
    engine.bare.zero_grad(set_to_none=True)


def warm_up(
    engine, cfg: TrialConfig, shapes: list[tuple[int, int, int]] | None = None
) -> CompileTime:
    """compile_warmup: compile (and with reduce-overhead, record the CUDA graphs of) every
    static shape of the run before its first timed step, in a forward and backward pass of a
    made-up batch of each shape; no optimizer step, gradients cleared, RNG states put back
    (dropout masks of the real steps are unchanged). ``shapes``: (rows, audio samples, text
    tokens) of each, when the loader knows them (batching duration: every bin's one or two row
    counts, trainables/data/durations.py); else the config's static shapes at micro_batch rows.
    Every rank warms the same shapes in the same order (their backward passes all-reduce).
    Returns the seconds it took (compile_s; 0 when nothing was compiled ahead) and where they
    went (compile_parts). DDP and FSDP2: DeepSpeed counts its micro-steps and would take the
    pass as one."""
    if shapes is None and cfg.static_shapes:
        shapes = [(cfg.micro_batch, audio_n, text_n) for audio_n, text_n in cfg.static_shapes]
    if not (cfg.compile_warmup and shapes and engine.compiling and engine.kind != "deepspeed"):
        return CompileTime(0.0, "")
    device = next(engine.bare.parameters()).device
    # The loader's batches: transcripts padded to text_tokens; batching duration's also carry
    # an audio mask, with padding (nearly always) or without (every row as long as its bin:
    # crops of max_audio_s). Padding changes the layers' code only for attention kinds that
    # take the 2D mask (trainables/model/padding.py): then every shape is warmed both ways.
    variants = [{"masked": cfg.batching == "duration", "padded": True}]
    if cfg.batching == "duration" and padding_changes_code(engine.bare):
        variants.append({"masked": True})
    # cudagraph trees run a function eagerly once (warm-up), record it at its second call and
    # replay it from the third.
    passes = [0.0] * (CUDAGRAPH_PASSES if engine.cudagraphs else 1)
    before = _phase_seconds()
    t0 = time.perf_counter()
    devices = [device] if device.type == "cuda" else []
    # The collector paused: tracing and loading graphs make many objects, little garbage.
    with torch.random.fork_rng(devices=devices), collector_paused():
        for (rows, audio_n, text_n), variant in itertools.product(shapes, variants):
            for i in range(len(passes)):
                t_pass = time.perf_counter()
                batch = shape_batch(rows, audio_n, text_n, device, **variant)
                _one_pass(engine, cfg, batch)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                passes[i] += time.perf_counter() - t_pass
                if not engine.compiling:
                    break
            if not engine.compiling:
                break
        # The young generations' passes the pause put off (what the warm-up made: dynamo's
        # and inductor's graphs), here rather than in the first timed steps, and inside the
        # pause: after it, the first allocation would start them anyway (not timed as this
        # part). Not a full collection (0.5-1.3 s on 2 cores), which the collector runs only
        # once the objects new since the last one outnumber a quarter of the old ones, seldom
        # within a warm-up.
        t_collect = time.perf_counter()
        gc.collect(1)
        collect = time.perf_counter() - t_collect
    seconds = time.perf_counter() - t0
    parts = compile_parts(before, seconds, sum(passes[1:]), collect)
    return CompileTime(seconds, parts, tuple(round(p, 3) for p in passes))
