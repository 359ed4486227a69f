"""Made-up batches of a known shape, as the loader gives them: for counting FLOPs and for the
compile warm-up, where only shapes and dtypes matter."""

from __future__ import annotations

import torch

from trainables.config import TrialConfig

__all__ = ["probe_batch", "probe_shape", "shape_batch"]


def shape_batch(
    rows: int,
    audio_n: int,
    text_n: int,
    device,
    dtype: torch.dtype = torch.float32,
    *,
    masked: bool = False,
    padded: bool = False,
) -> dict[str, torch.Tensor]:
    """A made-up batch of one shape, as the loader gives it (silent audio, unpadded: so no audio
    mask, as trainables.data.manifest.collate_padded leaves it out; ``masked``: with one, as the
    collate of batching duration always gives; ``padded``: the last row's transcript padded, and
    its audio when ``masked``): for counting FLOPs and for the compile warm-up, where only
    shapes and dtypes matter, and, for attention kinds that take the 2D mask
    (flash_attention_2), whether a mask holds padding: their mask is dropped when it pads
    nothing, so the compiled code differs (trainables/model/padding.py)."""
    batch = {
        "audio": torch.zeros(rows, audio_n, device=device, dtype=dtype),
        "input_ids": torch.full((rows, text_n), 5, dtype=torch.long, device=device),
        "text_mask": torch.ones(rows, text_n, dtype=torch.long, device=device),
    }
    if masked:
        batch["audio_mask"] = torch.ones(rows, audio_n, dtype=torch.bool, device=device)
    if padded:
        batch["text_mask"][-1, text_n // 2 :] = 0
    if masked and padded:
        batch["audio_mask"][-1, audio_n // 2 :] = False
    return batch


def probe_shape(cfg: TrialConfig) -> tuple[int, int]:
    """(audio samples, text tokens) of the run's mean crop length and longest transcripts."""
    if cfg.dataset == "synthetic":
        seconds = cfg.audio_s
    elif cfg.crop_policy == "fixed_slice":
        seconds = cfg.fixed_slice_s
    else:
        seconds = (cfg.min_audio_s + cfg.max_audio_s) / 2
    return int(seconds * 16_000), cfg.text_tokens


def probe_batch(
    cfg: TrialConfig, device: torch.device, samples: int = 2, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """A small batch of the run's probe shape, for counting."""
    return shape_batch(samples, *probe_shape(cfg), device, dtype)
