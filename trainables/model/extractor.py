"""wav2vec2's convolutional feature encoder, computed another way (the `extractor_layout` key).

transformers runs the seven convolutions of the feature encoder (raw 16 kHz audio -> 512
channels at 50 frames a second) as ``Conv1d`` on (batch, channels, time) tensors. At the best
point's shapes on an H200 the six 512 -> 512 convolutions run at 24 % of the bf16 peak, and the
first (one input channel, kernel 10, stride 5) with its per-channel GroupNorm takes 25 ms for
0.03 TFLOP (benchmarks/results/mfu_budget_2xh200/). Two other ways, same parameters (the
encoder's ``conv_layers`` are kept, under their names), same math up to float rounding, FLOPs
counted on the convolutions:

- ``channels_last``: the same convolutions as ``conv2d`` over (batch, channels, 1, time) in
  ``torch.channels_last``, the layout cuDNN's tensor-core kernels work in (measured slower
  eager on an H200: 61.0 against 53.7 ms at mb 256, 2 s).
- ``matmul``: each convolution as matrix products over (batch, time, channels) activations.
  A convolution of kernel ``k`` and stride ``s`` reads, for output frame ``t``, input frames
  ``s*t .. s*t+k-1``. Viewed as rows of ``s`` frames (a free reshape of the channels-last
  buffer), output ``t`` is row ``t`` times the first ``s`` taps, plus row ``t+1`` times the next
  ``s``, and so on: ``ceil(k/s)`` GEMMs over all frames of the batch at once, each reading the
  buffer in place (a row offset, the columns it needs), never an unfolded copy. Every item of
  the batch gets a buffer of ``P`` rows, ``P`` a multiple of the later strides' product, so the
  next layer's reshape is free too; the rows past an item's frames are never read by a frame
  that is kept, and the GroupNorm's statistics skip them. The first convolution (one input
  channel) unfolds the audio (10 samples a frame, small beside its 512 outputs) into one GEMM;
  its GroupNorm and GELU run as torch ops or norm_gelu's kernels, or the whole layer folded
  into one product (folded_layer; the ``extractor_norm`` key).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from trainables.model.pos_conv import compute_dtype
from trainables.model.strided_conv import strided_conv

__all__ = ["ChannelsLastFeatureEncoder", "MatmulFeatureEncoder", "use_extractor_layout"]


class _FeatureEncoder(nn.Module):
    """What ``Wav2Vec2FeatureEncoder`` holds besides its forward: its ``conv_layers`` (so
    parameter names stay) and its flags (freezing as transformers' ``freeze_feature_encoder``
    does; no gradient checkpointing, which no key turns on)."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.conv_layers = original.conv_layers
        self.gradient_checkpointing = False
        self._requires_grad = original._requires_grad

    def _freeze_parameters(self) -> None:
        for param in self.parameters():
            param.requires_grad = False
        self._requires_grad = False


class ChannelsLastFeatureEncoder(_FeatureEncoder):
    """``Wav2Vec2FeatureEncoder``'s forward on channels-last activations."""

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        """(batch, samples) -> (batch, channels, frames), as the original; the result's memory
        is (batch, frames, channels)."""
        hidden = input_values[:, None, None, :].contiguous(memory_format=torch.channels_last)
        if self._requires_grad and self.training:
            hidden.requires_grad = True
        for layer in self.conv_layers:
            conv = layer.conv
            weight = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            hidden = F.conv2d(hidden, weight, conv.bias, stride=(1, conv.stride[0]))
            norm = getattr(layer, "layer_norm", None)
            if isinstance(norm, nn.GroupNorm):
                hidden = norm(hidden)
            elif norm is not None:  # feat_extract_norm "layer": LayerNorm over the channels
                hidden = norm(hidden.squeeze(2).transpose(1, 2)).transpose(1, 2).unsqueeze(2)
            hidden = layer.activation(hidden)
        return hidden.squeeze(2)


def _strided_conv(hidden: torch.Tensor, conv: nn.Conv1d, dtype: torch.dtype) -> torch.Tensor:
    """(batch, rows, in) -> (batch, rows / stride, out): the convolution as ``ceil(k / s)``
    GEMMs over rows of ``stride`` frames, the ``q``-th reading those rows ``q`` further on with
    taps ``q*s ..`` and adding into the output in place (strided_conv's ops). Flat over the
    batch: an item's last rows read the next item's first, and the batch's last ``q`` rows miss
    the ``q``-th term; none of them is a kept frame (an item holds at least ``ceil(k / s) - 1``
    rows past its frames)."""
    out = strided_conv(hidden, conv.weight.to(dtype), conv.stride[0])
    if conv.bias is not None:
        out = out + conv.bias.to(out.dtype)
    return out


class MatmulFeatureEncoder(_FeatureEncoder):
    """``Wav2Vec2FeatureEncoder``'s forward as GEMMs over channels-last activations (its input
    takes no gradient: transformers' marks it only for gradient checkpointing)."""

    strided = staticmethod(_strided_conv)  # how layers 2.. run (a benchmark swaps it)

    def __init__(self, original: nn.Module):
        super().__init__(original)
        if self.conv_layers[0].conv.in_channels != 1:
            raise ValueError("extractor_layout matmul: the first convolution must read raw audio")
        # The first GroupNorm and GELU as one function (norm_gelu's Triton kernels), or None;
        # or the whole first layer as one function (folded_layer's kernels), or None.
        self.fused_norm = None
        self.folded_layer = None

    def use_norm(self, norm: str, device: torch.device) -> str:
        """The extractor_norm key: ``folded`` runs the whole first layer as folded_layer's
        Triton kernels where they can run on ``device`` and the layer is what they compute (one
        group per channel, exact GELU); ``triton`` its GroupNorm and GELU as norm_gelu's
        kernels, where they can; ``auto`` the first of the two that can; ``torch``, or where
        none can, torch ops. Returns which. (Triton is imported only where it may run: 0.4 s.)"""
        layer = self.conv_layers[0]
        group = getattr(layer, "layer_norm", None)
        self.fused_norm = None
        self.folded_layer = None
        if (
            norm != "torch"
            and len(self.conv_layers) > 1
            and isinstance(group, nn.GroupNorm)
            and group.num_groups == group.num_channels
            and _exact_gelu(layer.activation)
            and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
        ):
            from trainables.model import folded_layer, norm_gelu

            if norm in ("folded", "auto") and folded_layer.available(device):
                self.folded_layer = folded_layer.folded_conv_norm_gelu
                return "folded"
            if norm in ("triton", "auto") and norm_gelu.available(device):
                self.fused_norm = norm_gelu.group_norm_gelu
        return "torch" if self.fused_norm is None else "triton"

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        """(batch, samples) -> (batch, channels, frames), as the original; the result's memory
        is (batch, frames, channels)."""
        convs = [layer.conv for layer in self.conv_layers]
        frames = [input_values.shape[1]]
        for conv in convs:
            frames.append((frames[-1] - conv.kernel_size[0]) // conv.stride[0] + 1)
        later = 1  # the product of the strides after the first convolution
        for conv in convs[1:]:
            later *= conv.stride[0]
        rows = -(-frames[1] // later) * later  # the first buffer's rows per item
        dtype = compute_dtype(input_values)
        last = len(self.conv_layers) - 1
        first = 0 if self.fused_norm is None and self.folded_layer is None else 1
        group = getattr(self.conv_layers[0], "layer_norm", None)
        if self.folded_layer is not None:
            hidden = self.folded_layer(input_values, convs[0], group, rows, frames[1], dtype)
        else:
            hidden = _first_conv(input_values.to(dtype), convs[0], rows)
        if self.fused_norm is not None:
            hidden = self.fused_norm(hidden, group.weight, group.bias, frames[1], group.eps)
        for i, layer in enumerate(self.conv_layers):
            if i < first:
                continue
            if i > 0:
                hidden = self.strided(hidden, layer.conv, dtype)
                rows //= layer.conv.stride[0]
            norm = getattr(layer, "layer_norm", None)
            if isinstance(norm, nn.GroupNorm):
                hidden = _group_norm_over_time(hidden, frames[i + 1], norm)
            elif norm is not None:  # feat_extract_norm "layer": LayerNorm over the channels
                hidden = norm(hidden)
            hidden = layer.activation(hidden)
            if i < last:  # the next GEMM's input (the last layer's dtype is transformers')
                hidden = hidden.to(dtype)
        return hidden[:, : frames[-1]].transpose(1, 2)


def _first_conv(audio: torch.Tensor, conv: nn.Conv1d, rows: int) -> torch.Tensor:
    """(batch, samples) -> (batch, rows, out): the first convolution (one input channel) as one
    GEMM over the audio unfolded to ``kernel`` samples a frame, padded or cut to ``rows``
    frames (the rows past the convolution's frames read zeros or nothing that is kept)."""
    kernel, stride = conv.kernel_size[0], conv.stride[0]
    batch = audio.shape[0]
    need = stride * (rows - 1) + kernel
    audio = F.pad(audio, (0, need - audio.shape[1])) if need > audio.shape[1] else audio[:, :need]
    windows = audio.unfold(1, kernel, stride)  # batch, rows, kernel
    weight = conv.weight.to(audio.dtype)[:, 0].t()  # kernel, out
    out = torch.matmul(windows.reshape(batch * rows, kernel), weight)
    if conv.bias is not None:
        out = out + conv.bias.to(out.dtype)
    return out.view(batch, rows, -1)


def _group_norm_over_time(hidden: torch.Tensor, frames: int, norm: nn.GroupNorm) -> torch.Tensor:
    """transformers' GroupNorm on (batch, channels, time), done on (batch, rows, channels):
    statistics over each item's first ``frames`` rows and its group's channels, in float32 (as
    autocast runs group_norm). The rows past ``frames`` are set to zero: normalised by the kept
    rows' statistics they could be up to 1/sqrt(eps) times larger, enough to overflow float16
    in the next GEMM and make its gradients NaN through 0 x inf."""
    batch, rows, channels = hidden.shape
    groups = norm.num_groups
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    x = hidden.to(dtype).view(batch, rows, groups, channels // groups)
    var, mean = torch.var_mean(x[:, :frames], dim=(1, 3), correction=0, keepdim=True)
    x = (x - mean) * torch.rsqrt(var + norm.eps)
    x = x.view(batch, rows, channels) * norm.weight.to(dtype) + norm.bias.to(dtype)
    kept = torch.arange(rows, device=x.device).view(1, rows, 1) < frames
    return torch.where(kept, x, 0.0)


def _exact_gelu(activation: nn.Module) -> bool:
    """Whether ``activation`` is the erf GELU (transformers' ``gelu``, torch's ``nn.GELU()``)."""
    if isinstance(activation, nn.GELU):
        return activation.approximate == "none"
    return getattr(activation, "act", None) is F.gelu


def use_extractor_layout(speech: nn.Module, layout: str, norm: str = "torch") -> str:
    """Put the feature encoder of ``layout`` into a transformers ``Wav2Vec2Model``:
    ``channels_first`` (transformers' own), ``channels_last`` or ``matmul``, the latter's first
    GroupNorm and GELU by ``norm`` (the extractor_norm key) on the parameters' device. Returns
    the norm it runs (the extractor_norm_effective column): ``triton`` or ``folded`` where
    asked for and runnable, else ``torch``."""
    kinds = {"channels_last": ChannelsLastFeatureEncoder, "matmul": MatmulFeatureEncoder}
    kind = kinds.get(layout)
    if kind is not None and not isinstance(speech.feature_extractor, kind):
        speech.feature_extractor = kind(speech.feature_extractor)
    encoder = speech.feature_extractor
    if not isinstance(encoder, MatmulFeatureEncoder):
        return "torch"
    return encoder.use_norm(norm, next(encoder.parameters()).device)
