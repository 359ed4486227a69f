"""``extractor_norm: folded``: folded_layer's kernels compute what the GEMM feature encoder's
unfolded first layer (the convolution as a GEMM, GroupNorm over each item's frames, GELU)
computes, outputs and the gradients of the convolution's taps and the norm's affine
parameters, run on the CPU under Triton's interpreter in a subprocess (``TRITON_INTERPRET`` is
read when the kernels are defined). Their speed is measured on a GPU
(benchmarks.kernel_probes firstlayer)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from transformers import Wav2Vec2Config, Wav2Vec2Model

from tests.triton_interpreted import SMALL, run_interpreted, small_encoder
from trainables.model.extractor import use_extractor_layout

pytest.importorskip("triton", reason="the dev extras install Triton (its interpreter runs here)")


INTERPRETED = textwrap.dedent(
    """
    import copy
    import torch
    import torch.nn.functional as F
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    from trainables.model import folded_layer
    from trainables.model.extractor import (
        MatmulFeatureEncoder, _first_conv, _group_norm_over_time,
    )

    torch.manual_seed(0)

    def unfolded(audio, conv, norm, rows, frames, dtype):
        hidden = _first_conv(audio.to(dtype), conv, rows)
        return F.gelu(_group_norm_over_time(hidden, frames, norm)).to(dtype)

    def compare(batch, samples, channels, rows_multiple, offset, dtype, tol, bias=False):
        conv = torch.nn.Conv1d(1, channels, 10, 5, bias=bias)
        norm = torch.nn.GroupNorm(channels, channels)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        audio = torch.randn(batch, samples) * 0.3 + offset
        audio[0] *= torch.linspace(0, 3, samples)  # items of other spreads
        frames = (samples - 10) // 5 + 1
        rows = -(-frames // rows_multiple) * rows_multiple
        params = [conv.weight, norm.weight, norm.bias]
        got = [folded_layer.folded_conv_norm_gelu(audio, conv, norm, rows, frames, dtype)]
        grad = torch.randn(got[0].shape).to(dtype)
        got += torch.autograd.grad(got[0], params, grad)
        # the reference in float32 (the folded statistics are float32 whatever the output)
        want = [unfolded(audio, conv, norm, rows, frames, torch.float32)]
        want += torch.autograd.grad(want[0], params, grad.float())
        assert got[0].dtype == dtype and got[0].shape == (batch, rows, channels)
        assert not got[0][:, frames:].any()  # the rows past the frames are zero
        for name, a, b in zip(("y", "d taps", "d gamma", "d beta"), got, want):
            scale = b.abs().max().item()
            err = (a.float() - b.float()).abs().max().item()
            assert err <= tol * scale, (batch, samples, channels, offset, dtype, name, err, scale)

    # frames < rows; a batch of two split over rows (the backward's partial sums); channels
    # not a multiple of the tile; a large offset (the windows are centred before their
    # covariance); a bias (it cancels); bfloat16 out.
    compare(3, 2003, 64, 8, 0.0, torch.float32, 1e-4)
    compare(2, 4000, 96, 64, 0.0, torch.float32, 1e-4)
    compare(2, 1500, 64, 1, 30.0, torch.float32, 1e-3, bias=True)
    compare(4, 1203, 128, 16, 0.0, torch.bfloat16, 2e-2)

    # The encoder folded equals the encoder unfolded, gradients included.
    plain = Wav2Vec2Model(Wav2Vec2Config(**SMALL)).feature_extractor
    with torch.no_grad():
        plain.conv_layers[0].layer_norm.weight.uniform_(0.5, 1.5)
        plain.conv_layers[0].layer_norm.bias.uniform_(-0.5, 0.5)
    folded, ops = MatmulFeatureEncoder(copy.deepcopy(plain)), MatmulFeatureEncoder(plain)
    assert folded.use_norm("folded", torch.device("cpu")) == "folded"
    assert ops.use_norm("torch", torch.device("cpu")) == "torch"
    audio = torch.randn(3, 2003)
    a, b = folded(audio), ops(audio)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    ga = torch.autograd.grad(a.pow(2).sum(), list(folded.parameters()))
    gb = torch.autograd.grad(b.pow(2).sum(), list(ops.parameters()))
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-3)  # float32 sums, other order
    print("interpreted ok")
    """
)


def test_the_folded_kernels_equal_the_unfolded_layer_and_its_gradients():
    assert "interpreted ok" in run_interpreted(INTERPRETED)


def test_without_a_gpu_or_interpreter_folded_falls_back_to_torch_and_says_so(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    speech = Wav2Vec2Model(Wav2Vec2Config(**SMALL))
    assert use_extractor_layout(speech, "matmul", "folded") == "torch"
    assert use_extractor_layout(speech, "matmul", "auto") == "torch"
    assert speech.feature_extractor.folded_layer is None
    assert speech.feature_extractor.fused_norm is None


def test_the_fold_is_used_only_for_the_layer_it_computes(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # "runnable" here; nothing is run
    cpu = torch.device("cpu")
    encoder = small_encoder()
    assert encoder.use_norm("folded", cpu) == "folded" and encoder.folded_layer is not None
    # asked again for another norm, the fold is dropped (resident workers reuse models)
    assert encoder.use_norm("triton", cpu) == "triton" and encoder.folded_layer is None
    assert small_encoder(feat_extract_norm="layer").use_norm("folded", cpu) == "torch"  # LayerNorms
    assert small_encoder(feat_extract_activation="gelu_new").use_norm("folded", cpu) == "torch"


def test_before_tf32_tensor_cores_auto_takes_norm_gelus_kernels_and_folded_falls_back(
    monkeypatch,
):
    # No GPU here: a CUDA device of compute capability 7.0 (a V100) stands in, Triton "on" it.
    from trainables.model import folded_layer, norm_gelu

    monkeypatch.setattr(norm_gelu, "available", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    cuda = torch.device("cuda")
    assert not folded_layer.available(cuda)
    assert small_encoder().use_norm("auto", cuda) == "triton"
    assert small_encoder().use_norm("folded", cuda) == "torch"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert small_encoder().use_norm("auto", cuda) == "folded"
    assert small_encoder().use_norm("triton", cuda) == "triton"
