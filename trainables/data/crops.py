"""A manifest item's crop, computed without torch (the driver checks batches with it before Ray
starts; the dataset crops with it as it reads): a run's crop settings (``CropSettings``, from
its config by ``crop_settings``), the window of one utterance (``crop_window``), every item's
padded length (``crop_lengths``), and how many full global batches an epoch holds under the
run's sampler (``full_batches``, ``largest_micro_batch``: trainables/data/loader.py's samplers
drop what fills no global batch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainables.config import TrialConfig, global_batch
from trainables.config.choices import CropPolicy

__all__ = [
    "SAMPLE_RATE",
    "CropPolicy",
    "CropSettings",
    "DEFAULT_CROP",
    "crop_lengths",
    "crop_settings",
    "crop_window",
    "full_batches",
    "largest_micro_batch",
]

SAMPLE_RATE = 16_000


def crop_window(
    num_samples: int,
    rng: np.random.Generator,
    *,
    policy: CropPolicy,
    min_s: float,
    max_s: float,
    fixed_s: float,
    rate: int = SAMPLE_RATE,
    buckets: tuple[float, ...] = (),
) -> tuple[int, int, int]:
    """(start, samples to read, samples to return) for one utterance.

    ``limit_longest``: a window of uniform length in [min_s, max_s] at a uniform position;
    utterances shorter than the window are kept whole. ``fixed_slice``: exactly ``fixed_s``;
    shorter utterances are read whole and zero-padded to it. With ``buckets`` (limit_longest),
    the drawn window length is rounded to the nearest bucket; an utterance shorter than that
    takes the longest bucket it fills, and one shorter than every bucket is read whole and
    zero-padded to the shortest: every crop is one of the buckets' lengths.
    """
    if policy == "fixed_slice":
        want = int(round(fixed_s * rate))
        if num_samples <= want:
            return 0, num_samples, want
        return int(rng.integers(0, num_samples - want + 1)), want, want
    drawn = rng.uniform(min_s, max_s)
    if buckets:
        sizes = [int(round(b * rate)) for b in buckets]
        want = sizes[int(np.argmin([abs(b - drawn) for b in buckets]))]
        fits = [n for n in sizes if n <= min(want, num_samples)]
        if not fits:
            return 0, num_samples, sizes[0]
        want = fits[-1]
        return int(rng.integers(0, num_samples - want + 1)), want, want
    want = int(round(drawn * rate))
    if num_samples <= want:
        return 0, num_samples, num_samples
    return int(rng.integers(0, num_samples - want + 1)), want, want


@dataclass(frozen=True, kw_only=True)
class CropSettings:
    """How a run crops its utterances, in ``crop_window``'s terms: item ``i``'s crop depends only
    on these, ``i`` and its length. Hashable: the driver keys manifests' crop lengths by it."""

    seed: int = 0
    policy: CropPolicy = "limit_longest"
    min_s: float = 1.0
    max_s: float = 3.0
    fixed_s: float = 2.0
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "buckets", tuple(self.buckets))

    def window(self, num_samples: int, index: int) -> tuple[int, int, int]:
        """``crop_window`` of item ``index``, with its own RNG (seeded with seed and index)."""
        return crop_window(
            num_samples,
            np.random.default_rng([self.seed, index]),
            policy=self.policy,
            min_s=self.min_s,
            max_s=self.max_s,
            fixed_s=self.fixed_s,
            buckets=self.buckets,
        )


DEFAULT_CROP = CropSettings()  # a TrialConfig's defaults


def crop_settings(cfg: TrialConfig) -> CropSettings:
    """A run's crop settings from its config keys: the one place they are mapped (the driver's
    batch check, the training and validation datasets all crop by it). batching duration:
    whole utterances up to max_audio_s, a random max_audio_s window of a longer one."""
    whole = cfg.batching == "duration"
    return CropSettings(
        seed=cfg.seed,
        policy=cfg.crop_policy,
        min_s=cfg.max_audio_s if whole else cfg.min_audio_s,
        max_s=cfg.max_audio_s,
        fixed_s=cfg.fixed_slice_s,
        buckets=cfg.crop_buckets,
    )


def crop_lengths(num_samples: np.ndarray, crop: CropSettings) -> np.ndarray:
    """The padded length in samples of every item's crop (item ``i``'s crop depends only on
    the settings, ``i`` and its length)."""
    return np.array([crop.window(int(n), i)[2] for i, n in enumerate(num_samples)], dtype=np.int64)


def full_batches(lengths: np.ndarray, *, micro_batch: int, world_size: int, by_shape: bool) -> int:
    """Full global batches (``micro_batch`` x ``world_size`` items) in one epoch: per crop length
    when every batch holds one shape (``by_shape``: crop_buckets_s), else over all items."""
    size = global_batch(micro_batch=micro_batch, world_size=world_size)
    if not by_shape:
        return len(lengths) // size
    _, counts = np.unique(lengths, return_counts=True)
    return int(sum(int(c) // size for c in counts))


def largest_micro_batch(lengths: np.ndarray, *, world_size: int, by_shape: bool) -> int:
    """The largest micro-batch that still gives one full global batch per epoch (0: none)."""
    if not by_shape:
        return len(lengths) // world_size
    _, counts = np.unique(lengths, return_counts=True)
    return int(counts.max()) // world_size if len(counts) else 0
