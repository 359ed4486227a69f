"""The GEMM feature encoder's first layer (convolution, GroupNorm, GELU) folded into one
product a pass (``extractor_norm: folded``, issue 56).

wav2vec2-base's first layer maps raw audio to 512 channels (kernel 10, stride 5, no bias),
normalises each item's channel over time (a ``GroupNorm`` with one group per channel), then
applies GELU. Its output is the encoder's largest tensor (mb 256, 2 s: 838 M values), written
by the convolution, read and written by the norm, read twice more backward: about 6 ms of an
H200's step (benchmarks/results/extractor_norm_1xh200/). The norm's statistics need no pass
over that tensor. With ``x`` an item's audio windows (``kernel`` samples a frame), ``w_c``
channel ``c``'s taps, ``mu`` and ``S`` the mean and (biased) covariance of the item's windows
over its kept frames, a ``kernel`` x ``kernel`` matrix:

    mean_c = w_c . mu (+ bias)        var_c = w_c' S w_c
    gelu(gamma_c * (w_c . x + bias - mean_c) / sqrt(var_c + eps) + beta_c)
        = gelu(x . w'_c + shift_c),  w'_c = w_c * s_c,  shift_c = beta_c - s_c * (w_c . mu),
                                     s_c = gamma_c / sqrt(var_c + eps)

So the layer is one product of the windows with per-item taps ``w'`` (the convolution's bias
cancels), then GELU. ``mu``, ``S``, ``w'`` and ``shift`` are small torch ops (float32, autograd
carries their gradients to the taps, gamma and beta); the product is two Triton kernels:

- forward: each tile of (rows, channels) loads its windows from the audio (a few KB) and
  writes ``gelu(x . w' + shift)`` in the compute dtype, zero on the rows past ``frames``: one
  write of the output, which the next layer reads;
- backward: recomputes ``z = x . w' + shift`` from the audio, reads the output's gradient once,
  and sums ``x' (dy * gelu'(z))`` and ``dy * gelu'(z)`` over each item's rows: the gradients
  of ``w'`` and ``shift``. The audio takes no gradient.

One write forward, one read backward, where the unfolded layer moves the tensor about ten
times. Equal to float rounding (the products in TF32 on tensor cores, statistics and sums in
float32; the unfolded layer rounds the convolution's output to the compute dtype before its
statistics). Registered as ``torch.library.triton_op`` so torch.compile keeps the kernels in
its graph (and its CUDA graphs); the CPU test suite runs them under Triton's interpreter.
"""

from __future__ import annotations

import torch
from torch import nn

from trainables.model import norm_gelu
from trainables.model.norm_gelu import Tile

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: the encoder keeps its unfolded first layer
    triton = None

__all__ = ["TILES", "available", "folded_conv_norm_gelu"]

# (rows x channels) tiles; the backward's programs as norm_gelu's reductions aim for.
# Measured on an H200 at mb 256, 2 s and 3 s (benchmarks.kernel_probes firstlayer --tiles).
TILES = {"forward": Tile(128, 64, 4), "backward": Tile(64, 64, 4, programs=8192)}


def available(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: norm_gelu's conditions (Triton, and a CUDA
    device or Triton's interpreter), and on CUDA tensor cores that take float32 products as
    TF32 (compute capability 8.0 or more: the products are ``tl.dot``s)."""
    if not norm_gelu.available(device):
        return False
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)


def folded_conv_norm_gelu(
    audio: torch.Tensor, conv: nn.Conv1d, norm: nn.GroupNorm, rows: int, frames: int,
    dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """``gelu(norm(conv(audio)))`` as (batch, rows, channels) in ``dtype``: statistics per item
    and channel over the first ``frames`` frames, zero on the rows past them. ``norm`` has one
    group per channel and ``conv`` one input channel."""
    kernel, stride = conv.kernel_size[0], conv.stride[0]
    audio = audio.float().contiguous()
    windows = audio[:, : stride * (frames - 1) + kernel].unfold(1, kernel, stride)
    mean = windows.mean(dim=1)  # batch, kernel
    centred = windows - mean[:, None]
    cov = centred.transpose(1, 2) @ centred / frames  # batch, kernel, kernel
    taps = conv.weight[:, 0].float()  # channels, kernel
    var = ((taps @ cov) * taps).sum(dim=-1)  # batch, channels: w_c' S w_c
    scale = norm.weight.float() * torch.rsqrt(var + norm.eps)
    folded = taps * scale[..., None]  # batch, channels, kernel
    shift = norm.bias.float() - scale * (mean @ taps.t())
    return torch.ops.stage1.folded_conv_gelu(
        audio, folded.contiguous(), shift.contiguous(), rows, frames, stride, dtype
    )


if triton is not None:
    _gelu_parts = norm_gelu._gelu_parts

    @triton.jit
    def _windows(a_ptr, b, r, live, samples, stride, K: tl.constexpr, KP: tl.constexpr):
        """Rows ``r`` of item ``b``'s windows, (BR, KP) float32, zero past ``K`` and off
        ``live``."""
        k = tl.arange(0, KP)
        at = a_ptr + b * samples + (r[:, None] * stride + k[None, :])  # int32 within the item
        return tl.load(at, mask=live[:, None] & (k < K)[None, :], other=0.0)

    @triton.jit
    def _taps(w_ptr, s_ptr, b, cols, ok, C: tl.constexpr, K: tl.constexpr, KP: tl.constexpr):
        """Item ``b``'s folded taps (KP, BC) and shifts (BC,) for channels ``cols``."""
        k = tl.arange(0, KP)
        at = w_ptr + (b * C + cols[None, :]) * K + k[:, None]
        taps = tl.load(at, mask=(k < K)[:, None] & ok[None, :], other=0.0)
        return taps, tl.load(s_ptr + b * C + cols, mask=ok, other=0.0)

    @triton.jit
    def _forward_kernel(
        a_ptr, w_ptr, s_ptr, y_ptr, samples, rows, frames, stride,
        C: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        r = tl.program_id(1) * BR + tl.arange(0, BR)
        cols = tl.program_id(2) * BC + tl.arange(0, BC)
        ok = cols < C
        live = r < frames
        x = _windows(a_ptr, b, r, live, samples, stride, K, KP)
        taps, shift = _taps(w_ptr, s_ptr, b, cols, ok, C, K, KP)
        y, _ = _gelu_parts(tl.dot(x, taps) + shift[None, :])
        y = tl.where(live[:, None], y, 0.0)
        at = y_ptr + b * rows * C + (r[:, None] * C + cols[None, :])
        tl.store(at, y.to(y_ptr.dtype.element_ty), mask=(r < rows)[:, None] & ok[None, :])

    @triton.jit
    def _backward_kernel(
        dy_ptr, a_ptr, w_ptr, s_ptr, dw_ptr, ds_ptr, samples, rows, frames, stride, per_split,
        splits, C: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BR: tl.constexpr,
        BC: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BC + tl.arange(0, BC)
        ok = cols < C
        split = tl.program_id(2)
        taps, shift = _taps(w_ptr, s_ptr, b, cols, ok, C, K, KP)
        acc = tl.zeros([KP, BC], dtype=tl.float32)
        acc_shift = tl.zeros([BR, BC], dtype=tl.float32)
        start = split * per_split
        end = tl.minimum(start + per_split, frames)
        item = dy_ptr + b * rows * C
        for r0 in range(start, end, BR):
            r = r0 + tl.arange(0, BR)
            live = r < end
            x = _windows(a_ptr, b, r, live, samples, stride, K, KP)
            _, slope = _gelu_parts(tl.dot(x, taps) + shift[None, :])
            at = item + (r[:, None] * C + cols[None, :])
            dy = tl.load(at, mask=live[:, None] & ok[None, :], other=0.0)
            g = tl.where(live[:, None], dy.to(tl.float32) * slope, 0.0)
            acc += tl.dot(tl.trans(x), g)
            acc_shift += g
        part = (b * splits + split) * C + cols
        k = tl.arange(0, KP)
        tl.store(dw_ptr + part[None, :] * K + k[:, None], acc, mask=(k < K)[:, None] & ok[None, :])
        tl.store(ds_ptr + part, tl.sum(acc_shift, axis=0), mask=ok)

    def _check(audio: torch.Tensor, taps: torch.Tensor, frames: int, stride: int) -> None:
        batch, channels, kernel = taps.shape
        if audio.dim() != 2 or audio.shape[0] != batch or not 0 < frames:
            raise ValueError(
                f"folded_conv_gelu: audio {tuple(audio.shape)}, taps {tuple(taps.shape)}"
            )
        if stride * (frames - 1) + kernel > audio.shape[1]:
            raise ValueError(
                f"folded_conv_gelu: {frames} frames need more than {audio.shape[1]} samples"
            )

    @torch.library.triton_op("stage1::folded_conv_gelu", mutates_args={})
    def _forward(
        audio: torch.Tensor, taps: torch.Tensor, shift: torch.Tensor, rows: int, frames: int,
        stride: int, dtype: torch.dtype,
    ) -> torch.Tensor:  # fmt: skip
        _check(audio, taps, frames, stride)
        batch, channels, kernel = taps.shape
        y = audio.new_empty((batch, rows, channels), dtype=dtype)
        t = TILES["forward"]
        grid = (batch, triton.cdiv(rows, t.rows), triton.cdiv(channels, t.cols))
        torch.library.wrap_triton(_forward_kernel)[grid](
            audio, taps, shift, y, audio.shape[1], rows, frames, stride,
            C=channels, K=kernel, KP=max(16, triton.next_power_of_2(kernel)), BR=t.rows,
            BC=t.cols, num_warps=t.warps,
        )  # fmt: skip
        return y

    @torch.library.triton_op("stage1::folded_conv_gelu_backward", mutates_args={})
    def _backward(
        dy: torch.Tensor, audio: torch.Tensor, taps: torch.Tensor, shift: torch.Tensor,
        frames: int, stride: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        batch, channels, kernel = taps.shape
        dy = dy.contiguous()
        t = TILES["backward"]
        grid, splits, per_split = norm_gelu.reduce_grid(batch, channels, frames, t)
        d_taps = taps.new_empty((batch, splits, channels, kernel))
        d_shift = taps.new_empty((batch, splits, channels))
        torch.library.wrap_triton(_backward_kernel)[grid](
            dy, audio, taps, shift, d_taps, d_shift, audio.shape[1], dy.shape[1], frames,
            stride, per_split, splits, C=channels, K=kernel,
            KP=max(16, triton.next_power_of_2(kernel)), BR=t.rows, BC=t.cols, num_warps=t.warps,
        )  # fmt: skip
        return d_taps.sum(dim=1), d_shift.sum(dim=1)

    def _setup_context(ctx, inputs, output) -> None:
        audio, taps, shift, _, frames, stride, _ = inputs
        ctx.save_for_backward(audio, taps, shift)
        ctx.frames, ctx.stride = frames, stride

    def _grad(ctx, dy):
        audio, taps, shift = ctx.saved_tensors
        d_taps, d_shift = torch.ops.stage1.folded_conv_gelu_backward(
            dy, audio, taps, shift, ctx.frames, ctx.stride
        )
        return None, d_taps, d_shift, None, None, None, None

    _forward.register_autograd(_grad, setup_context=_setup_context)
