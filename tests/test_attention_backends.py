"""The SDPA backend kinds of speech_attention / text_attention (issue 56): each builds and
trains, computes what plain sdpa computes, runs each encoder under its own backend (compiled
too), keeps every parameter name, falls back to sdpa with the reason where its backend cannot
run (on this CPU: cuDNN and memory-efficient attention; flash under attention dropout), and a
bad value is one line naming the key."""

import pytest
import torch

from trainables.config import ConfigError, TrialConfig
from trainables.data.loader import SyntheticSpeechText
from trainables.data.manifest import collate_padded
from trainables.model import attention
from trainables.model.attention import SDPA_BACKENDS
from trainables.model.stage1 import build_model_with_attention, contrastive_loss

CPU = torch.device("cpu")


def padded_batch(n=4):
    """Rows of different audio and text lengths: both encoders get a padding mask."""
    ds = SyntheticSpeechText(
        num_items=n, audio_samples=8000, text_tokens=12, vocab_size=1000, seed=0
    )
    items = [ds[i] for i in range(n)]
    for i, item in enumerate(items):
        keep = 8000 - 1500 * i
        item["audio"], item["audio_len"] = item["audio"][:keep], keep
        item["input_ids"] = item["input_ids"][: 12 - 2 * i]
    batch = collate_padded(items)
    assert "audio_mask" in batch and not batch["text_mask"].all()
    return batch


def build(speech="sdpa", text="sdpa", dropout=0.0):
    torch.manual_seed(0)
    return build_model_with_attention(
        "tiny", 16, speech=speech, text=text, device=CPU, precision="fp32", dropout=dropout
    )


@pytest.mark.parametrize("kind", sorted(SDPA_BACKENDS))
def test_each_kind_builds_trains_and_computes_what_sdpa_computes(kind):
    batch = padded_batch()
    reference, _ = build()
    model, used = build(kind, kind)
    # On a CPU: flash (torch's CPU kernel) and math run; cuDNN and efficient fall back.
    runs_here = kind in ("sdpa_flash", "sdpa_math")
    expected = kind if runs_here else "sdpa"
    assert used["speech_attention_effective"] == used["text_attention_effective"] == expected
    if not runs_here:
        for side in ("speech", "text"):
            assert f"{side}: {kind} needs a CUDA GPU, used sdpa" in used["fallbacks"]
    # Parameter names (state dicts, checkpoints) are the plain model's.
    assert list(model.state_dict()) == list(reference.state_dict())
    model.load_state_dict(reference.state_dict(), strict=True)
    reference.eval(), model.eval()
    with torch.no_grad():
        want, got = reference(**batch), model(**batch)
    for w, g in zip(want, got, strict=True):
        assert torch.allclose(w, g, atol=1e-5)
    model.train()
    contrastive_loss(*model(**batch)).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_backend_that_cannot_take_attention_dropout_falls_back_with_torch_s_reason():
    # torch's CPU flash kernel has no dropout; the encoders' own attention dropout is 0.1.
    model, used = build("sdpa_flash", "sdpa_math", dropout=None)
    assert used["speech_attention_effective"] == "sdpa"
    assert used["text_attention_effective"] == "sdpa_math"
    assert used["fallbacks"] == (
        "speech: sdpa_flash cannot run here (Both fused kernels do not support non-zero "
        "dropout.), used sdpa"
    )
    assert model.speech.config._attn_implementation == "sdpa"


def _spy_on_sdpa(monkeypatch) -> list[set[str]]:
    """The SDPA backends enabled at each attention call from now on."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append({b.name for b in torch.nn.attention._cur_sdpa_kernel_backends()})
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def test_each_encoder_runs_under_its_own_backend(monkeypatch):
    """speech's attention calls run on math alone, text's on flash alone; outside them every
    backend is enabled again."""
    model, used = build("sdpa_math", "sdpa_flash")
    assert (used["speech_attention_effective"], used["text_attention_effective"]) == (
        "sdpa_math",
        "sdpa_flash",
    )
    before = torch.nn.attention._cur_sdpa_kernel_backends()
    seen = _spy_on_sdpa(monkeypatch)
    model.eval()
    with torch.no_grad():
        model(**padded_batch())
    # Two tiny layers each: the speech encoder runs first.
    assert seen == [{"MATH"}] * 2 + [{"FLASH_ATTENTION"}] * 2
    assert torch.nn.attention._cur_sdpa_kernel_backends() == before


def test_masked_calls_of_a_backend_without_masks_run_plain_sdpa(monkeypatch):
    """Flash on a GPU takes no padding mask (torch's CPU flash does): the probe puts the kind
    in _NO_MASK, and then a padded batch's calls run plain sdpa, an unpadded one's flash."""
    model, _ = build("sdpa_flash", "sdpa_flash")
    monkeypatch.setattr(attention, "_NO_MASK", {"sdpa_flash"})
    seen = _spy_on_sdpa(monkeypatch)
    model.eval()
    batch = padded_batch()
    with torch.no_grad():
        model(**batch)
        everything = seen[0]
        assert len(everything) > 1 and seen == [everything] * 4
        seen.clear()
        model(batch["audio"][:, :1000], batch["input_ids"])  # no masks
    assert seen == [{"FLASH_ATTENTION"}] * 4


def test_the_backend_is_traced_into_a_compiled_layer():
    """Regional compilation (compile_scope layers): a layer compiles in one graph that sets
    the layer's backend order around its attention, and computes what eager does."""
    model, _ = build("sdpa_math", "sdpa_flash")
    layer = model.text.encoder.layer[0].eval()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    hidden = torch.randn(2, 6, 32)
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    with torch.no_grad():
        got, want = compiled(hidden), layer(hidden)
    got, want = (x[0] if isinstance(x, tuple) else x for x in (got, want))
    assert torch.allclose(got, want, atol=1e-6)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes]
    assert any("sdpa_kernel" in t for t in targets)  # traced, not a graph break


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_wrapped_engines_keep_the_plain_model_s_parameter_names(gloo_world_of_one, strategy):
    from trainables.engine.build import build_engine

    base = dict(model_size="tiny", proj_dim=16, use_gpu=False, dropout=0.0, strategy=strategy)
    names = {}
    for kind in ("sdpa", "sdpa_math"):
        cfg = TrialConfig(**base, speech_attention=kind, text_attention=kind)
        engine = build_engine(cfg, CPU)
        assert engine.effective["speech_attention_effective"] == kind
        names[kind] = list(engine.bare.state_dict())
        loss = contrastive_loss(*engine(padded_batch()))
        engine.backward(loss)
        engine.step()
        assert torch.isfinite(loss)
    assert names["sdpa_math"] == names["sdpa"]


def test_a_bad_value_is_one_line_naming_the_key_and_the_kinds():
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_dict({"speech_attention": "sdpa_xformers"})
    message = str(info.value)
    assert message.startswith("speech_attention:") and "\n" not in message
    assert "'sdpa_cudnn', 'sdpa_flash', 'sdpa_efficient', 'sdpa_math'" in message
