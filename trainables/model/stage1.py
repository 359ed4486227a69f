"""The stage-1 model: wav2vec2 speech encoder + BERT text encoder in one contrastive space."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainables.config import MAX_TEXT_TOKENS
from trainables.data.text import TINY_TEXT_VOCAB
from trainables.model.attention import (
    SDPA_BACKENDS,
    apply_sdpa_backend,
    attention_kind,
    register_sdpa_backends,
    transformers_name,
)
from trainables.model.padding import speech_states, text_states

__all__ = [
    "Stage1Model",
    "auto_attention",
    "build_model",
    "build_model_with_attention",
    "contrastive_loss",
    "gather_with_grad",
]

# `base` is the wav2vec2-base / bert-base-uncased architecture (transformers' config defaults);
# `tiny` keeps every code path (7-layer conv front end, positional conv, transformer) at a size
# a 2-core CPU runs in milliseconds.
_TINY_SPEECH = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(32,) * 7,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
)
_TINY_TEXT = dict(
    vocab_size=TINY_TEXT_VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=MAX_TEXT_TOKENS["tiny"],
)


# LayerDrop and SpecAugment masking change which parameters receive gradients from step to step;
# DDP then fails ("Expected to have finished reduction") and ZeRO can hang. They are regularisers
# for long fine-tuning, not part of a throughput workload, so they stay off, also when a
# checkpoint's config turns them on.
_SPEECH_OVERRIDES = dict(layerdrop=0.0, mask_time_prob=0.0, mask_feature_prob=0.0)


def build_model(
    model_size: str,
    proj_dim: int,
    *,
    speech_attention: str = "sdpa",
    text_attention: str = "sdpa",
    speech_path: str = "",
    text_path: str = "",
    dtype: torch.dtype = torch.float32,
    notes: list[str] | None = None,
    dropout: float | None = None,
) -> Stage1Model:
    """The model with the given attention kernels (already resolved: eager, sdpa, an SDPA
    backend kind of :mod:`trainables.model.attention` or flash_attention_2; see
    :func:`build_model_with_attention` for ``auto`` and fallbacks).

    An encoder with a checkpoint folder is loaded from it (offline); the other is built from
    ``model_size`` with random weights. Weights end up in ``dtype``. Checkpoint weights that
    the encoder lacks, or that it has and the checkpoint does not, are added to ``notes``.
    ``dropout``: every dropout rate of both encoders (None: their configs' own).
    """
    from transformers import BertConfig, BertModel, Wav2Vec2Config, Wav2Vec2Model

    if SDPA_BACKENDS.keys() & {speech_attention, text_attention}:
        register_sdpa_backends()
    speech_attention = transformers_name(speech_attention)
    text_attention = transformers_name(text_attention)
    speech_rates, text_rates = dropout_overrides(dropout)

    if speech_path:
        speech = _load(
            Wav2Vec2Model,
            speech_path,
            "speech",
            notes,
            speech_attention,
            dtype,
            **_SPEECH_OVERRIDES,
            **speech_rates,
        )
    else:
        speech_kwargs = _TINY_SPEECH if model_size == "tiny" else {}
        speech = Wav2Vec2Model(
            Wav2Vec2Config(
                **speech_kwargs,
                **_SPEECH_OVERRIDES,
                **speech_rates,
                attn_implementation=speech_attention,
            )
        )
    if text_path:
        text = _load(
            BertModel,
            text_path,
            "text",
            notes,
            text_attention,
            dtype,
            add_pooling_layer=False,
            **text_rates,
        )
    else:
        text_kwargs = _TINY_TEXT if model_size == "tiny" else {}
        text = BertModel(
            BertConfig(**text_kwargs, **text_rates, attn_implementation=text_attention),
            add_pooling_layer=False,
        )
    # Projections and temperature are new in both cases; the whole model then takes one dtype.
    return Stage1Model(speech, text, proj_dim).to(dtype)


def dropout_overrides(rate: float | None) -> tuple[dict, dict]:
    """The config fields of every dropout of wav2vec2 and of BERT at ``rate`` (None: none)."""
    if rate is None:
        return {}, {}
    speech = ("hidden_dropout", "attention_dropout", "activation_dropout", "feat_proj_dropout")
    text = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    return {k: float(rate) for k in speech}, {k: float(rate) for k in text}


def _load(cls, path: str, side: str, notes: list[str] | None, attention: str, dtype, **kwargs):
    from transformers.utils import logging as hf_logging

    # Every rank would print a progress bar and a load report per encoder; what matters (weights
    # the checkpoint lacks) goes to ``notes`` and from there to the run manifest.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    model, info = cls.from_pretrained(
        path,
        local_files_only=True,
        attn_implementation=attention,
        dtype=dtype,
        output_loading_info=True,
        **kwargs,
    )
    missing = sorted(info.get("missing_keys", ()))
    if missing and notes is not None:
        notes.append(
            f"{side}: {len(missing)} weight(s) not in {path}, randomly initialised "
            f"(first: {missing[0]})"
        )
    return model


def auto_attention(device: torch.device, precision: str) -> str:
    """``auto``: FlashAttention-2 where it can run (CUDA compute capability >= 8.0, bf16/fp16,
    the flash_attn package installed), else PyTorch SDPA."""
    import importlib.util

    if (
        device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] >= 8
        and precision in ("bf16", "fp16")
        and importlib.util.find_spec("flash_attn") is not None
    ):
        return "flash_attention_2"
    return "sdpa"


def build_model_with_attention(
    model_size: str,
    proj_dim: int,
    *,
    speech: str,
    text: str,
    device: torch.device,
    precision: str,
    speech_path: str = "",
    text_path: str = "",
    dtype: torch.dtype = torch.float32,
    dropout: float | None = None,
) -> tuple[Stage1Model, dict[str, str]]:
    """Resolve ``auto``, build (or load), and fall back to SDPA when a requested kernel cannot
    run here (flash_attention_2 off a GPU or without flash_attn; an SDPA backend kind whose
    backend cannot run on ``device`` at ``precision``); returns the model and what was used
    (with the reason for any fallback)."""
    wanted = {
        "speech": auto_attention(device, precision) if speech == "auto" else speech,
        "text": auto_attention(device, precision) if text == "auto" else text,
    }
    notes: list[str] = []
    for side, kind in wanted.items():
        if kind == "flash_attention_2" and (device.type != "cuda" or precision == "fp32"):
            notes.append(f"{side}: flash_attention_2 needs a GPU and bf16/fp16, used sdpa")
            wanted[side] = "sdpa"

    def build(load_notes: list[str]) -> Stage1Model:
        return build_model(
            model_size,
            proj_dim,
            speech_attention=wanted["speech"],
            text_attention=wanted["text"],
            speech_path=speech_path,
            text_path=text_path,
            dtype=dtype,
            notes=load_notes,
            dropout=dropout,
        )

    load_notes: list[str] = []
    try:
        model = build(load_notes)
    except ImportError as exc:  # flash_attn not installed
        reason = str(exc).split(":")[-1].strip()[:120]
        for side, kind in wanted.items():
            if kind == "flash_attention_2":
                notes.append(f"{side}: flash_attention_2 unavailable ({reason}), used sdpa")
                wanted[side] = "sdpa"
        load_notes = []
        model = build(load_notes)
    # An SDPA backend kind is probed on the built encoder (its heads, head size and attention
    # dropout, from a checkpoint's config too) in the dtype its attention computes in.
    compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    for side, encoder in (("speech", model.speech), ("text", model.text)):
        if wanted[side] in SDPA_BACKENDS:
            notes += apply_sdpa_backend(
                encoder, side, wanted[side], device=device, dtype=compute_dtype
            )
    effective = {
        "speech_attention_effective": attention_kind(model.speech.config._attn_implementation),
        "text_attention_effective": attention_kind(model.text.config._attn_implementation),
        "fallbacks": "; ".join(notes + load_notes),
    }
    return model, effective


class Stage1Model(nn.Module):
    """Mean-pooled speech frames and the text [CLS] state, projected and L2-normalised."""

    logit_scale_max: float = 100.0  # CLIP's clamp of 1/temperature (TrialConfig.logit_scale_max)
    # The padding_masks key: masks without a host sync (trainables/model/padding.py), or
    # transformers' own forwards.
    sync_free_masks: bool = True

    def __init__(self, speech: nn.Module, text: nn.Module, proj_dim: int):
        super().__init__()
        self.speech = speech  # a transformers Wav2Vec2Model
        # transformers' feature encoder marks the raw audio as requiring grad (for its own
        # gradient checkpointing, unused here): a gradient of the input nobody reads, and under
        # torch.compile a graph break at the start of every feature encoder call (one more
        # frame to trace per crop length). Its weights still train.
        speech.feature_extractor._requires_grad = False
        self.text = text  # a transformers BertModel without its pooler
        self.speech_proj = nn.Linear(speech.config.hidden_size, proj_dim)
        self.text_proj = nn.Linear(text.config.hidden_size, proj_dim)
        # A 1-element tensor, not a 0-dim one: DeepSpeed ZeRO cannot flatten 0-dim bf16 params.
        self.logit_scale = nn.Parameter(torch.full((1,), math.log(1 / 0.07)))

    def forward(
        self,
        audio: torch.Tensor,
        input_ids: torch.Tensor,
        audio_mask: torch.Tensor | None = None,
        text_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """No mask: no row is padded (the mean over every frame; attention unmasked)."""
        sync_free = self.sync_free_masks
        frames, frame_mask = speech_states(self.speech, audio, audio_mask, sync_free=sync_free)
        if frame_mask is None:
            pooled = frames.mean(1)
        else:
            frame_mask = frame_mask.unsqueeze(-1).to(frames.dtype)
            pooled = (frames * frame_mask).sum(1) / frame_mask.sum(1).clamp(min=1.0)
        cls = text_states(self.text, input_ids, text_mask, sync_free=sync_free)[:, 0]
        speech_emb = F.normalize(self.speech_proj(pooled), dim=-1)
        text_emb = F.normalize(self.text_proj(cls), dim=-1)
        # Clamp as CLIP does: a temperature below 1/100 makes the loss numerically spiky, and a
        # scale below 1 flattens every logit towards ln(batch), where nothing learns any more.
        scale = self.logit_scale.exp().clamp(min=1.0, max=self.logit_scale_max)
        return speech_emb, text_emb, scale


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward hands each rank the summed gradient of its own slice."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor.contiguous())
        ctx.rank, ctx.rows = dist.get_rank(), tensor.shape[0]
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # Every rank's loss depends on every rank's embeddings: sum the gradients of all ranks.
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_with_grad(tensor: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
    """Every rank's rows, in rank order, with gradients back to each rank's own. ``rows``: each
    rank's row count when they may differ (batching duration): all_gather needs one size, so
    each rank pads to the largest, and the padding rows are cut out of the result (the counts
    come from the sampler's plan, known on every rank: no collective, no host sync)."""
    if not _distributed():
        return tensor
    if rows is None or len(set(rows)) == 1:
        return _GatherWithGrad.apply(tensor)
    most = max(rows)
    padded = F.pad(tensor, (0, 0, 0, most - tensor.shape[0]))
    gathered = _GatherWithGrad.apply(padded)
    return torch.cat([gathered[r * most : r * most + n] for r, n in enumerate(rows)])


def contrastive_loss(
    speech_emb: torch.Tensor,
    text_emb: torch.Tensor,
    logit_scale: torch.Tensor,
    *,
    scope: str = "global",
    rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """Symmetric InfoNCE. With scope `global`, the local rows are scored against every rank's
    embeddings, so a random model starts near ln(global batch).

    ``rows``: every rank's row count in this step, when they may differ (batching duration:
    trainables/data/loader.py's ``EpochIterator.step``). The negatives are then every row of
    the step (their number changes from step to step), and the loss is this rank's share of
    the mean over the step's rows, times the world size: DDP averages the ranks' gradients, so
    that average is the gradient of the mean over every row of the micro-step, each row
    weighing the same whichever rank holds it (a mean per rank would weigh the rows of a
    smaller batch more; across accumulated micro-steps each micro-step weighs the same).
    The value is rank r's mean x rows[r] x world / sum(rows)."""
    if rows is not None:
        return _uneven_loss(speech_emb, text_emb, logit_scale, scope=scope, rows=rows)
    rank = 0
    all_speech, all_text = speech_emb, text_emb
    if scope == "global" and dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        all_speech, all_text = gather_with_grad(speech_emb), gather_with_grad(text_emb)
    rows = speech_emb.shape[0]
    labels = torch.arange(rows, device=speech_emb.device) + rank * rows
    logits_speech = logit_scale * speech_emb @ all_text.T
    logits_text = logit_scale * text_emb @ all_speech.T
    return (F.cross_entropy(logits_speech, labels) + F.cross_entropy(logits_text, labels)) / 2


def _uneven_loss(
    speech_emb: torch.Tensor,
    text_emb: torch.Tensor,
    logit_scale: torch.Tensor,
    *,
    scope: str,
    rows: Sequence[int],
) -> torch.Tensor:
    """contrastive_loss with every rank's row count given (see there)."""
    rank = dist.get_rank() if _distributed() else 0
    world = len(rows) if _distributed() else 1
    mine = speech_emb.shape[0]
    if mine != rows[rank]:
        raise ValueError(f"rank {rank} holds {mine} rows, its step's plan says {rows[rank]}")
    offset, total = 0, mine
    all_speech, all_text = speech_emb, text_emb
    if scope == "global" and world > 1:
        offset, total = sum(rows[:rank]), sum(rows)
        all_speech = gather_with_grad(speech_emb, rows)
        all_text = gather_with_grad(text_emb, rows)
    elif world > 1:
        total = sum(rows)
    labels = torch.arange(mine, device=speech_emb.device) + offset
    logits_speech = logit_scale * speech_emb @ all_text.T
    logits_text = logit_scale * text_emb @ all_speech.T
    summed = F.cross_entropy(logits_speech, labels, reduction="sum") + F.cross_entropy(
        logits_text, labels, reduction="sum"
    )
    return summed / 2 * (world / total)
