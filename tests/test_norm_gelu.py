"""The `extractor_norm` key: norm_gelu's Triton kernels compute what the GEMM feature encoder's
torch GroupNorm and GELU compute (outputs and every gradient), run on the CPU under Triton's
interpreter in a subprocess (``TRITON_INTERPRET`` is read when the kernels are defined); where
they cannot run, the encoder falls back to torch and says so. Their speed is measured on a GPU
(benchmarks.kernel_probes groupnorm)."""

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
    from trainables.model import norm_gelu
    from trainables.model.extractor import MatmulFeatureEncoder, _group_norm_over_time

    torch.manual_seed(0)

    def torch_form(x, frames, norm):
        return F.gelu(_group_norm_over_time(x, frames, norm)).to(x.dtype)

    def compare(batch, rows, channels, frames, offset, dtype, tol):
        norm = torch.nn.GroupNorm(channels, channels)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        x = (torch.randn(batch, rows, channels) * 2 + offset).to(dtype).requires_grad_()
        grad = torch.randn(batch, rows, channels).to(dtype)
        got = [norm_gelu.group_norm_gelu(x, norm.weight, norm.bias, frames, norm.eps)]
        got += torch.autograd.grad(got[0], (x, norm.weight, norm.bias), grad)
        want = [torch_form(x, frames, norm)]
        want += torch.autograd.grad(want[0], (x, norm.weight, norm.bias), grad)
        assert got[0].dtype == dtype and got[1].dtype == dtype
        assert not got[0][:, frames:].any() and not got[1][:, frames:].any()
        for name, a, b in zip(("y", "dx", "dw", "db"), got, want):
            scale = b.abs().max().item()
            err = (a.float() - b.float()).abs().max().item()
            assert err <= tol * scale, (batch, rows, channels, frames, offset, dtype, name, err)

    # frames < rows (the rows past them are zero, never counted); a small batch split over
    # rows; channels not a multiple of the tile; a mean 500 spreads wide (the shift keeps the
    # float32 variance); bfloat16 in and out.
    compare(3, 200, 128, 170, 0.0, torch.float32, 1e-5)
    compare(2, 640, 96, 633, 0.0, torch.float32, 1e-5)
    compare(2, 320, 64, 320, 500.0, torch.float32, 1e-4)
    compare(4, 130, 128, 129, 3.0, torch.bfloat16, 2e-2)

    # The encoder with the kernels equals the encoder without, gradients included.
    plain = Wav2Vec2Model(Wav2Vec2Config(**SMALL)).feature_extractor
    with torch.no_grad():
        plain.conv_layers[0].layer_norm.weight.uniform_(0.5, 1.5)
        plain.conv_layers[0].layer_norm.bias.uniform_(-0.5, 0.5)
    fused, ops = MatmulFeatureEncoder(copy.deepcopy(plain)), MatmulFeatureEncoder(plain)
    assert fused.use_norm("triton", torch.device("cpu")) == "triton"
    assert ops.use_norm("torch", torch.device("cpu")) == "torch"
    audio = torch.randn(3, 2003)
    a, b = fused(audio), ops(audio)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    ga = torch.autograd.grad(a.pow(2).sum(), list(fused.parameters()))
    gb = torch.autograd.grad(b.pow(2).sum(), list(ops.parameters()))
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-4)  # float32 sums, other order
    print("interpreted ok")
    """
)


def test_the_triton_kernels_equal_the_torch_form_and_its_gradients():
    assert "interpreted ok" in run_interpreted(INTERPRETED)


def test_without_a_gpu_or_interpreter_the_norm_falls_back_to_torch_and_says_so(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    speech = Wav2Vec2Model(Wav2Vec2Config(**SMALL))
    assert use_extractor_layout(speech, "matmul", "triton") == "torch"
    assert speech.feature_extractor.fused_norm is None
    assert use_extractor_layout(speech, "matmul", "auto") == "torch"
    # the layout it does not apply to: the torch GroupNorm, whatever was asked
    other = Wav2Vec2Model(Wav2Vec2Config(**SMALL))
    assert use_extractor_layout(other, "channels_first", "auto") == "torch"


def test_the_kernels_are_used_only_for_the_layer_they_compute(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # "runnable" here; nothing is run
    cpu = torch.device("cpu")
    assert small_encoder().use_norm("triton", cpu) == "triton"
    assert small_encoder().use_norm("auto", cpu) == "folded"  # the faster of the two
    assert small_encoder().use_norm("torch", cpu) == "torch"
    assert small_encoder(feat_extract_norm="layer").use_norm("triton", cpu) == "torch"  # LayerNorms
    assert (
        small_encoder(feat_extract_activation="gelu_new").use_norm("triton", cpu) == "torch"
    )  # tanh
