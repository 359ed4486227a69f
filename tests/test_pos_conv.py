"""The `pos_conv` and `extractor_layout` keys compute transformers' convolutions: values and
every gradient, at every frame count (the engine's use of them: tests/test_strategies.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import Wav2Vec2Config, Wav2Vec2Model

from trainables.model.extractor import ChannelsLastFeatureEncoder, MatmulFeatureEncoder
from trainables.model.pos_conv import MatmulPositionalConv, block_for


def _pos_conv(**config) -> torch.nn.Module:
    torch.manual_seed(0)
    return Wav2Vec2Model(Wav2Vec2Config(**config)).encoder.pos_conv_embed.double()


SMALL = dict(
    hidden_size=32,
    num_attention_heads=2,
    num_hidden_layers=1,
    intermediate_size=64,
    conv_dim=(32,) * 7,
)


@pytest.mark.parametrize(
    "config",
    [
        dict(SMALL, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        dict(SMALL, num_conv_pos_embeddings=15, num_conv_pos_embedding_groups=2),  # odd kernel
        # base's kernel (128) and group width (48), on fewer channels: a long reach
        dict(SMALL, hidden_size=96, num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=2),
    ],
    ids=["k16", "k15-odd", "k128"],
)
@pytest.mark.parametrize("frames", [1, 7, 50, 100, 257])
def test_matmul_equals_the_convolution_and_its_gradients(config, frames):
    conv = _pos_conv(**config)
    x = torch.randn(2, frames, conv.conv.in_channels, dtype=torch.float64, requires_grad=True)
    _assert_computes_the_convolution(MatmulPositionalConv(conv), conv, x)


def _assert_computes_the_convolution(matmul, conv, x) -> None:
    """``matmul(x)`` equals ``conv(x)``, and so do the gradients of x and every parameter."""
    params = [x, *conv.parameters()]
    y_conv = conv(x)
    grads_conv = torch.autograd.grad(y_conv.pow(2).sum(), params)
    y_matmul = matmul(x)
    grads_matmul = torch.autograd.grad(y_matmul.pow(2).sum(), params)
    torch.testing.assert_close(y_matmul, y_conv, rtol=1e-10, atol=1e-10)
    for mine, theirs in zip(grads_matmul, grads_conv, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=1e-9)


def test_blocks_are_short_and_grow_only_for_long_or_large_inputs():
    # base: kernel 128, 768 channels in 16 groups
    assert block_for(256, 100, 128, 768, 16) == 8  # the best point (measured fastest on an H200)
    assert block_for(4, 100, 128, 768, 16) == 8  # the matrix dominates: the smallest one
    assert block_for(256, 1000, 128, 768, 16) == 16  # the windows dominate: fewer copies
    assert block_for(2048, 400, 128, 768, 16) == 16


@pytest.mark.parametrize("encoder", [ChannelsLastFeatureEncoder, MatmulFeatureEncoder])
@pytest.mark.parametrize("norm", ["group", "layer"])
# 8,000 samples: 24 frames; odd frame counts in every layer at 8,003 and 24,005; 400: one frame
@pytest.mark.parametrize("samples", [400, 8000, 8003, 24005])
def test_the_extractor_layouts_equal_transformers_and_its_gradients(encoder, norm, samples):
    torch.manual_seed(0)
    config = Wav2Vec2Config(**SMALL, feat_extract_norm=norm, conv_bias=norm == "layer")
    plain = Wav2Vec2Model(config).feature_extractor.double()
    other = encoder(plain)
    audio = torch.randn(3, samples, dtype=torch.float64)
    out_plain = plain(audio)
    grads_plain = torch.autograd.grad(out_plain.pow(2).sum(), list(plain.parameters()))
    out = other(audio)
    grads = torch.autograd.grad(out.pow(2).sum(), list(plain.parameters()))
    torch.testing.assert_close(out, out_plain, rtol=1e-10, atol=1e-10)
    for mine, theirs in zip(grads, grads_plain, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=1e-9)
    assert (
        out.transpose(1, 2).stride(-1) == 1
    )  # channels-last memory: the projection's transpose is free


def test_matmul_extractor_groupnorm_skips_the_rows_past_an_items_frames():
    # 32,000 samples: 6,399 first-layer frames in a buffer of 6,400 rows (64 x 100); the padded
    # row would shift each channel's mean if it were counted. Large audio values make it show.
    torch.manual_seed(0)
    plain = Wav2Vec2Model(Wav2Vec2Config(**SMALL)).feature_extractor.double()
    audio = 100 * torch.randn(2, 32000, dtype=torch.float64)
    out = MatmulFeatureEncoder(plain)(audio)
    assert out.shape == (2, 32, 99)
    torch.testing.assert_close(out, plain(audio), rtol=1e-10, atol=1e-10)


def test_matmul_extractor_keeps_float16_gradients_finite_on_constant_audio():
    # Constant audio: the first layer's frames have (almost) no variance, so its padded row,
    # normalised by their statistics, would be ~1/sqrt(eps) large; with a large GroupNorm gain
    # it overflowed float16 in the next GEMM and 0 x inf made the weight gradients NaN.
    torch.manual_seed(0)
    plain = Wav2Vec2Model(Wav2Vec2Config(**SMALL)).feature_extractor
    with torch.no_grad():
        plain.conv_layers[0].layer_norm.weight.fill_(300.0)
    audio = torch.full((2, 32000), -1.0)  # 6,399 first-layer frames in 6,400 rows
    with torch.autocast("cpu", dtype=torch.float16):
        out = MatmulFeatureEncoder(plain)(audio)
    grads = torch.autograd.grad(out.float().pow(2).sum(), list(plain.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)


def test_matmul_extractor_traces_in_one_graph_with_dynamic_samples():
    torch.manual_seed(0)
    plain = Wav2Vec2Model(Wav2Vec2Config(**SMALL)).feature_extractor
    compiled = torch.compile(
        MatmulFeatureEncoder(plain), backend="eager", dynamic=True, fullgraph=True
    )
    for samples in (8000, 9001):
        audio = torch.randn(2, samples)
        torch.testing.assert_close(compiled(audio), plain(audio), rtol=1e-4, atol=1e-4)


def test_matmul_traces_in_one_graph_with_dynamic_frames():
    # limit_longest batches under compile_dynamic: the frame count is symbolic; no graph break
    matmul = MatmulPositionalConv(_pos_conv(**SMALL, num_conv_pos_embeddings=16))
    compiled = torch.compile(matmul, backend="eager", dynamic=True, fullgraph=True)
    for frames in (30, 41):
        x = torch.randn(2, frames, 32, dtype=torch.float64)
        torch.testing.assert_close(compiled(x), matmul(x))


@pytest.mark.parametrize("block", [1, 4, 8, 32])
def test_every_block_length_computes_the_convolution(block):
    """The block-Toeplitz matrix (the skew trick) at block lengths block_for would not pick
    here: shorter and longer than the kernel's reach, and a block of one frame."""
    conv = _pos_conv(**SMALL, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    matmul = MatmulPositionalConv(conv)
    matmul.block = block
    x = torch.randn(3, 37, conv.conv.in_channels, dtype=torch.float64, requires_grad=True)
    _assert_computes_the_convolution(matmul, conv, x)
