"""Model FLOPs utilisation: FLOPs of one training step per sample, and the peak table.

FLOPs are counted once, at start-up, with ``torch.utils.flop_counter.FlopCounterMode`` over a
forward and backward pass of the bare model (matmuls, convolutions and attention, the usual MFU
convention) on a batch of the run's mean crop length. MFU = samples/s x FLOPs per sample /
(peak x GPUs).
"""

from __future__ import annotations

import math

import torch

__all__ = ["PEAK_TFLOPS", "flops_per_sample", "peak_tflops"]

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


def flops_per_sample(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """FLOPs of a forward and backward pass per sample of ``batch`` (gradients are cleared)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        speech, text, scale = model(**batch)
        (speech.float().sum() + text.float().sum() + scale.float().sum()).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch["audio"].shape[0]
