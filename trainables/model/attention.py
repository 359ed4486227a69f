"""The SDPA backend of each encoder's attention: the kinds `sdpa_cudnn`, `sdpa_flash`,
`sdpa_efficient` and `sdpa_math`, registered with transformers' attention interface, and the
build-time probe that falls back to plain `sdpa` where the backend cannot run.

Each kind is transformers' own SDPA attention (the same masks, scaling and dropout) called
inside ``torch.nn.attention.sdpa_kernel(backend)``: that backend alone runs the call. An
encoder's config names its kind, so the speech encoder's attention calls run under one backend
and the text encoder's under another, whoever calls the encoder (the step, validation, the
FLOPs count), compiled or not: dynamo traces ``sdpa_kernel`` inside a compiled region and bakes
the kernel into the graph. No module is wrapped: parameter names, state dicts and checkpoints
keep their keys.

The backend alone, not first in a priority order: PyTorch's CPU SDPA ignores the priority order
(flash, then math, always), and on Hopper and Blackwell the first SDPA call of a process
installs cuDNN-first over whatever order is set (``check_prefer_cudnn_attention`` in
``sdp_utils.cpp``, torch 2.9+ with cuDNN >= 9.9); only the enabled set is obeyed everywhere.

So that no call meets a backend that cannot take it, one tiny forward and backward at build
time, on the model's device in its compute dtype with the encoder's heads, head size and
attention dropout, tells whether the backend runs here: if not, the encoder uses plain `sdpa`
and the reason joins the run's fallbacks (``speech: sdpa_cudnn needs a CUDA GPU, used sdpa``);
if it runs but takes no padding mask (flash on a GPU), calls with a mask run plain `sdpa`
(PyTorch's own choice), noted too, and calls without one run the backend.
"""

from __future__ import annotations

import functools
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

# Kind -> the SDPA backend that runs its calls.
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
# Where each backend has kernels at all (torch's CPU SDPA has flash and math only).
_CUDA_ONLY = (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
# Kinds whose backend the probe found taking no padding mask in this process (one device type
# per process): their masked calls run plain sdpa. Read by the attention functions at each call
# (dynamo guards on it).
_NO_MASK: set[str] = set()


def transformers_name(kind: str) -> str:
    """The ``attn_implementation`` to build an encoder with for ``kind``."""
    return _REGISTERED.get(kind, kind)


def attention_kind(attn_implementation: str) -> str:
    """The kind (a key value) of a built encoder's ``config._attn_implementation``."""
    return _KIND_OF.get(attn_implementation, attn_implementation)


def _attention_of(kind: str, sdpa_forward):
    """transformers' SDPA attention function, run on ``kind``'s backend alone (a masked call
    of a kind in ``_NO_MASK``: as plain sdpa)."""
    backend = SDPA_BACKENDS[kind]

    def attention(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None and kind in _NO_MASK:
            return sdpa_forward(module, query, key, value, attention_mask, **kwargs)
        with sdpa_kernel(backend):
            return sdpa_forward(module, query, key, value, attention_mask, **kwargs)

    return attention


def register_sdpa_backends() -> None:
    """Make every kind of :data:`SDPA_BACKENDS` a valid ``attn_implementation``: transformers'
    SDPA attention on the kind's backend, with SDPA's own masks (a kind registered without a
    mask function would be handed no padding mask at all). Idempotent; every process that
    builds a model calls it (Ray workers do, through ``build_model``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa_forward = ALL_ATTENTION_FUNCTIONS["sdpa"]
    sdpa_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    for kind, name in _REGISTERED.items():
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, _attention_of(kind, sdpa_forward))
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


@functools.lru_cache(maxsize=64)  # once per process and shape: a resident worker builds often
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
                with sdpa_kernel(backend):
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
    """Probe ``kind`` for ``encoder`` (built with it) on ``device`` in ``dtype``: where its
    backend cannot run at all, switch the encoder to plain `sdpa`; where it runs but takes no
    padding mask, send masked calls to plain `sdpa`. Returns the notes for the run's
    fallbacks."""
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
        _set_attention(encoder, "sdpa")
        if why == "a CUDA GPU":
            return [f"{side}: {kind} needs a CUDA GPU, used sdpa"]
        return [f"{side}: {kind} cannot run here ({why}), used sdpa"]
    why = probe(backend, masked=True, **shape)
    if why:
        _NO_MASK.add(kind)  # never removed: one encoder's masked calls must not fail
        return [f"{side}: {kind} takes no padding mask here ({why}); padded batches use sdpa"]
    return []


def _set_attention(encoder, kind: str) -> None:
    """Switch a built transformers model's attention (every layer reads it from the config)."""
    if hasattr(encoder, "set_attn_implementation"):
        encoder.set_attn_implementation(kind)
    else:
        encoder.config._attn_implementation = kind
