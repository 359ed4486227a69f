"""The stage-1 model and its contrastive loss."""

import math
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from tests import _gloo_loss_worker
from tests._forked import start
from trainables.data.loader import SyntheticSpeechText
from trainables.data.manifest import collate_padded
from trainables.model.stage1 import build_model, contrastive_loss


def batch(n=4, seconds=1.0, tokens=16):
    ds = SyntheticSpeechText(
        num_items=n, audio_samples=int(seconds * 16000), text_tokens=tokens, vocab_size=1000, seed=0
    )
    return collate_padded([ds[i] for i in range(n)])


def test_tiny_model_embeds_into_one_normalised_space():
    torch.manual_seed(0)
    model = build_model("tiny", proj_dim=24)
    s, t, scale = model(**batch())
    assert s.shape == t.shape == (4, 24)
    assert torch.allclose(s.norm(dim=-1), torch.ones(4), atol=1e-5)
    assert scale.shape == (1,) and scale.item() == pytest.approx(1 / 0.07, rel=1e-4)


def test_every_parameter_gets_a_gradient_every_step():
    # DDP (without find_unused_parameters) and ZeRO need the same set of parameters to receive
    # gradients at every step; LayerDrop or SpecAugment would break that.
    torch.manual_seed(0)
    model = build_model("tiny", proj_dim=16)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        contrastive_loss(*model(**batch())).backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert missing == []


def test_the_feature_encoder_takes_no_gradient_of_the_audio_and_compiles_in_one_graph():
    # transformers marks the raw audio as requiring grad (for its gradient checkpointing): a
    # wasted input gradient and, under torch.compile, a graph break in every feature encoder call.
    torch.manual_seed(0)
    model = build_model("tiny", proj_dim=16).train()
    encoder = model.speech.feature_extractor
    audio = batch()["audio"]
    hidden = torch.compile(encoder, backend="eager", fullgraph=True)(audio)  # raises at a break
    hidden.sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())


def test_base_sizes_match_wav2vec2_base_and_bert_base():
    model = build_model("base", proj_dim=256)
    speech = sum(p.numel() for p in model.speech.parameters())
    text = sum(p.numel() for p in model.text.parameters())
    assert 94e6 < speech < 96e6  # wav2vec2-base: ~95 M
    assert 108e6 < text < 110e6  # bert-base-uncased without pooler: ~109 M
    assert model.logit_scale.dim() == 1  # not 0-dim: ZeRO cannot flatten 0-dim bf16 params


def test_loss_of_unrelated_embeddings_is_near_ln_batch_and_falls_when_matched():
    torch.manual_seed(0)
    n = 16
    s = F.normalize(torch.randn(n, 32), dim=-1)
    t = F.normalize(torch.randn(n, 32), dim=-1)
    random_loss = contrastive_loss(s, t, torch.tensor([1.0]), scope="local").item()
    assert random_loss == pytest.approx(math.log(n), rel=0.1)
    matched = contrastive_loss(s, s, torch.tensor([10.0]), scope="local").item()
    assert matched < 0.1 * math.log(n)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_global_loss_over_two_gloo_ranks_equals_the_full_batch_loss():
    torch.manual_seed(0)
    speech = F.normalize(torch.randn(8, 16), dim=-1)
    text = F.normalize(torch.randn(8, 16), dim=-1)
    full_s, full_t = speech.clone().requires_grad_(True), text.clone().requires_grad_(True)
    full = contrastive_loss(full_s, full_t, torch.tensor([10.0]), scope="local")
    full.backward()

    out = mp.Manager().dict()
    # Forked from the session's preloaded server (tests/_forked.py): no fresh imports per rank.
    start(_gloo_loss_worker.run, (2, free_port(), speech, text, out), nprocs=2)
    losses = [out[r][0] for r in range(2)]
    # The mean of the ranks' losses is the full-batch loss (what DDP's averaging optimises) ...
    assert sum(losses) / 2 == pytest.approx(full.item(), rel=1e-5)
    # ... and each rank's gradient is the sum over all ranks' losses, i.e. 2x the full one.
    for r in range(2):
        rows = slice(4 * r, 4 * r + 4)
        assert torch.allclose(out[r][1], 2 * full_s.grad[rows], atol=1e-6)
        assert torch.allclose(out[r][2], 2 * full_t.grad[rows], atol=1e-6)


def test_attention_kinds_compute_the_same_model_and_unavailable_ones_fall_back():
    from trainables.model.stage1 import build_model_with_attention

    cpu = torch.device("cpu")
    outs = {}
    for kind in ("eager", "sdpa"):
        torch.manual_seed(0)
        model, used = build_model_with_attention(
            "tiny", 16, speech=kind, text=kind, device=cpu, precision="fp32"
        )
        assert used["speech_attention_effective"] == used["text_attention_effective"] == kind
        model.eval()
        with torch.no_grad():
            outs[kind] = model(**batch())[0]
    assert torch.allclose(outs["eager"], outs["sdpa"], atol=1e-5)
    _, used = build_model_with_attention(
        "tiny", 16, speech="flash_attention_2", text="auto", device=cpu, precision="bf16"
    )
    assert (
        used["speech_attention_effective"] == "sdpa" and used["text_attention_effective"] == "sdpa"
    )
    assert "speech: flash_attention_2 needs a GPU" in used["fallbacks"]


def test_the_dropout_key_sets_every_dropout_of_both_encoders_and_is_checked():
    """dropout (issue 56): 0 turns every dropout of both encoders off, so a training-mode
    forward is deterministic; `model` keeps transformers' 0.1; a rate outside [0, 1) is one
    line."""
    from trainables.config import ConfigError, TrialConfig

    inputs = batch()
    torch.manual_seed(0)
    off = build_model("tiny", 16, dropout=0.0).train()
    rates = [m.p for m in off.modules() if isinstance(m, torch.nn.Dropout)]
    assert rates and set(rates) == {0.0}
    with torch.no_grad():
        first, second = off(**inputs), off(**inputs)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    default = build_model("tiny", 16).train()
    assert {m.p for m in default.modules() if isinstance(m, torch.nn.Dropout)} >= {0.1}
    with torch.no_grad():
        assert not torch.equal(default(**inputs)[0], default(**inputs)[0])
    assert TrialConfig.from_dict({"dropout": 0}).dropout == 0.0
    assert TrialConfig().dropout == "model"
    with pytest.raises(ConfigError, match=r"^dropout: a rate in \[0, 1\) or model, got 1.5$"):
        TrialConfig.from_dict({"dropout": 1.5})
