"""Model FLOPs utilisation: FLOPs of one training step per sample, the peak table, and the
FLOPs cache (each model shape counted once per machine, not in every run: the machine's cache
folder, stage1_common/machine_cache.py).

FLOPs are counted once, at start-up, with ``torch.utils.flop_counter.FlopCounterMode`` over a
forward and backward pass of the bare model (matmuls, convolutions and attention, the usual MFU
convention) on a batch of the run's mean crop length. MFU = samples/s x FLOPs per sample /
(peak x GPUs). With batching duration a step's count and lengths vary: FLOPs per sample, per
audio second and per squared audio second (``flops_terms``), summed over what each window's
steps held.

One correction to torch's counter (``counter``): it counts a grouped convolution's weight
gradient as if the convolution were not grouped (``groups`` times too many; torch 2.11 and
2.13). wav2vec2's positional convolution has 16 groups, so torch's count of the base model
carries its weight gradient 16 times (see docs for the size of it at the best point).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from stage1_common.fileio import write_json
from trainables.config import TrialConfig
from trainables.data.crops import SAMPLE_RATE
from trainables.engine.precision import DTYPES, autocast_for, resolve_precision
from trainables.engine.shapes import probe_shape, shape_batch

__all__ = [
    "PEAK_TFLOPS",
    "cached_flops_per_sample",
    "counter",
    "flops_per_sample",
    "flops_terms",
    "peak_tflops",
]

# Dense peak TFLOP/s per GPU from the vendors' data sheets (no sparsity). Low precision is the
# tensor-core rate with fp32 accumulation; fp32 is the non-tensor-core rate (TF32 is not used
# unless enabled). Matched by substring of torch.cuda.get_device_name, first match wins.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    ("RTX 4090", {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
]


def peak_tflops(device: torch.device, precision: str) -> float:
    """Peak TFLOP/s of one device at this precision; NaN when unknown (CPU, other GPUs)."""
    if device.type != "cuda":
        return math.nan
    name = torch.cuda.get_device_name(device)
    for key, peaks in PEAK_TFLOPS:
        if key in name:
            return peaks.get(precision, math.nan)
    return math.nan


# The counting rules' version, in the cache key: 2 = grouped convolutions' weight gradients
# counted once (``_conv_backward_flops``).
COUNTING = 2


def _conv_backward_flops(*args, out_shape, **kwargs) -> int:
    """torch's count of a convolution's backward, with the weight gradient counted as the
    forward convolution it is (``x`` against ``grad_out``: the weight's shape already holds
    ``C_in / groups``), where torch multiplies it by ``groups``."""
    from torch.utils.flop_counter import conv_backward_flop, conv_flop_count

    grad_out, x, w = args[0], args[1], args[2]
    transposed, output_mask = args[7], args[10]
    counted = conv_backward_flop(*args, out_val=out_shape, **kwargs)
    if transposed or not output_mask[1]:
        return counted
    torch_weight_grad = conv_backward_flop(*args[:10], [False, True, False], out_val=out_shape)
    return counted - torch_weight_grad + conv_flop_count(list(x), list(w), list(grad_out))


def counter():
    """A ``FlopCounterMode`` with the grouped-convolution correction (module docstring)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(
        display=False,
        custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops},
    )


def flops_per_sample(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """FLOPs of a forward and backward pass per sample of ``batch`` (gradients are cleared)."""
    counter_mode = counter()
    with counter_mode:
        speech, text, scale = model(**batch)
        (speech.float().sum() + text.float().sum() + scale.float().sum()).backward()
    model.zero_grad(set_to_none=True)
    return counter_mode.get_total_flops() / batch["audio"].shape[0]


def _cache_key(cfg: TrialConfig, load_dtype: str, attention: dict, audio_n: int) -> str:
    """What the count depends on: the model's shape and dtype, its attention kernels, the probe
    batch's shape, the torch and transformers versions, and the counting rules (``COUNTING``:
    a count made before a correction is not reused)."""
    import transformers

    text_n = probe_shape(cfg)[1]
    return json.dumps(
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
            COUNTING,
        ]
    )


def _read_cached(path: Path | None) -> float | None:
    try:
        return float(json.loads(path.read_text())["flops_per_sample"]) if path else None
    except (OSError, ValueError, KeyError):
        return None


def _write_cached(path: Path | None, key: str, value: float) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"key": key, "flops_per_sample": value})
    except OSError:
        pass  # a read-only output root: count again next time


def cached_flops_per_sample(
    cfg: TrialConfig,
    model,
    device,
    load_dtype: str,
    attention: dict,
    cache: Path | None,
    audio_n: int | None = None,
) -> float:
    """FLOPs per sample of the run's model shape (``audio_n`` samples of audio; default the
    probe's, the run's mean crop): from ``cache`` when a run of the same shape counted them,
    else counted; rank 0 only, sent to the others (no rank counts twice)."""
    probe_audio, text_n = probe_shape(cfg)
    audio_n = probe_audio if audio_n is None else audio_n
    key = _cache_key(cfg, load_dtype, attention, audio_n)
    path = None
    if cache is not None:
        path = Path(cache) / f"flops-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    value = [math.nan]
    if rank == 0:
        value[0] = _read_cached(path)
        if value[0] is None:
            # Its forward draws dropout masks: the RNG goes on as if it had not run.
            devices = [device] if device.type == "cuda" else []
            # Under the run's autocast, as its steps run: the count does not depend on the
            # dtype, but a kernel may (cuDNN and flash attention take no fp32 weights).
            autocast = autocast_for(resolve_precision(cfg.precision, device), device)
            with torch.random.fork_rng(devices=devices), autocast():
                batch = shape_batch(2, audio_n, text_n, device, DTYPES[load_dtype])
                value[0] = flops_per_sample(model, batch)
            _write_cached(path, key, value[0])
    if distributed and torch.distributed.get_world_size() > 1:
        torch.distributed.broadcast_object_list(value, src=0)
    return float(value[0])


def term_lengths(cfg: TrialConfig) -> tuple[float, float, float]:
    """The three audio lengths, seconds, that ``flops_terms`` counts at: the shortest and
    longest duration bin and their middle (the probe's length)."""
    low, high = cfg.min_audio_s, cfg.max_audio_s
    if high - low < 0.2:  # too close for a fit: halves of the longest
        low = high / 2
    return low, (low + high) / 2, high


def flops_terms(
    cfg: TrialConfig, model, device, load_dtype: str, attention: dict, cache: Path | None
) -> tuple[float, float, float]:
    """batching duration: FLOPs per sample as ``a + b s + c s^2`` of an utterance of ``s``
    seconds (a: the text encoder at text_tokens, the heads; b: the convolutions, projections
    and feed-forward layers per second of frames; c: attention's scores over the frames),
    fitted through counts at ``term_lengths``, each cached like ``cached_flops_per_sample``.
    A step's FLOPs are then ``a N + b S + c Q`` over its N utterances, S their seconds and Q
    their squared seconds (trainables/observe/window_metrics.py), real lengths (padding is not
    useful work). Exact at the three lengths; between them the frames' rounding (20 ms) moves
    it by well under 1 %."""
    seconds = term_lengths(cfg)
    counts = [
        cached_flops_per_sample(
            cfg, model, device, load_dtype, attention, cache, audio_n=int(round(s * SAMPLE_RATE))
        )
        for s in seconds
    ]
    vander = [[1.0, s, s * s] for s in seconds]
    a, b, c = np.linalg.solve(np.asarray(vander), np.asarray(counts))
    return float(a), float(b), float(c)
