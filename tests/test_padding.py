"""The encoders' padding masks without a host sync (trainables/model/padding.py): the numbers
transformers computes, and no operation that makes the host wait for the GPU.

A host sync cannot be seen on a CPU, so the operations that cause one on a GPU are caught where
they are dispatched: reading a tensor's value on the host (`_local_scalar_dense`: `.item()`, a
tensor in an `if`), counting non-zeros, and indexing with a boolean mask (which counts them)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Wav2Vec2Config, Wav2Vec2Model

from trainables.engine.shapes import shape_batch
from trainables.model.padding import frame_mask, padding_changes_code, speech_states
from trainables.model.stage1 import (
    _TINY_SPEECH,
    build_model,
    contrastive_loss,
    dropout_overrides,
)

HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}


class HostSyncs(TorchDispatchMode):
    """Records every dispatched operation that would make the host wait for a GPU."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            self.seen.append(name)
        elif name in INDEXING and any(
            i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]
        ):
            self.seen.append(f"{name} (boolean index)")
        return func(*args, **(kwargs or {}))


def padded_batch(rows: int = 4, samples: int = 16_000, tokens: int = 20) -> dict:
    """Random audio and ids, rows 1 and 3 of the audio and row 0 of the text padded."""
    g = torch.Generator().manual_seed(0)
    audio_mask = torch.ones(rows, samples, dtype=torch.bool)
    audio_mask[1, 9_000:] = False
    audio_mask[3, 3_000:] = False
    text_mask = torch.ones(rows, tokens, dtype=torch.long)
    text_mask[0, tokens // 2 :] = 0
    return {
        "audio": torch.randn(rows, samples, generator=g),
        "input_ids": torch.randint(5, 100, (rows, tokens), generator=g),
        "audio_mask": audio_mask,
        "text_mask": text_mask,
    }


def transformers_forward(model, batch):
    """Stage1Model.forward as it was: transformers' own encoder forwards and frame mask."""
    frames = model.speech(batch["audio"], attention_mask=batch["audio_mask"]).last_hidden_state
    mask = model.speech._get_feature_vector_attention_mask(frames.shape[1], batch["audio_mask"])
    mask = mask.unsqueeze(-1).to(frames.dtype)
    pooled = (frames * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    cls = model.text(batch["input_ids"], attention_mask=batch["text_mask"]).last_hidden_state
    return frames, pooled, cls[:, 0]


@pytest.mark.parametrize("kind", ["sdpa", "eager", "sdpa_math"])
def test_the_model_computes_what_transformers_computes_without_a_host_sync(kind):
    model = build_model("tiny", 16, speech_attention=kind, text_attention=kind, dropout=0.0)
    batch = padded_batch()
    frames, pooled, cls = transformers_forward(model, batch)
    with HostSyncs() as before:
        transformers_forward(model, batch)
    # The detector sees what transformers does: a boolean fill and two `.all()` in an `if`.
    assert before.seen == ["index_put_ (boolean index)"] + ["_local_scalar_dense"] * 2

    ours, ours_mask = speech_states(model.speech, batch["audio"], batch["audio_mask"])
    assert torch.equal(ours, frames)
    assert torch.equal(
        ours_mask,
        model.speech._get_feature_vector_attention_mask(frames.shape[1], batch["audio_mask"]),
    )
    with HostSyncs() as step:
        speech, text, scale = model(**batch)
        contrastive_loss(speech, text, scale).backward()
    assert step.seen == []
    proj = torch.nn.functional.normalize
    assert torch.equal(speech, proj(model.speech_proj(pooled), dim=-1))
    assert torch.equal(text, proj(model.text_proj(cls), dim=-1))

    model.sync_free_masks = False  # padding_masks: transformers, to measure the difference
    with HostSyncs() as old:
        assert all(map(torch.equal, model(**batch), (speech, text, scale)))
    assert old.seen == before.seen
    assert padding_changes_code(model) is True


def test_a_large_wav2vec2_and_its_stable_layer_norm_compute_as_in_transformers():
    config = Wav2Vec2Config(
        **_TINY_SPEECH,
        do_stable_layer_norm=True,
        feat_extract_norm="layer",
        mask_time_prob=0.0,
        layerdrop=0.0,
        **dropout_overrides(0.0)[0],
        attn_implementation="sdpa",
    )
    speech, batch = Wav2Vec2Model(config), padded_batch()
    expected = speech(batch["audio"], attention_mask=batch["audio_mask"]).last_hidden_state
    with HostSyncs() as syncs:
        ours, _ = speech_states(speech, batch["audio"], batch["audio_mask"])
    assert torch.equal(ours, expected) and syncs.seen == []


def test_an_encoder_it_cannot_follow_goes_through_transformers_with_the_same_frame_mask():
    """An adapter shortens the frames; LayerDrop in training: transformers' forward, as before."""
    config = Wav2Vec2Config(
        **_TINY_SPEECH, add_adapter=True, num_adapter_layers=1, attn_implementation="sdpa"
    )
    speech, batch = Wav2Vec2Model(config).eval(), padded_batch()
    hidden, mask = speech_states(speech, batch["audio"], batch["audio_mask"])
    expected = speech(batch["audio"], attention_mask=batch["audio_mask"]).last_hidden_state
    assert torch.equal(hidden, expected)
    assert torch.equal(
        mask, speech._get_feature_vector_attention_mask(hidden.shape[1], batch["audio_mask"])
    )
    assert padding_changes_code(type("M", (), {"speech": speech, "text": None})) is True


def test_the_frame_mask_is_transformers_from_the_lengths():
    speech = build_model("tiny", 16).speech
    samples = 16_000
    lengths = torch.tensor([samples, 400, 401, 719, 720, 12_345, 16_000 - 320])
    audio_mask = torch.arange(samples) < lengths[:, None]
    frames = speech._get_feat_extract_output_lengths(torch.tensor(samples)).item()
    assert torch.equal(
        frame_mask(speech, audio_mask, frames),
        speech._get_feature_vector_attention_mask(frames, audio_mask),
    )
    # Shorter than one frame: transformers keeps every frame, this keeps the first.
    short = frame_mask(speech, torch.arange(samples)[None] < 399, frames)
    assert short[0].tolist() == [True] + [False] * (frames - 1)


def test_the_compile_warm_up_batch_is_padded_as_the_loaders():
    model = build_model("tiny", 16)
    assert padding_changes_code(model) is False  # one compiled code, padded or not
    batch = shape_batch(3, 800, 8, "cpu", padded=True)
    assert "audio_mask" not in batch and batch["text_mask"][-1].tolist() == [1] * 4 + [0] * 4
    masked = shape_batch(3, 800, 8, "cpu", masked=True, padded=True)
    assert masked["audio_mask"][-1].sum() == 400 and masked["audio_mask"][:2].all()


def test_a_ddp_engines_forward_and_backward_read_nothing_on_the_host(gloo_world_of_one):
    """The whole step but the optimizer (on a CPU, AdamW reads each parameter's step count, a
    host tensor; fused AdamW on a GPU keeps them on the device), under each padding_masks."""
    from trainables.config import TrialConfig
    from trainables.engine import build_engine

    # the fill, the two `.all()`, and the fill's backward (a boolean index again)
    transformers = ["index_put_ (boolean index)"] + ["_local_scalar_dense"] * 2
    transformers.append("index_put (boolean index)")
    for padding_masks, expected in (("sync_free", []), ("transformers", transformers)):
        cfg = TrialConfig(
            model_size="tiny", proj_dim=16, use_gpu=False, padding_masks=padding_masks
        )
        engine = build_engine(cfg, torch.device("cpu"))
        with HostSyncs() as syncs, engine.accumulating(True):
            speech, text, scale = engine(padded_batch())
            engine.backward(contrastive_loss(speech.float(), text.float(), scale.float()))
        assert syncs.seen == expected
