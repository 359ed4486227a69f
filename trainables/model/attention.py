"""The SDPA backend of each encoder's attention: the kinds `sdpa_cudnn`, `sdpa_flash`,
`sdpa_efficient` and `sdpa_math`, registered with transformers' attention interface, and the
build-time probe that falls back to plain `sdpa` where the backend cannot run.

Each kind is transformers' own SDPA attention (the same masks, scaling and dropout) called
inside ``torch.nn.attention.sdpa_kernel`` with the kind's backend first in PyTorch's priority
order and every other backend after it in PyTorch's own order. An encoder's config names its
kind, so the speech encoder's attention calls run under one backend and the text encoder's under
another, whoever calls the encoder (the step, validation, the FLOPs count), compiled or not:
dynamo traces ``sdpa_kernel`` inside a compiled region and bakes the chosen kernel into the
graph. No module is wrapped: parameter names, state dicts and checkpoints keep their keys.

A call the first backend cannot take (a padding mask where the backend takes none, say) runs on
the next backend in the order, as plain `sdpa` would. At build time one tiny forward and
backward on the model's device, compute dtype, head size and attention dropout, with the first
backend alone, says whether it can run here at all; if not, the encoder falls back to `sdpa`
and the reason joins the run's fallbacks (``speech: sdpa_cudnn needs a CUDA GPU, used sdpa``).
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = [
    "SDPA_BACKENDS",
    "apply_sdpa_backend",
    "attention_kind",
    "register_sdpa_backends",
    "transformers_name",
]

# Kind -> the SDPA backend it puts first.
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}
# The attn_implementation each kind is registered under with transformers: its own name, but
# never one holding "flash", which transformers takes for a FlashAttention request (the
# flash_attn package or a Hub kernel) and tries to import.
_REGISTERED = {kind: kind.replace("flash", "fa2") for kind in SDPA_BACKENDS}
_KIND_OF = {name: kind for kind, name in _REGISTERED.items()}
# The backends PyTorch picks among, in its default priority order (flash, efficient, math,
# cuDNN in torch 2.11-2.13); read once, before any sdpa_kernel of ours changes it. (A priority
# order, and sdpa_kernel's set_priority, came with torch 2.6.)
_BACKEND_BY_VALUE = {int(b): b for b in (*SDPA_BACKENDS.values(), SDPBackend.OVERRIDEABLE)}
_TORCH_ORDER = getattr(torch._C, "_get_sdp_priority_order", lambda: [1, 2, 0, 3, 4])()
_DEFAULT_ORDER = [_BACKEND_BY_VALUE[v] for v in _TORCH_ORDER if v in _BACKEND_BY_VALUE]
# Where each backend has kernels at all (torch's CPU SDPA has flash and math only).
_CUDA_ONLY = (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)


def preference(kind: str) -> list[SDPBackend]:
    """The priority order of ``kind``: its backend, then the others in PyTorch's order."""
    first = SDPA_BACKENDS[kind]
    return [first, *(b for b in _DEFAULT_ORDER if b != first)]


def transformers_name(kind: str) -> str:
    """The ``attn_implementation`` to build an encoder with for ``kind``."""
    return _REGISTERED.get(kind, kind)


def attention_kind(attn_implementation: str) -> str:
    """The kind (a key value) of a built encoder's ``config._attn_implementation``."""
    return _KIND_OF.get(attn_implementation, attn_implementation)


def _attention_under(order: list[SDPBackend], sdpa_forward):
    """transformers' SDPA attention function, run with ``order`` as the backends' priority."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        with sdpa_kernel(order, set_priority=True):
            return sdpa_forward(module, query, key, value, attention_mask, **kwargs)

    return attention


def register_sdpa_backends() -> None:
    """Make every kind of :data:`SDPA_BACKENDS` a valid ``attn_implementation``: transformers'
    SDPA attention under the kind's priority order, with SDPA's own masks (a kind registered
    without a mask function would be handed no padding mask at all). Idempotent; every process
    that builds a model calls it (Ray workers do, through ``build_model``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa_forward = ALL_ATTENTION_FUNCTIONS["sdpa"]
    sdpa_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    for kind, name in _REGISTERED.items():
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, _attention_under(preference(kind), sdpa_forward))
            AttentionMaskInterface.register(name, sdpa_mask)


def _attention_dropout(config) -> float:
    """The attention-probability dropout of a wav2vec2 or BERT config (what training runs)."""
    for name in ("attention_dropout", "attention_probs_dropout_prob"):
        if hasattr(config, name):
            return float(getattr(config, name))
    return 0.0


def _torch_reason(caught: list[warnings.WarningMessage], error: Exception) -> str:
    """PyTorch's own words for why a backend was not used (its warnings when asked to use one
    backend alone), without the source locations; else the error's first sentence."""
    lines = []
    for w in caught:
        text = str(w.message).split(" (Triggered internally")[0].strip()
        if text and not text.endswith("because:") and text not in lines:
            lines.append(text)
    reason = "; ".join(lines) or str(error).split(".")[0]
    return reason[:200]


def probe(
    backend: SDPBackend,
    *,
    device: torch.device,
    dtype: torch.dtype,
    heads: int,
    head_dim: int,
    dropout: float,
    masked: bool,
) -> str:
    """Why ``backend`` alone cannot run one forward and backward of an encoder's attention
    here ('' when it can): batch 2, 8 positions, the encoder's heads, head size and attention
    dropout, in ``dtype`` on ``device``; ``masked``: with a padding mask as transformers passes
    it (boolean, one row padded). The RNG state is kept, so a run's dropout masks and data
    order do not depend on whether it probed."""
    if device.type != "cuda" and backend in _CUDA_ONLY:
        return "a CUDA GPU"
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        q, k, v = (
            torch.randn(2, heads, 8, head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        mask = None
        if masked:
            mask = torch.ones(2, 1, 8, 8, dtype=torch.bool, device=device)
            mask[1, ..., 5:] = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, attn_mask=mask, dropout_p=dropout
                    )
                    out.float().sum().backward()
            except RuntimeError as exc:
                return _torch_reason(caught, exc)
    return ""


def apply_sdpa_backend(
    encoder, side: str, kind: str, *, device: torch.device, dtype: torch.dtype
) -> list[str]:
    """Probe ``kind`` for ``encoder`` (built with it) on ``device`` in ``dtype``; where its
    backend cannot run at all, switch the encoder to plain `sdpa`. Returns the notes for the
    run's fallbacks: that switch, or that padded batches take the next backend in the order
    (the backend runs, but not with a padding mask)."""
    config = encoder.config
    heads = config.num_attention_heads
    shape = dict(
        device=device,
        dtype=dtype,
        heads=heads,
        head_dim=config.hidden_size // heads,
        dropout=_attention_dropout(config),
    )
    backend = SDPA_BACKENDS[kind]
    why = probe(backend, masked=False, **shape)
    if why:
        if why == "a CUDA GPU":
            note = f"{side}: {kind} needs a CUDA GPU, used sdpa"
        else:
            note = f"{side}: {kind} cannot run here ({why}), used sdpa"
        _set_attention(encoder, "sdpa")
        return [note]
    why = probe(backend, masked=True, **shape)
    if why:
        return [f"{side}: {kind} takes no padding mask here ({why}); padded batches use sdpa"]
    return []


def _set_attention(encoder, kind: str) -> None:
    """Switch a built transformers model's attention (every layer reads it from the config)."""
    if hasattr(encoder, "set_attn_implementation"):
        encoder.set_attn_implementation(kind)
    else:
        encoder.config._attn_implementation = kind
