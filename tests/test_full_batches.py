"""The driver's count of full global batches (trainables/data/crops.py) is the samplers' own: for
the shape-bucket, length-bucket and plain samplers of trainables/data/loader.py, an epoch holds as many
batches as ``full_batches`` says, and ``largest_micro_batch`` is the largest that gives one."""

import numpy as np
import pytest

from trainables.data.crops import crop_lengths, full_batches, largest_micro_batch
from trainables.data.loader import LengthBucketBatchSampler, ShapeBucketBatchSampler


@pytest.mark.parametrize("buckets", [(), (1.0, 1.5, 2.0, 3.0)])
def test_the_count_matches_the_samplers(buckets):
    rng = np.random.default_rng(0)
    num_samples = rng.integers(8_000, 80_000, size=173)
    lengths = crop_lengths(
        num_samples,
        seed=3,
        policy="limit_longest",
        min_s=1.0,
        max_s=3.0,
        fixed_s=2.0,
        buckets=buckets,
    )
    by_shape = bool(buckets)
    sampler = ShapeBucketBatchSampler if by_shape else LengthBucketBatchSampler
    extra = {} if by_shape else {"pool_batches": 4}
    for world_size in (1, 2, 4):
        for micro_batch in (1, 3, 8, 20, 40, 90):
            real = sampler(
                lengths, micro_batch=micro_batch, world_size=world_size, rank=0, seed=0, **extra
            )
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
