"""wav2vec2's positional convolution as batched matrix products (the `pos_conv` key).

The positional embedding of wav2vec2 is a grouped 1-D convolution over the frames (base: 768
channels in 16 groups of 48, kernel 128, "same" padding) with a weight-normalised kernel and a
GELU. cuDNN runs that shape at about 3 % of an H200's bf16 peak: 27 ms of a 146 ms step at
micro-batch 256 and 2 s (benchmarks/results/mfu_budget_2xh200/). The same convolution is a
block-Toeplitz matrix product: cut the frames into blocks of ``L``, and each output block is the
product of a window of input blocks (the kernel's reach on either side) with one matrix per
group, built from the kernel by an index gather. That is one ``bmm`` per step over all groups, a
shape tensor cores run near their peak; it does a few more multiply-adds than the convolution
(the zeros of the window's corners, at most ``(L - 1) / K`` more), and its gradient flows to the
same weight-norm parameters through the gather. Parameter names do not change (the convolution
module is kept and only its forward is replaced), so checkpoints load either way, and FLOPs and
MFU are counted on the convolution (the documented formula), never on the product's zeros.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["MatmulPositionalConv", "block_for", "compute_dtype", "use_pos_conv"]

# Block lengths tried per frame count.
_BLOCKS = (8, 16, 32, 64)
# The cost model that picks one, fitted to the compiled forward and backward on an H200 (blocks
# 8, 16 and 32 at mb 256 and 512, 99 and 149 frames: 3.4-14.3 ms, each predicted within 15 %;
# benchmarks/results/fuse_linears_1xh200/): the products at about 290 TFLOP/s, each element of
# the input's windows (written, read, and its gradient summed back) at about 1.9 ps, and each
# element of the block-Toeplitz matrix at about 52 ps: its backward (``unfold``'s, into the
# kernel taps) dominates. Short blocks waste fewer products on the zeros of the window's
# corners and build a smaller matrix; long blocks copy the input fewer times. Block 8 was the
# fastest at every measured shape (block 16 the model's old choice at mb 256: 1.4x slower).
# Fitted with the matrix built by ``unfold``; built by the skew trick since (_toeplitz), the
# matrix costs less and blocks 8 and 16 tie at the best point (2.82 / 2.79 ms at mb 256, 99
# frames), so 8 still holds there; a refit needs the skew form's times at more shapes.
_SECONDS_PER_FLOP = 3.4e-15
_SECONDS_PER_WINDOW_ELEMENT = 1.9e-12
_SECONDS_PER_MATRIX_ELEMENT = 5.2e-11


def block_for(batch: int, frames: int, kernel: int, channels: int, groups: int) -> int:
    """The block length with the lowest modelled time for this shape."""
    per_group = channels // groups

    def seconds(block: int) -> float:
        left, right = _reach(kernel, block)
        window = (left + 1 + right) * block
        windows = batch * math.ceil(frames / block) * window * channels
        matrix = window * block * channels * per_group
        flops = 2 * windows * block * per_group
        return (
            flops * _SECONDS_PER_FLOP
            + windows * _SECONDS_PER_WINDOW_ELEMENT
            + matrix * _SECONDS_PER_MATRIX_ELEMENT
        )

    # A loop, not min(key=...): dynamo traces it where the frames are symbolic (dynamic shapes).
    best = _BLOCKS[0]
    for block in _BLOCKS[1:]:
        if seconds(block) < seconds(best):
            best = block
    return best


def _reach(kernel: int, block: int) -> tuple[int, int]:
    """Blocks of input an output block reads on its left and on its right."""
    pad = kernel // 2
    return math.ceil(pad / block), math.ceil((kernel - 1 - pad) / block)


def _toeplitz(weight: torch.Tensor, block: int, window: int, left: int) -> torch.Tensor:
    """(out, in, kernel) -> (out, in, block, window): for output position ``l`` of a block and
    window position ``w``, the kernel tap that joins them (zero where out of reach). Row ``l``
    is the kernel, zero-padded, read from offset ``block - 1 - l``: the rows ``r`` of
    ``padded[r : r + window]``, flipped.

    Built by the skew trick, not by ``unfold``: the padded kernel (length ``P``) repeated
    ``block`` times and viewed as rows of ``P + 1`` starts row ``r`` at element ``r`` (no row
    wraps: ``r + w < P``). Its backward is a sum over the repeats, where ``unfold``'s scattered
    every element's gradient back into the kernel taps (about 52 ps an element on an H200, most
    of this product's time; benchmarks/results/fuse_linears_1xh200/). No index gather either:
    inductor's CPU code for the gather's backward corrupted memory (torch 2.13)."""
    kernel = weight.shape[-1]
    before = left * block - kernel // 2 + block - 1
    after = block - 1 + window - before - kernel
    padded = nn.functional.pad(weight, (before, after))
    length = padded.shape[-1]  # window + block - 1
    repeated = padded.repeat(*([1] * (padded.dim() - 1)), block)
    rows = nn.functional.pad(repeated, (0, block)).unflatten(-1, (block, length + 1))
    return rows[..., :window].flip(-2)


class MatmulPositionalConv(nn.Module):
    """wav2vec2's ``Wav2Vec2PositionalConvEmbedding`` with the convolution computed as block-
    Toeplitz products; holds the original's modules under their names (``conv``, ``padding``,
    ``activation``), so its parameters keep theirs."""

    toeplitz = staticmethod(_toeplitz)  # how the matrix is built (a benchmark swaps it)

    def __init__(self, original: nn.Module):
        super().__init__()
        self.conv = original.conv
        self.padding = original.padding
        self.activation = original.activation
        self.block: int | None = None  # a fixed block length (benchmarks); None: block_for's

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, frames, channels) -> (batch, frames, channels), as the original."""
        conv = self.conv
        batch, frames, channels = hidden_states.shape
        groups = conv.groups
        per_group = channels // groups
        kernel = conv.kernel_size[0]
        block = self.block or block_for(batch, frames, kernel, channels, groups)
        left, right = _reach(kernel, block)
        window = (left + 1 + right) * block
        blocks = math.ceil(frames / block)

        dtype = compute_dtype(hidden_states)
        weight = conv.weight.to(dtype).view(groups, per_group, per_group, kernel)  # g, out, in, tap
        matrix = self.toeplitz(weight, block, window, left)  # g, out, in, block, window
        matrix = matrix.permute(0, 4, 2, 3, 1).reshape(groups, window * per_group, -1)

        x = hidden_states.to(dtype)
        x = nn.functional.pad(x, (0, 0, left * block, blocks * block - frames + right * block))
        windows = x.unfold(1, window, block)  # batch, blocks, channels, window
        windows = windows.view(batch, blocks, groups, per_group, window)
        windows = windows.permute(2, 0, 1, 4, 3).reshape(groups, batch * blocks, -1)
        out = torch.bmm(windows, matrix)  # g, batch * blocks, block * out
        out = out.view(groups, batch, blocks * block, per_group)[:, :, :frames]
        out = out.permute(1, 2, 0, 3).reshape(batch, frames, channels)
        if conv.bias is not None:
            out = out + conv.bias.to(out.dtype)
        return self.activation(out)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the convolution would run in here: autocast's, else the input's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def use_pos_conv(speech: nn.Module, kind: str) -> str:
    """Put the ``kind`` of positional convolution into a transformers ``Wav2Vec2Model``:
    ``conv`` (the convolution as transformers builds it) or ``matmul``. Returns what it
    used."""
    encoder = speech.encoder
    current = encoder.pos_conv_embed
    if kind == "matmul" and not isinstance(current, MatmulPositionalConv):
        encoder.pos_conv_embed = MatmulPositionalConv(current)
    return kind
