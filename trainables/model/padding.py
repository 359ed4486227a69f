"""The encoders' padding masks, built on the device with no host sync.

transformers builds them with host syncs: before the encoder layers it asks whether any row is
padded (`padding_mask.all()` in an `if`, to drop a mask that pads nothing), and wav2vec2 zeroes
its padded frames with a boolean index (`hidden_states[~mask] = 0`, which counts the True
entries first; its backward is a boolean index again). Each makes the host wait until the GPU
has run everything queued before it, so the GPU then idles while the host launches the next
kernels one by one. BERT's transcripts are padded to `text_tokens` in every batch, so every
step paid the first; a padded audio batch (batching duration: nearly every one) paid all of
them, and wav2vec2 computed its frame mask twice (a reversed cumulative sum over every audio
sample).

Here the same masks are built without asking: the layers get the 4D mask transformers would
build for a padded batch (its own `create_bidirectional_mask`, told not to drop it), padded
frames are zeroed by `masked_fill`, and the frame mask comes from the valid lengths once. The
numbers computed are the ones transformers computes (tests/test_padding.py compares them). A
batch that pads nothing now runs its layers with an all-true mask where transformers passed
none: the same result; and one compiled graph for padded and unpadded batches, not two.

Used for the attention kinds whose masks are transformers' `sdpa` or `eager` masks (sdpa, the
SDPA backend kinds of trainables/model/attention.py, eager). Others (flash_attention_2, which
takes the 2D mask) and a wav2vec2 with an adapter or LayerDrop go through transformers'
forward as before. The padding_masks key (`transformers`) runs transformers' own forwards, to
measure the difference."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["frame_mask", "layer_mask", "padding_changes_code", "speech_states", "text_states"]


def layer_mask(config, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask an encoder's layers take for the 2D padding ``mask`` (rows x positions), as
    transformers builds it for a padded batch, never dropped (no host sync); None where the
    config's attention kind builds its masks otherwise (the caller then passes the 2D mask)."""
    from transformers.masking_utils import create_bidirectional_mask

    if not _builds_4d_masks(config):
        return None
    # Only its shape, dtype (eager's fill value) and device are read.
    embeds = torch.empty((mask.shape[0], mask.shape[1], 0), dtype=dtype, device=mask.device)
    return create_bidirectional_mask(
        config=config, inputs_embeds=embeds, attention_mask=mask, allow_is_bidirectional_skip=False
    )


def _builds_4d_masks(config) -> bool:
    """Whether the config's attention kind takes transformers' sdpa or eager masks."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

    kind = config._attn_implementation
    return kind in ALL_MASK_ATTENTION_FUNCTIONS and ALL_MASK_ATTENTION_FUNCTIONS[kind] in (
        sdpa_mask,
        eager_mask,
    )


def padding_changes_code(model: nn.Module) -> bool:
    """Whether a batch that pads nothing runs other code in a Stage1Model's encoder layers than
    a padded one (an encoder whose masks transformers builds and drops when they pad nothing)."""
    return not (
        getattr(model, "sync_free_masks", True)
        and _sync_free_speech(model.speech)
        and _builds_4d_masks(model.text.config)
    )


def frame_mask(speech: nn.Module, audio_mask: torch.Tensor, frames: int) -> torch.Tensor:
    """Which of the feature encoder's ``frames`` frames each row holds, from its valid samples
    (bool, rows x frames): what transformers' `_get_feature_vector_attention_mask` gives, from
    the lengths instead of a reversed cumulative sum. A row too short for one frame keeps its
    first (transformers keeps them all): attention over no frame at all would be NaN."""
    lengths = speech._get_feat_extract_output_lengths(audio_mask.sum(-1)).clamp(min=1)
    return torch.arange(frames, device=audio_mask.device) < lengths[:, None]


def _sync_free_speech(speech: nn.Module) -> bool:
    config = speech.config
    return (
        speech.adapter is None
        and not (speech.training and config.layerdrop > 0)
        and not (speech.training and (config.mask_time_prob > 0 or config.mask_feature_prob > 0))
        and _builds_4d_masks(config)
    )


def speech_states(
    speech: nn.Module,
    audio: torch.Tensor,
    audio_mask: torch.Tensor | None,
    *,
    sync_free: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A transformers Wav2Vec2Model's last hidden states and, when ``audio_mask`` is given, its
    frame mask: Wav2Vec2Model.forward and its encoder's, step by step (both encoder forms:
    post-norm as wav2vec2-base, `do_stable_layer_norm` as the large ones), masks without a
    host sync. ``sync_free`` False (padding_masks: transformers): transformers' forward and
    frame mask."""
    if audio_mask is None:
        return speech(audio).last_hidden_state, None
    if not (sync_free and _sync_free_speech(speech)):
        hidden = speech(audio, attention_mask=audio_mask).last_hidden_state
        if not sync_free:
            return hidden, speech._get_feature_vector_attention_mask(hidden.shape[1], audio_mask)
        return hidden, frame_mask(speech, audio_mask, hidden.shape[1])
    features = speech.feature_extractor(audio).transpose(1, 2)
    frames = frame_mask(speech, audio_mask, features.shape[1])
    hidden, _ = speech.feature_projection(features)
    # SpecAugment: off (stage1._SPEECH_OVERRIDES; _sync_free_speech checks), so unchanged.
    hidden = speech._mask_hidden_states(hidden, attention_mask=frames)
    encoder = speech.encoder
    hidden = hidden.masked_fill(~frames[..., None], 0.0)
    mask = layer_mask(speech.config, frames, hidden.dtype)
    hidden = hidden + encoder.pos_conv_embed(hidden)
    stable = speech.config.do_stable_layer_norm
    if not stable:
        hidden = encoder.layer_norm(hidden)
    hidden = encoder.dropout(hidden)
    for layer in encoder.layers:
        hidden = layer(hidden, attention_mask=mask)
    if stable:
        hidden = encoder.layer_norm(hidden)
    return hidden, frames


def text_states(
    text: nn.Module,
    input_ids: torch.Tensor,
    text_mask: torch.Tensor | None,
    *,
    sync_free: bool = True,
) -> torch.Tensor:
    """A transformers BertModel's last hidden states, its layers' mask built without a host
    sync (BertModel takes a 4D mask as it is); ``sync_free`` False: as transformers builds it."""
    mask = text_mask
    if text_mask is not None and sync_free:
        dtype = text.get_input_embeddings().weight.dtype  # the embeddings' output dtype
        mask = layer_mask(text.config, text_mask, dtype)
        if mask is None:
            mask = text_mask
    return text(input_ids, attention_mask=mask).last_hidden_state
