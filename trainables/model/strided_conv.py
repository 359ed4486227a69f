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
    grad: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    stride: int,
    need_input: bool,
    need_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of the input and of the weight, each an empty tensor where not needed (a
    frozen encoder skips its weight-gradient GEMMs)."""
    batch, rows, channels = hidden.shape
    flat = hidden.reshape(batch * rows // stride, stride * channels)
    dout = grad.reshape(flat.shape[0], -1)
    d_flat = torch.empty_like(flat) if need_input else flat.new_empty(0)
    d_weight = torch.empty_like(weight) if need_weight else weight.new_empty(0)
    kernel = weight.shape[-1]
    for q in range(_groups(weight, stride)):
        w = _taps(weight, stride, q)
        width = w.shape[0]
        taps = width // channels
        rows_in = flat[q:, :width]  # the rows and columns this tap group read
        if need_input and q == 0 and width == d_flat.shape[1]:
            torch.mm(dout, w.t(), out=d_flat)
        elif need_input and q == 0:  # a kernel shorter than its stride: unread columns are 0
            d_flat.zero_()[:, :width].addmm_(dout, w.t())
        elif need_input:
            d_flat[q:, :width].addmm_(dout[: dout.shape[0] - q], w.t())
        if need_weight:
            d_w = rows_in.t() @ dout[: dout.shape[0] - q]  # (taps * in, out)
            d_weight[:, :, q * stride : min(kernel, q * stride + taps)] = d_w.view(
                taps, channels, -1
            ).permute(2, 1, 0)
    return (d_flat.view_as(hidden) if need_input else d_flat), d_weight


@_backward.register_fake
def _(grad, hidden, weight, stride, need_input, need_weight):
    return (
        torch.empty_like(hidden) if need_input else hidden.new_empty(0),
        torch.empty_like(weight) if need_weight else weight.new_empty(0),
    )


def _setup_context(ctx, inputs, output) -> None:
    hidden, weight, stride = inputs
    ctx.save_for_backward(hidden, weight)
    ctx.stride = stride


def _grad(ctx, grad):
    hidden, weight = ctx.saved_tensors
    need_input, need_weight = ctx.needs_input_grad[:2]
    d_hidden, d_weight = torch.ops.stage1.strided_conv_backward(
        grad.contiguous(), hidden, weight, ctx.stride, need_input, need_weight
    )
    return (d_hidden if need_input else None), (d_weight if need_weight else None), None


_forward.register_autograd(_grad, setup_context=_setup_context)
