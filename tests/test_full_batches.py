"""The driver's count of full global batches (trainables/data/crops.py) is the samplers' own: for
the shape-bucket, length-bucket and plain samplers of trainables/data/loader.py, an epoch holds as
many batches as ``full_batches`` says, and ``largest_micro_batch`` is the largest that gives one."""

import numpy as np
import pytest

from trainables.config import TrialConfig, global_batch
from trainables.data.crops import (
    DEFAULT_CROP,
    CropSettings,
    crop_lengths,
    crop_settings,
    crop_window,
    full_batches,
    largest_micro_batch,
)
from trainables.data.loader import (
    LengthBucketBatchSampler,
    ShapeBucketBatchSampler,
    manifest_options,
)


@pytest.mark.parametrize("buckets", [(), (1.0, 1.5, 2.0, 3.0)])
def test_the_count_matches_the_samplers(buckets):
    rng = np.random.default_rng(0)
    num_samples = rng.integers(8_000, 80_000, size=173)
    lengths = crop_lengths(
        num_samples,
        CropSettings(
            seed=3, policy="limit_longest", min_s=1.0, max_s=3.0, fixed_s=2.0, buckets=buckets
        ),
    )
    by_shape = bool(buckets)
    sampler = ShapeBucketBatchSampler if by_shape else LengthBucketBatchSampler
    extra = {} if by_shape else {"pool_batches": 4}
    for world_size in (1, 2, 4):
        for micro_batch in (1, 3, 8, 20, 40, 90):
            real = sampler(
                lengths, micro_batch=micro_batch, world_size=world_size, rank=0, seed=0, **extra
            )
            assert real.global_batch == global_batch(micro_batch=micro_batch, world_size=world_size)
            assert (
                len(real)
                == len(list(real))
                == full_batches(
                    lengths, micro_batch=micro_batch, world_size=world_size, by_shape=by_shape
                )
            )
        best = largest_micro_batch(lengths, world_size=world_size, by_shape=by_shape)
        assert (
            full_batches(lengths, micro_batch=best, world_size=world_size, by_shape=by_shape) >= 1
        )
        assert (
            full_batches(lengths, micro_batch=best + 1, world_size=world_size, by_shape=by_shape)
            == 0
        )


def test_a_runs_crop_settings_are_mapped_from_its_config_in_one_place():
    """crop_settings maps a TrialConfig's crop keys once: the driver's lengths (crop_lengths),
    the datasets' settings (manifest_options) and each item's window (crop_window with the RNG
    of seed and index) all come from it, and its defaults are the config's."""
    cfg = TrialConfig(
        dataset="manifest", seed=5, min_audio_s=1.5, max_audio_s=2.5, crop_buckets_s="2.5,1.5,2"
    )
    crop = crop_settings(cfg)
    assert crop == CropSettings(
        seed=5, policy="limit_longest", min_s=1.5, max_s=2.5, fixed_s=2.0, buckets=(1.5, 2.0, 2.5)
    )
    assert manifest_options(cfg)["crop"] == crop
    assert crop_settings(TrialConfig()) == DEFAULT_CROP
    assert {crop: "lengths"}[crop_settings(cfg)] == "lengths"  # the driver's key for a manifest
    num_samples = np.random.default_rng(1).integers(8_000, 80_000, size=50)
    lengths = crop_lengths(num_samples, crop)
    for i, n in enumerate(num_samples):
        rng = np.random.default_rng([5, i])
        window = crop_window(
            int(n),
            rng,
            policy="limit_longest",
            min_s=1.5,
            max_s=2.5,
            fixed_s=2.0,
            buckets=(1.5, 2.0, 2.5),
        )
        assert crop.window(int(n), i) == window and lengths[i] == window[2]
