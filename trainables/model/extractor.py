"""wav2vec2's convolutional feature encoder with its activations channels-last (the
`extractor_layout` key).

transformers runs the seven convolutions of the feature encoder (raw 16 kHz audio -> 512
channels at 50 frames a second) as ``Conv1d`` on (batch, channels, time) tensors. On a GPU
cuDNN's tensor-core kernels work on channels-last data (NHWC), so each channels-first
convolution pays transposes around it; at the best point's shapes the six 512 -> 512
convolutions run at 24 % of an H200's bf16 peak and the first with its GroupNorm moves 6,400
frames x 512 channels per second of audio (benchmarks/results/mfu_budget_2xh200/). Here the same
convolutions run as ``conv2d`` over (batch, channels, 1, time) in ``torch.channels_last``, so the
activations stay (batch, time, channels) in memory from the first convolution to the feature
projection, whose transpose is then free. The parameters are the original's (the encoder's
``conv_layers`` are kept, under their names), the math is the same up to float rounding, and
FLOPs are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ChannelsLastFeatureEncoder", "use_extractor_layout"]


class ChannelsLastFeatureEncoder(nn.Module):
    """``Wav2Vec2FeatureEncoder``'s forward on channels-last activations; holds its
    ``conv_layers`` (so parameter names stay) and its flags."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.conv_layers = original.conv_layers
        self.gradient_checkpointing = False
        self._requires_grad = original._requires_grad

    def _freeze_parameters(self) -> None:
        for param in self.parameters():
            param.requires_grad = False
        self._requires_grad = False

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


def use_extractor_layout(speech: nn.Module, layout: str) -> str:
    """Put the feature encoder of ``layout`` into a transformers ``Wav2Vec2Model``:
    ``channels_first`` (transformers' own) or ``channels_last``. Returns what it used."""
    if layout == "channels_last" and not isinstance(
        speech.feature_extractor, ChannelsLastFeatureEncoder
    ):
        speech.feature_extractor = ChannelsLastFeatureEncoder(speech.feature_extractor)
    return layout
