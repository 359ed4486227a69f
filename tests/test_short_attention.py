"""``speech_attention`` / ``text_attention: triton_short``: short_attention's kernels compute
what SDPA computes, outputs and the gradients of queries, keys and values, for lengths below
one tile, of one tile and past it; inside the encoders a call with a padding mask runs SDPA;
off a GPU without Triton's interpreter the kind falls back to sdpa and says why. The kernels
run on the CPU under Triton's interpreter in a subprocess (``TRITON_INTERPRET`` is read when
they are defined). Their speed is measured on a GPU (benchmarks.kernel_probes attention)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.triton_interpreted import run_interpreted
from trainables.model.stage1 import build_model_with_attention

pytest.importorskip("triton", reason="the dev extras install Triton (its interpreter runs here)")


KERNELS = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from trainables.model.short_attention import fits, short_attention

    torch.manual_seed(0)

    def compare(batch, heads, length, head, dtype, tol, scale=None):
        # As transformers hands them over: (batch, length, heads * head) projections viewed as
        # (batch, heads, length, head), so not contiguous; the output's gradient a view too.
        qkv = [torch.randn(batch, length, heads * head).to(dtype) for _ in range(3)]
        q, k, v = (x.view(batch, length, heads, head).transpose(1, 2).requires_grad_()
                   for x in qkv)
        assert fits(q, k) and not q.is_contiguous()
        out = short_attention(q, k, v, scale)
        assert out.shape == (batch, length, heads, head) and out.dtype == dtype
        grad = torch.randn(batch, heads, length, head).to(dtype).transpose(1, 2)
        got = [out, *torch.autograd.grad(out, (q, k, v), grad)]
        ref = [x.detach().float().requires_grad_() for x in (q, k, v)]
        want = F.scaled_dot_product_attention(*ref, scale=scale).transpose(1, 2)
        want = [want, *torch.autograd.grad(want, ref, grad.float())]
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = (a.float() - b).abs().max().item()
            assert err <= tol * b.abs().max().item(), (length, head, dtype, name, err)

    # Below one tile of queries, a tile of 64, a length that is no power of two (2 s of
    # speech: 99 frames), one past a power of two (two query blocks, keys padded to 256), a
    # scale of its own; half precision (the products in it, softmax in float32).
    compare(2, 3, 5, 16, torch.float32, 1e-5)
    compare(1, 2, 64, 32, torch.float32, 1e-5)
    compare(2, 2, 99, 16, torch.float32, 1e-5, scale=0.3)
    compare(1, 2, 130, 64, torch.float32, 1e-5)
    compare(2, 2, 99, 32, torch.float16, 2e-3)
    # What it does not take: another length for the keys, a length past one tile, an odd
    # head size.
    q = torch.randn(1, 2, 300, 16)
    assert not fits(q, q) and not fits(q[..., :12], q[..., :12])
    assert not fits(q[:, :, :8], q[:, :, :9])
    print("interpreted ok")
    """
)

ENCODERS = textwrap.dedent(
    """
    import torch
    from trainables.model import short_attention
    from trainables.model.stage1 import build_model_with_attention

    torch.manual_seed(0)
    calls = []
    kernel = short_attention.short_attention
    short_attention.short_attention = lambda *a: calls.append(a[0].shape) or kernel(*a)
    cpu = dict(device=torch.device("cpu"), precision="fp32")
    fast, effective = build_model_with_attention(
        "tiny", 16, speech="triton_short", text="triton_short", dropout=0.0, **cpu)
    plain, _ = build_model_with_attention("tiny", 16, speech="sdpa", text="sdpa", dropout=0.0,
                                          **cpu)
    plain.load_state_dict(fast.state_dict())
    assert effective["speech_attention_effective"] == "triton_short", effective
    assert effective["text_attention_effective"] == "triton_short" and not effective["fallbacks"]

    audio, ids = torch.randn(3, 16000), torch.randint(5, 100, (3, 8))
    full = torch.ones(3, 8, dtype=torch.long)
    padded = full.clone()
    padded[1, 5:] = 0
    for text_mask, kernel_calls in ((full, 4), (padded, 2)):
        calls.clear()
        got = fast(audio, ids, text_mask=text_mask)
        want = plain(audio, ids, text_mask=text_mask)
        # BERT's all-ones mask is dropped by transformers: 2 speech + 2 text layers run the
        # kernel; a padded text batch runs SDPA in the text layers (the speech ones keep it).
        assert len(calls) == kernel_calls, (calls, kernel_calls)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        loss_a, loss_b = (sum(x.pow(2).sum() for x in out) for out in (got, want))
        for x, y in zip(torch.autograd.grad(loss_a, list(fast.parameters())),
                        torch.autograd.grad(loss_b, list(plain.parameters())), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    # transformers' attention dropout (0.1): training calls run SDPA, and the run is told.
    _, effective = build_model_with_attention("tiny", 16, speech="triton_short", text="sdpa",
                                              **cpu)
    assert effective["fallbacks"] == (
        "speech: triton_short takes no attention dropout; training calls use sdpa"
    ), effective
    print("interpreted ok")
    """
)


def test_the_kernels_equal_sdpa_and_its_gradients():
    assert "interpreted ok" in run_interpreted(KERNELS)


def test_in_the_encoders_it_equals_sdpa_and_hands_masked_calls_to_sdpa():
    assert "interpreted ok" in run_interpreted(ENCODERS)


def test_without_a_gpu_or_interpreter_it_falls_back_to_sdpa_and_says_so(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model, effective = build_model_with_attention(
        "tiny", 16, speech="triton_short", text="triton_short", device=torch.device("cpu"),
        precision="fp32", dropout=0.0,
    )  # fmt: skip
    assert effective["speech_attention_effective"] == "sdpa"
    assert effective["text_attention_effective"] == "sdpa"
    assert effective["fallbacks"] == (
        "speech: triton_short needs a CUDA GPU, used sdpa; "
        "text: triton_short needs a CUDA GPU, used sdpa"
    )
    assert model.speech.config._attn_implementation == "sdpa"
