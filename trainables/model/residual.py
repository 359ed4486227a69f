"""The residual stream's dtype under DDP's autocast (the residual_dtype key).

Both encoders are post-norm transformers: every sublayer's output is added to the stream and
the sum goes through a LayerNorm, whose output is the next sublayer's input and the next
residual. Autocast runs LayerNorm in float32 and returns float32, so under DDP the whole
stream is float32: each residual add, each LayerNorm and their backward passes move twice the
bytes of bf16, and every linear reads a bf16 copy made of it. These are memory-bound kernels:
on one H200 at mb 512 the LayerNorm kernels took about 12 ms of a 199 ms compiled step
(benchmarks/results/next_levers_1xh200/sweep_kernels.md).

``bf16`` casts every LayerNorm's output of both encoders to bf16 (a forward hook; under
torch.compile the cast fuses into the norm's kernel). The norm still computes in float32; the
stream between norms, and the residual adds, are bf16. FSDP2 (bf16 parameters by its mixed
precision policy) and DeepSpeed (bf16 weights) already compute so: their LayerNorms return
bf16. Megatron-LM's default too (``fp32_residual_connection`` off). It changes the math (one
rounding of the stream to bf16 per norm): judged on the learnable corpus
(benchmarks/learning_check.py). Only under DDP's autocast: the engine hooks nothing where the
weights are low precision. On a CPU, ``fp32`` hooks the norms too (their inputs to float32,
as CUDA's autocast runs them): see use_residual_dtype."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["residual_dtype_effective", "use_residual_dtype"]


def residual_dtype_effective(requested: str, precision: str, strategy: str, load_dtype: str) -> str:
    """The stream's dtype a run computes in: its weights' where they are low precision
    (FSDP2's mixed precision policy, DeepSpeed, low-precision weights under DDP), as requested
    under DDP's autocast at precision bf16, else float32."""
    if strategy == "fsdp2" and precision != "fp32":
        return precision
    if load_dtype != "fp32":
        return load_dtype
    if strategy == "ddp" and precision == "bf16":
        return requested
    return "fp32"


def _to_bf16(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    return output.to(torch.bfloat16)


def _input_to_fp32(module: nn.Module, args: tuple) -> tuple:
    return (args[0].float(), *args[1:])


def use_residual_dtype(model: nn.Module, dtype: str, device_type: str = "cuda") -> int:
    """With ``dtype`` bf16, every LayerNorm of the Stage1Model's two encoders returns bf16;
    with fp32 on a CPU, each takes its input in float32, as CUDA's autocast gives it (the
    CPU's autocast runs layer_norm in its input's dtype, so a CPU run, the learning check's,
    would otherwise carry a bf16 stream in wav2vec2 and a float32 one in BERT). A hook each:
    parameter names and checkpoints unchanged. Returns how many norms were hooked."""
    if dtype == "fp32" and device_type == "cuda":
        return 0
    encoders = (model.speech, model.text)
    norms = [m for e in encoders for m in e.modules() if isinstance(m, nn.LayerNorm)]
    for norm in norms:
        if dtype == "bf16":
            norm.register_forward_hook(_to_bf16)
        else:
            norm.register_forward_pre_hook(_input_to_fp32)
    return len(norms)
