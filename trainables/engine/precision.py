"""Precision policy: the compute precision a run resolves to, the dtype its weights load in,
and the autocast context DDP computes under (DeepSpeed casts the weights itself)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DTYPES", "autocast_for", "resolve_load_dtype", "resolve_precision"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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


def autocast_for(precision: str, device: torch.device) -> Callable[[], Any]:
    """A factory of the context DDP's forward runs under: autocast to the precision's dtype,
    nothing at fp32."""
    dtype = DTYPES[precision]

    def autocast():
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    return autocast
