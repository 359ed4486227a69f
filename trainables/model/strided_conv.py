"""The GEMM feature encoder's strided convolutions as one opaque op each way (issue 56).

A convolution of kernel ``k`` and stride ``s`` over (batch, rows, channels) activations is
``ceil(k / s)`` GEMMs over rows of ``s`` frames (trainables/model/extractor.py): the ``q``-th
reads the rows ``q`` further on, its first ``taps * channels`` columns, and adds into the output
rows ``q`` earlier. Written as torch ops, ``out[:-q] += x[q:, :c] @ w`` is an in-place add on a
slice; torch.compile makes it functional (a copy of the output with the slice replaced), and
its backward scatters the narrow input gradient into a zero-filled buffer before adding it: on
an H200 at mb 512, 2 s, five strided copies (``memcpy32_post``) of 6.2 ms a step, a fused
slice-backward of 2.8 ms, and GEMMs that re-read what they could have accumulated into
(benchmarks/results/folded_layer_1xh200/).

Here each direction is one ``torch.library.custom_op``, opaque to the compiler, whose GEMMs
accumulate in place through cuBLAS's ``beta = 1`` on strided views (``addmm_``): the forward's
later GEMMs add into the output's rows, the backward's input-gradient GEMMs into the gradient's
rows and columns, and each tap group's weight gradient is one GEMM. No copy, no zero fill
(where ``k >= s`` the first tap group spans whole rows). Same GEMMs, same math as the torch
form; compiled code calls them as extern kernels (CUDA graphs keep them).
"""

from __future__ import annotations

import torch

__all__ = ["strided_conv"]


def strided_conv(hidden: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    """(batch, rows, in) -> (batch, rows / stride, out): the convolution of ``weight`` (out,
    in, kernel), already in ``hidden``'s dtype, at ``stride``, over rows that ``stride``
    divides; the rows whose window runs past an item's end read the next item's first rows (or
    miss their last terms at the batch's end): never a kept frame (extractor.py)."""
    return torch.ops.stage1.strided_conv(hidden, weight, stride)


def _taps(weight: torch.Tensor, stride: int, q: int) -> torch.Tensor:
    """The ``q``-th tap group as a GEMM's right side: (taps * in, out), tap-major."""
    kernel = weight.shape[-1]
    taps = min(stride, kernel - q * stride)
    return (
        weight[:, :, q * stride : q * stride + taps].permute(2, 1, 0).reshape(-1, weight.shape[0])
    )


def _groups(weight: torch.Tensor, stride: int) -> int:
    return -(-weight.shape[-1] // stride)


@torch.library.custom_op("stage1::strided_conv", mutates_args=())
def _forward(hidden: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    batch, rows, channels = hidden.shape
    flat = hidden.reshape(batch * rows // stride, stride * channels)
    out = None
    for q in range(_groups(weight, stride)):
        w = _taps(weight, stride, q)
        if q == 0:
            out = torch.mm(flat[:, : w.shape[0]], w)
        else:
            out[:-q].addmm_(flat[q:, : w.shape[0]], w)
    return out.view(batch, rows // stride, -1)


@_forward.register_fake
def _(hidden: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    batch, rows, _ = hidden.shape
    return hidden.new_empty((batch, rows // stride, weight.shape[0]))


@torch.library.custom_op("stage1::strided_conv_backward", mutates_args=())
def _backward(
    grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, rows, channels = hidden.shape
    flat = hidden.reshape(batch * rows // stride, stride * channels)
    dout = grad.reshape(flat.shape[0], -1)
    d_flat = torch.empty_like(flat)
    d_weight = torch.empty_like(weight)
    kernel = weight.shape[-1]
    for q in range(_groups(weight, stride)):
        w = _taps(weight, stride, q)
        width = w.shape[0]
        taps = width // channels
        if q == 0 and width == d_flat.shape[1]:
            torch.mm(dout, w.t(), out=d_flat)
            d_w = flat.t() @ dout
        elif q == 0:  # a kernel shorter than its stride: the columns no tap reads are zero
            d_flat.zero_()[:, :width].addmm_(dout, w.t())
            d_w = flat[:, :width].t() @ dout
        else:
            d_flat[q:, :width].addmm_(dout[:-q], w.t())
            d_w = flat[q:, :width].t() @ dout[:-q]
        # (taps * in, out) -> the weight's (out, in, taps) slice
        d_weight[:, :, q * stride : min(kernel, q * stride + taps)] = d_w.view(
            taps, channels, -1
        ).permute(2, 1, 0)
    return d_flat.view_as(hidden), d_weight


@_backward.register_fake
def _(grad, hidden, weight, stride):
    return torch.empty_like(hidden), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    hidden, weight, stride = inputs
    ctx.save_for_backward(hidden, weight)
    ctx.stride = stride


def _grad(ctx, grad):
    hidden, weight = ctx.saved_tensors
    d_hidden, d_weight = torch.ops.stage1.strided_conv_backward(
        grad.contiguous(), hidden, weight, ctx.stride
    )
    return d_hidden, d_weight, None


_forward.register_autograd(_grad, setup_context=_setup_context)
